"""The fault catalog, its real-world weights, and coverage scoring."""

from __future__ import annotations

import pytest

from chaoskit.coverage import (
    CATEGORIES,
    SCOPES,
    Capabilities,
    catalog,
    classes_exercised_by,
    compute_coverage,
    interruption_rows,
    resolve_covers,
    total_interruptions,
)
from tests.conftest import ROOT, SCENARIOS, run_cli

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

SHARED_DATA = ROOT.parent / "shared" / "data" / "llama3_interruptions.csv"


def test_weights_are_the_counts_of_the_shipped_data() -> None:
    assert sum(r["interruptions"] for r in interruption_rows()) == 419 == total_interruptions()
    weights = {c.id: c.weight for c in catalog()}
    assert sum(weights.values()) == 419
    # By hand from Table 5 of the Llama 3 paper and our category column:
    assert weights["hardware.gpu"] == 148 + 17 + 6  # faulty GPU, GSP, thermal interface
    assert weights["hardware.sdc"] == 6  # silent data corruption: its own class, which gpu.fail does not claim
    assert weights["hardware.gpu_memory"] == 72 + 19  # HBM3, SRAM
    assert weights["software.crash"] == 54 + 2  # software bug, dependency
    assert weights["hardware.host"] == 2 + 2 + 2 + 2  # chassis, IO board, CPU, memory
    assert weights["hardware.maintenance"] == 32  # host maintenance: the scheduler takes the nodes away
    assert weights["network.link"] == 35
    assert weights["network.nic"] == 7
    assert weights["software.hang"] == 7  # NCCL watchdog timeouts
    assert weights["hardware.power"] == 3
    assert weights["storage.disk"] == 3  # SSD
    assert weights["network.partition"] == weights["storage.checkpoint"] == 0


def test_shipped_data_is_the_shared_data_with_its_source() -> None:
    shipped = ROOT / "chaoskit" / "data" / "llama3_interruptions.csv"
    readme = (ROOT / "chaoskit" / "data" / "README.md").read_text()
    assert "The Llama 3 Herd of Models" in readme and "Table 5" in readme
    if not SHARED_DATA.exists():
        pytest.skip(f"no shared data beside the repository ({SHARED_DATA})")
    assert shipped.read_bytes() == SHARED_DATA.read_bytes()


def test_catalog_spans_every_category_and_scope() -> None:
    classes = catalog()
    ids = [c.id for c in classes]
    assert len(ids) == len(set(ids)) == 18
    assert {c.category for c in classes} == set(CATEGORIES)
    assert {c.scope for c in classes} == set(SCOPES)
    for c in classes:
        assert c.id.startswith(c.category + ".") and c.description


def test_every_fault_kind_exercises_a_class() -> None:
    from chaoskit.faults.registry import fault_kinds

    coming = ("network.link_down", "network.blackhole", "network.degrade", "network.partition", "node.poweroff")
    for kind in list(fault_kinds()) + list(coming):
        assert classes_exercised_by([kind]), f"{kind} exercises no catalog class"


def test_each_kind_names_its_classes_in_its_own_class_body() -> None:
    """The catalog lists no kinds: a class's kinds are those whose ``covers`` names it, read from the kinds'
    source without importing them, and the same as the loaded classes say."""
    from chaoskit.faults.registry import builtin_covers, fault_kinds

    declared = builtin_covers()
    assert set(declared) == set(fault_kinds())
    for kind, cls in fault_kinds().items():
        assert declared[kind] == cls.covers and cls.covers, kind
    for c in catalog():  # a class's kinds: every kind that claims it, sorted
        assert list(c.kinds) == sorted(k for k, claimed in declared.items() if c.id in claimed), c.id
    by_id = {c.id: c.kinds for c in catalog()}
    assert {"process.hang", "inproc.hang", "inproc.gil"} <= set(by_id["software.hang"])


def test_a_plugin_kind_claims_catalog_classes_and_an_unknown_class_is_refused() -> None:
    """An outside package's kind joins the classes its ``covers`` names; a claim on a class the catalog does not
    have is an error naming the kind and the class, not a silent miss."""
    from chaoskit.faults.process import HangFault
    from chaoskit.faults.registry import FAULTS

    class Freeze(HangFault):
        kind = "process.freeze"
        covers = ("software.hang",)

    class Bogus(HangFault):
        kind = "process.bogus"
        covers = ("software.nonsense",)

    FAULTS.register("process.freeze", Freeze)
    try:
        assert "process.freeze" in {c.id: c for c in catalog()}["software.hang"].kinds
        assert classes_exercised_by(["process.freeze"]) == ["software.hang"]
        FAULTS.register("process.bogus", Bogus)
        with pytest.raises(RuntimeError, match="process.bogus.*software.nonsense"):
            catalog()
    finally:
        FAULTS.unregister("process.freeze")
        if "process.bogus" in FAULTS:
            FAULTS.unregister("process.bogus")
    assert "process.freeze" not in {c.id: c for c in catalog()}["software.hang"].kinds


def test_covers_default_from_the_fault_kinds_and_are_checked() -> None:
    assert resolve_covers(None, ["process.kill"]) == ["software.crash"]
    assert resolve_covers(None, ["node.poweroff"]) == ["hardware.host", "hardware.power"]
    assert resolve_covers(["hardware.power"], ["node.poweroff"]) == ["hardware.power"]
    with pytest.raises(ValueError, match="unknown fault class 'gpu.melt'"):
        resolve_covers(["gpu.melt"], ["process.kill"])
    with pytest.raises(ValueError, match=r"unknown fault class 'software.crsh' \(did you mean 'software.crash'\?\)"):
        resolve_covers(["software.crsh"], ["process.kill"])
    with pytest.raises(ValueError, match="software.hang is not exercised by process.kill"):
        resolve_covers(["software.hang"], ["process.kill"])


def test_shipped_scenarios_cover_what_they_inject() -> None:
    from chaoskit.scenario import load_scenario, scenario_files

    covers = {}
    for f in scenario_files([SCENARIOS]):
        sc = load_scenario(f).model
        covers[sc.name] = resolve_covers(sc.covers, [x.kind for x in sc.faults])
    assert covers["kill-rank"] == covers["kill-uninstrumented"] == ["software.crash"]
    assert covers["hang-rank"] == ["software.hang"]


def test_coverage_statuses_and_scores() -> None:
    caps = Capabilities(frozenset({"process.kill", "process.hang", "network.link_down"}), {"gpu": "no GPU here"})
    records = [
        {"scenario": "kill", "covers": ["software.crash"], "injected_kinds": ["process.kill"], "status": "pass"},
        {"scenario": "hang", "covers": ["software.hang"], "injected_kinds": ["process.hang"], "status": "fail"},
        {"scenario": "power", "covers": ["hardware.host", "hardware.power"], "injected_kinds": [], "status": "error"},
        {"scenario": "later", "covers": ["network.nic"], "injected_kinds": [], "status": None},
    ]
    cov = compute_coverage(records, caps)
    status = {c["id"]: c for c in cov["classes"]}
    assert status["software.crash"]["status"] == "covered"
    assert status["software.hang"]["status"] == "failed"
    # node.poweroff is not installed: the error says nothing about the cluster's recovery
    assert status["hardware.host"]["status"] == "not runnable here"
    assert "node.poweroff is not installed" in status["hardware.host"]["reason"]
    assert status["hardware.gpu"]["status"] == "not runnable here" and "no GPU here" in status["hardware.gpu"]["reason"]
    # runnable (its kind is installed, it needs nothing missing) but its scenario has not run
    assert status["network.nic"]["status"] == "not attempted"
    assert cov["covered"] == ["software.crash"]
    assert cov["plain"] == pytest.approx(1 / 18)
    assert cov["weighted"] == pytest.approx(56 / 419)
    assert sum(cov["counts"].values()) == 18


def test_gpu_classes_run_here_through_the_emulated_mechanism_only() -> None:
    """Without a GPU the crash loop (emulated) makes the GPU classes runnable; the catalog says which mechanism is
    real, which emulated, and that the NVIDIA one is not yet verified on a GPU."""
    from chaoskit.coverage import GPU_UNVERIFIED, catalog_by_id

    gpu = catalog_by_id()["hardware.gpu"]
    no_gpu = Capabilities(frozenset({"gpu.fail", "gpu.xid"}), {"gpu": "no GPU here"})
    assert no_gpu.unrunnable_reason(gpu) is None
    assert no_gpu.here(gpu) == [f"gpu.fail nvidia: real, not runnable: no GPU here ({GPU_UNVERIFIED})",
                                "gpu.fail crashloop: emulated, runnable", "gpu.xid kmsg: emulated, runnable"]
    assert Capabilities(frozenset({"gpu.fail"}), {}).here(gpu)[0] == f"gpu.fail nvidia: real, runnable ({GPU_UNVERIFIED})"
    assert "gpu.fail is not installed" in Capabilities(frozenset(), {}).unrunnable_reason(gpu)
    assert "gpu.xid is not installed" in Capabilities(frozenset(), {}).unrunnable_reason(gpu)
    assert resolve_covers(None, ["gpu.fail"]) == ["hardware.gpu", "hardware.gpu_memory"]
    res = run_cli("catalog", "--json")
    [entry] = [c for c in res.json["classes"] if c["id"] == "hardware.gpu"]
    assert [(m["name"], m["fidelity"]) for m in entry["mechanisms"]] == [("nvidia", "real"), ("crashloop", "emulated"), ("kmsg", "emulated")]
    assert any("crashloop: emulated" in line for line in entry["here"])
    assert "scope node" in entry["mechanisms"][1]["emulates"] and entry["mechanisms"][0]["emulates"] is None


def test_a_pass_covers_only_classes_whose_fault_it_injected() -> None:
    caps = Capabilities(frozenset({"process.kill", "process.hang"}), {})
    cov = compute_coverage([{"scenario": "odd", "covers": ["software.hang"], "injected_kinds": ["process.kill"], "status": "pass"}], caps)
    assert cov["covered"] == [] and cov["plain"] == 0 and cov["weighted"] == 0


def test_catalog_command() -> None:
    res = run_cli("catalog", "--json")
    assert res.code == 0, res.stderr
    data = res.json
    assert len(data["classes"]) == 18 and data["weight_total"] == 419
    crash = next(c for c in data["classes"] if c["id"] == "software.crash")
    assert crash["category"] == "software" and crash["scope"] == "rank" and {"process.kill", "inproc.raise"} <= set(crash["kinds"])
    assert crash["weight"] == 56 and crash["runnable_here"] is True
    driver = next(c for c in data["classes"] if c["id"] == "software.driver")
    assert driver["kinds"] == ["gpu.xid", "inproc.raise"] and driver["xid_codes"] == [13, 31, 43] and driver["runnable_here"] is True
    assert "illegal_address" in driver["cuda_errors"]
    sdc = next(c for c in data["classes"] if c["id"] == "hardware.sdc")
    assert sdc["weight"] == 6 and "gpu.fail" not in sdc["kinds"] and sdc["runnable_here"] is True
    assert all(c["kinds"] for c in data["classes"])  # a fault kind for every class
    oom = next(c for c in data["classes"] if c["id"] == "software.oom")
    assert oom["kinds"] == ["mem.oom"] and [m["fidelity"] for m in oom["mechanisms"]] == ["real"]
    res = run_cli("catalog")
    assert res.code == 0 and "software.crash" in res.stdout and "56 (13.4%)" in res.stdout and "not runnable" in res.stdout


def test_an_xid_claims_the_class_of_its_code() -> None:
    from chaoskit.coverage import resolve_covers

    assert resolve_covers(None, ["gpu.xid:79"]) == ["hardware.gpu"]
    assert resolve_covers(None, ["gpu.xid:48"]) == ["hardware.gpu_memory"]
    assert resolve_covers(None, ["gpu.xid:13"]) == ["software.driver"]
    with pytest.raises(ValueError, match="covers: software.driver is not exercised by gpu.xid:79"):
        resolve_covers(["software.driver"], ["gpu.xid:79"])


def test_a_scenario_claiming_another_class_than_its_xids_is_refused(tmp_path) -> None:
    text = (ROOT / "scenarios" / "slurm-xid-drain.yaml").read_text().replace("cluster:\n", "covers: [software.driver]\ncluster:\n", 1)
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    res = run_cli("validate", bad)
    assert res.code == 2 and "software.driver is not exercised by gpu.xid:79" in res.stderr, res.stderr
    ok = tmp_path / "ok.yaml"
    ok.write_text(text.replace("[software.driver]", "[hardware.gpu]"))
    assert run_cli("validate", ok).code == 0


def test_the_shipped_scenarios_claim_every_class_that_runs_without_netem() -> None:
    """``chaoskit gameday scenarios/`` is the nightly proof: each class it can run on a machine with no GPU is
    claimed by one shipped scenario. Only ``network.degraded`` needs tc netem, which this project's CI kernel
    lacks (a degrade scenario there would be an error, not a drill), so none ships for it."""
    from chaoskit.scenario import load_scenario, scenario_files

    claimed = set()
    for f in scenario_files([SCENARIOS]):
        sc = load_scenario(f).model
        claimed |= set(resolve_covers(sc.covers, [x.catalog_tag() for x in sc.faults]))
    unclaimed = {c.id for c in catalog()} - claimed
    assert unclaimed == {c.id for c in catalog() if "netem" in c.requires} == {"network.degraded"}
