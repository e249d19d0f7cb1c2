"""storage.corrupt and storage.full on real checkpoint files and real file systems.

The fill of a file system of the job's own (a tmpfs) needs root to mount: those tests
skip outside CI without it and fail in CI. Everything else runs anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from chaoskit.cluster.selectors import TargetSpec, resolve_nodes
from chaoskit.core.errors import InfraError, ScenarioError
from chaoskit.faults.storage import ASIDE_PREFIX, FILL_PREFIX, CorruptFault, CorruptSpec, FullFault, FullSpec
from chaoskit.lab.checkpoint_fs import mount_checkpoint_fs, mounted, unmount
from chaoskit.lab.process import ProcessLab
from chaoskit.runner import RunContext
from chaoskit.safety.journal import Journal, read_journal
from chaoskit.safety.lease import LeaseManager
from tests.conftest import ROOT, SCENARIOS, need_torch, run_cli, short_form
from tests.netns_fixtures import require

CORRUPT = SCENARIOS / "ckpt-corrupt.yaml"
FULL = SCENARIOS / "ckpt-disk-full.yaml"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def lab():
    lab = ProcessLab.create(1)
    yield lab
    lab.kill_all()


@pytest.fixture
def ckpts(tmp_path):
    """A checkpoint folder with three checkpoints, step 75 the newest (by time, as the fault judges)."""
    folder = tmp_path / "job" / "checkpoints"
    folder.mkdir(parents=True)
    for n, step in enumerate((25, 50, 75)):
        path = folder / f"ckpt-{step:08d}.pt"
        path.write_bytes(os.urandom(4096 + step))
        os.utime(path, (time.time() - 100 + n, time.time() - 100 + n))
    (folder / "ckpt-00000100.pt.tmp.123").write_bytes(b"half a save")  # not a match for ckpt-*.pt
    os.utime(folder / "ckpt-00000100.pt.tmp.123", (time.time(), time.time()))
    return folder


def _ctx(lab, tmp_path, folder, ttl=10.0) -> RunContext:
    return RunContext(lab.inventory(), Journal(tmp_path / "j.jsonl"), LeaseManager(tmp_path / "leases", "r1", ttl=ttl),
                      checkpoint_dir=str(folder))


def _corrupt(mode: str, path: str = ".") -> CorruptFault:
    return CorruptFault(CorruptSpec(kind="storage.corrupt", target=TargetSpec(nodes=["n0"]), mode=mode, path=path,
                                    pattern="ckpt-*.pt", duration=60), "f0")


@pytest.mark.parametrize("mode", ["truncate", "flip", "remove"])
def test_corrupt_harms_the_newest_checkpoint_and_revert_puts_the_original_back(lab, tmp_path, ckpts, mode, monkeypatch):
    monkeypatch.setattr("chaoskit.faults.storage.VERIFY_S", 0.5)  # "still in effect" below lasts: no 5 s poll for it
    newest = ckpts / "ckpt-00000075.pt"
    original, size = _sha(newest), newest.stat().st_size
    others = {p.name: _sha(p) for p in ckpts.glob("ckpt-*.pt") if p != newest}
    ctx = _ctx(lab, tmp_path, ckpts)
    fault = _corrupt(mode)
    [inj] = fault.inject(ctx, resolve_nodes(ctx.inventory, fault.spec.target))
    try:
        assert inj.detail["checkpoint"] == str(newest) and inj.detail["mechanism"] == mode
        aside = Path(inj.detail["aside"])
        assert aside.parent == ckpts and aside.name.startswith(ASIDE_PREFIX) and _sha(aside / "original") == original
        assert read_journal(tmp_path / "j.jsonl")[0]["revert"] == inj.detail["revert"]  # armed before the harm
        if mode == "truncate":
            assert newest.stat().st_size == size // 2
        elif mode == "flip":
            data = newest.read_bytes()
            assert len(data) == size and _sha(newest) != original
            flipped = sum(a != b for a, b in zip(data, (aside / "original").read_bytes()))
            assert flipped == 64 and data[-1] != (aside / "original").read_bytes()[-1]
        else:
            assert not newest.exists()
        assert fault.verify(ctx, inj) is not None  # still in effect
    finally:
        fault.revert(ctx, inj)
    assert fault.verify(ctx, inj) is None
    ctx.leases.release(inj.fault_id)
    assert _sha(newest) == original and inj.detail["restore"]["restored"] is True
    assert {p.name: _sha(p) for p in ckpts.glob("ckpt-*.pt") if p != newest} == others
    assert not list(ckpts.glob(ASIDE_PREFIX + "*"))
    fault.revert(ctx, inj)  # idempotent
    assert _sha(newest) == original
    ctx.leases.close()


def test_a_checkpoint_the_job_wrote_meanwhile_wins_over_the_original(lab, tmp_path, ckpts):
    newest = ckpts / "ckpt-00000075.pt"
    ctx = _ctx(lab, tmp_path, ckpts)
    fault = _corrupt("truncate")
    [inj] = fault.inject(ctx, resolve_nodes(ctx.inventory, fault.spec.target))
    (ckpts / "new.tmp").write_bytes(b"the job saved step 75 again")
    os.replace(ckpts / "new.tmp", newest)  # the way the reference job saves
    fault.revert(ctx, inj)
    assert fault.verify(ctx, inj) is None
    ctx.leases.release(inj.fault_id)
    assert newest.read_bytes() == b"the job saved step 75 again"
    assert inj.detail["restore"]["restored"] is False and "kept the job's" in inj.detail["restore"]["why"]
    ctx.leases.close()


CONTROLLER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from chaoskit.cluster.selectors import TargetSpec, resolve_nodes
    from chaoskit.faults.storage import CorruptFault, CorruptSpec
    from chaoskit.lab.process import ProcessLab
    from chaoskit.runner import RunContext
    from chaoskit.safety.journal import Journal
    from chaoskit.safety.lease import LeaseManager
    lab = ProcessLab(sys.argv[1], 1)
    inv = lab.inventory()
    work = Path(sys.argv[2])
    ctx = RunContext(inv, Journal(work / "j.jsonl"), LeaseManager(work, "run3", ttl=1.0), checkpoint_dir=sys.argv[3])
    fault = CorruptFault(CorruptSpec(kind="storage.corrupt", target=TargetSpec(nodes=["n0"]), mode="remove",
                                     pattern="ckpt-*.pt", duration=300), "f0")
    [inj] = fault.inject(ctx, resolve_nodes(inv, fault.spec.target))
    print(inj.detail["checkpoint"], flush=True)
    time.sleep(600)
""")


def test_lease_puts_the_checkpoint_back_when_the_controller_is_killed(lab, tmp_path, ckpts):
    newest = ckpts / "ckpt-00000075.pt"
    original = _sha(newest)
    controller = subprocess.Popen([sys.executable, "-c", CONTROLLER, lab.lab_id, str(tmp_path), str(ckpts)],
                                  env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, text=True)
    assert controller.stdout.readline().strip() == str(newest)
    assert not newest.exists()
    os.kill(controller.pid, signal.SIGKILL)
    controller.wait()
    fired = tmp_path / "run3" / "f0.0" / "fired"  # written once the revert has returned
    end = time.time() + 20
    while not fired.exists() and time.time() < end:
        time.sleep(0.1)
    assert newest.exists() and _sha(newest) == original
    assert "lease expired" in fired.read_text()
    assert not list(ckpts.glob(ASIDE_PREFIX + "*"))


def test_a_path_that_resolves_outside_the_checkpoint_folder_is_refused_and_nothing_is_injected(lab, tmp_path, ckpts):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "ckpt-00000001.pt").write_bytes(b"not the job's")
    (ckpts / "link").symlink_to(elsewhere)
    ctx = _ctx(lab, tmp_path, ckpts)
    fault = _corrupt("remove", path="link")
    with pytest.raises(ScenarioError, match="outside the job's checkpoint folder"):
        fault.inject(ctx, resolve_nodes(ctx.inventory, fault.spec.target))
    assert (elsewhere / "ckpt-00000001.pt").exists() and not list(elsewhere.iterdir())[1:]
    assert not (tmp_path / "j.jsonl").exists() or read_journal(tmp_path / "j.jsonl") == []
    ctx.leases.close()


def _edited(tmp_path: Path, source: Path, replace: dict[str, str | None], add_after: dict[str, str] | None = None) -> tuple[Path, list[str]]:
    """A copy of ``source`` with the lines starting with each key (stripped) replaced, or dropped for ``None``."""
    lines = source.read_text().splitlines()
    out = []
    for line in lines:
        key = next((k for k in replace if line.strip().startswith(k)), None)
        if key is None:
            out.append(line)
            for after, extra in (add_after or {}).items():
                if line.strip().startswith(after):
                    out.append(extra)
        elif replace[key] is not None:
            out.append(replace[key])
    bad = tmp_path / "bad.yaml"
    bad.write_text("\n".join(out) + "\n")
    return bad, out


@pytest.mark.parametrize("edit, field, words", [
    ({"path:": "    path: ../elsewhere"}, "path", "leaves the job's checkpoint folder"),
    ({"path:": "    path: /etc"}, "path", "only known at run time"),
    ({"mode:": "    mode: shred"}, "mode", "truncate"),
    ({"duration:": None}, "duration", "missing required key"),
])
def test_bad_corrupt_input_is_a_positioned_error(tmp_path, edit, field, words):
    bad, lines = _edited(tmp_path, CORRUPT, edit)
    res = run_cli("run", bad, "--dry-run")
    assert res.code == 2, res.stdout + res.stderr
    assert "bad.yaml:" in res.stderr and field in res.stderr and words in res.stderr, res.stderr


@pytest.mark.parametrize("edit, words", [
    ({"size:": None}, "missing required key"),
    ({"size:": "    size: 64m"}, "invalid size"),
    ({"size:": "    size: 1.5GiB"}, "invalid size"),
    ({"size:": "    size: 0"}, "at least 1 byte"),
])
def test_bad_full_input_is_a_positioned_error(tmp_path, edit, words):
    bad, lines = _edited(tmp_path, FULL, edit)
    res = run_cli("run", bad, "--dry-run")
    assert res.code == 2, res.stdout + res.stderr
    assert "bad.yaml:" in res.stderr and "size" in res.stderr and words in res.stderr, res.stderr


def test_full_refuses_a_file_system_with_more_free_space_than_its_limit(lab, tmp_path, ckpts):
    ctx = _ctx(lab, tmp_path, ckpts)
    fault = FullFault(FullSpec(kind="storage.full", target=TargetSpec(nodes=["n0"]), size="1MiB", duration=30), "f0")
    targets = resolve_nodes(ctx.inventory, fault.spec.target)
    for verb in (fault.preflight, fault.inject):
        with pytest.raises(ScenarioError, match=r"faults\.0\.size: .* free, more than the limit of 1MiB"):
            verb(ctx, targets)
    assert not list(ckpts.glob(FILL_PREFIX + "*")) and read_journal(tmp_path / "j.jsonl") == []
    ctx.leases.close()


def test_a_run_on_a_roomy_disk_exits_2_before_the_job_starts(tmp_path):
    """Without checkpoint_fs the job's folder is on this machine's big disk: refused at preflight."""
    bad, _ = _edited(tmp_path, FULL, {"checkpoint_fs:": None})
    res = run_cli("run", bad, "--out", tmp_path / "run")
    assert res.code == 2, res.stdout + res.stderr
    assert "more than the limit of 64MiB" in res.stderr and "nothing was injected" in res.stderr
    assert not (tmp_path / "run" / "logs").exists()  # no job was started
    assert not list((tmp_path / "run").rglob(FILL_PREFIX + "*"))


def test_checkpoint_fs_needs_a_cluster_that_can_give_one(tmp_path):
    bad, _ = _edited(tmp_path, FULL, {"cluster:": "cluster: {kind: netns, nodes: 3}"})
    res = run_cli("validate", bad)
    assert res.code == 2 and "workload.checkpoint_fs" in res.stderr, res.stdout + res.stderr


def _root_mount() -> str | None:
    return None if os.geteuid() == 0 else "mounting a tmpfs needs root"


def test_full_fills_a_small_file_system_and_revert_empties_it(lab, tmp_path, monkeypatch):
    problem = _root_mount()
    require(problem is None, problem or "")
    folder = tmp_path / "checkpoints"
    mount_checkpoint_fs(folder, 8 << 20)
    try:
        assert mounted(folder)
        (folder / "ckpt-00000025.pt").write_bytes(b"x" * 100_000)
        ctx = _ctx(lab, tmp_path, folder)
        fault = FullFault(FullSpec(kind="storage.full", target=TargetSpec(nodes=["n0"]), size="8MiB", duration=30), "f0")
        targets = resolve_nodes(ctx.inventory, fault.spec.target)
        fault.preflight(ctx, targets)
        [inj] = fault.inject(ctx, targets)
        fill = Path(inj.detail["file"])
        assert fill.parent == folder and inj.detail["full"] is True and os.statvfs(folder).f_bavail == 0
        with pytest.raises(OSError):
            (folder / "ckpt-00000050.pt").write_bytes(b"y" * 100_000)
        monkeypatch.setattr("chaoskit.faults.storage.VERIFY_S", 0.5)  # the fill lasts: no 5 s poll for it
        assert fault.verify(ctx, inj) is not None
        fault.revert(ctx, inj)
        assert fault.verify(ctx, inj) is None
        ctx.leases.release(inj.fault_id)
        assert not fill.exists() and os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize > 7 << 20
        ctx.leases.close()
    finally:
        unmount(folder)
    assert not mounted(folder)


# -- one end-to-end drill per kind (tens of seconds each) -----------------------------------


@pytest.mark.slow
def test_drill_corrupt_then_kill_falls_back_to_an_older_checkpoint(tmp_path):
    need_torch()
    # the shipped drill in a short form (issue 52): 160 steps, not 250; the truncation at step 105 and the kill at
    # 110, 40 steps before the next save (step 150, before the job's end), are the shipped ones: the failed load of
    # step 100, the fallback to step 50 and the original put back (here after the job wrote its own step 100 again:
    # the job's file wins) do not depend on how long the job trains after it. Not shorter: at load 20 the truncation
    # landed 2.8 s (28 steps) late, and at 125 steps after the job's end
    scenario = short_form(CORRUPT, tmp_path, ("steps: 250", "steps: 160"))
    res = run_cli("run", scenario, "--out", tmp_path / "run", "--json")
    assert res.code == 0, res.stdout[-3000:] + res.stderr
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    phases = result["phases"]
    assert result["verdict"] == "pass"
    # Measured from the kill: the corrupted checkpoint could not be loaded, so the one before it was restored.
    corrupted = result["faults"][0]["targets"][0].split(":", 1)[1]
    step = int(Path(corrupted).stem.split("-")[1])
    assert phases["restored_step"] == step - 50 and phases["lost_steps"] == phases["last_step_before"] - (step - 50)
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    failed = [e for e in events if e["kind"] == "ckpt.load.failed"]
    assert failed and all(e["path"] == corrupted for e in failed)
    assert result["checks"]["faults_reverted"]["pass"]
    assert not list((tmp_path / "run").rglob(ASIDE_PREFIX + "*"))


@pytest.mark.slow
def test_drill_disk_full_is_survived_and_the_file_system_is_unmounted(tmp_path):
    need_torch()
    problem = _root_mount()
    require(problem is None, problem or "")
    # the shipped drill in a short form (issue 52): 250 steps, not 300. The disk stays full the shipped 5 s: at load
    # 20 the fill landed 50 steps late and only one save fell in a 3 s window. The fill is gone 100 steps or fewer
    # after it lands (steps take 50 ms or more), so saves after it work again even if it lands 100 steps late
    scenario = short_form(FULL, tmp_path, ("steps: 300", "steps: 250"))
    res = run_cli("run", scenario, "--out", tmp_path / "run", "--json")
    assert res.code == 0, res.stdout[-3000:] + res.stderr
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["verdict"] == "pass" and result["checks"]["training_finished"]["pass"]
    folder = Path(result["faults"][0]["targets"][0].split(":", 1)[1])  # the job's folder: RUN.job/checkpoints
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    failed = [e for e in events if e["kind"] == "ckpt.save.failed"]
    t_revert = next(e["ts"] for e in events if e["kind"] == "fault.reverted")
    assert failed and result["phases"]["detected_by"].endswith("checkpoint save failed")
    assert any(e["kind"] == "ckpt.save.end" and e["ts"] > t_revert for e in events)  # saves work again
    assert folder.name == "checkpoints" and not mounted(folder)
    journal = read_journal(tmp_path / "run" / "journal.jsonl")
    assert any(e.get("fault_id") == "ckptfs" and e["action"] == "reverted" for e in journal)


@pytest.mark.parametrize("folder, words", [
    ("job/checkpoints", "not an absolute path"),
    ("/tmp/job/../../etc", "not a normalised path"),
    ("/tmp/job\n/checkpoints", "not an absolute path of printable characters"),
])
def test_a_checkpoint_folder_that_is_not_a_clean_absolute_path_never_reaches_the_node(lab, tmp_path, folder, words):
    ctx = _ctx(lab, tmp_path, folder)
    for fault in (_corrupt("remove"), FullFault(FullSpec(kind="storage.full", target=TargetSpec(nodes=["n0"]), size="1MiB",
                                                         duration=30), "f0")):
        with pytest.raises(InfraError, match=words):
            fault.inject(ctx, resolve_nodes(ctx.inventory, fault.spec.target))
    assert not (tmp_path / "j.jsonl").exists() or read_journal(tmp_path / "j.jsonl") == []
    ctx.leases.close()


@pytest.mark.parametrize("folder", ["/data/../etc", "/data/./ckpt", "/data//ckpt"])
def test_an_attach_checkpoint_folder_that_is_not_a_plain_path_is_a_positioned_error(tmp_path, folder):
    bad, _ = _edited(tmp_path, CORRUPT, {}, add_after={"launch:": f"  checkpoint_dir: {folder}"})
    res = run_cli("validate", bad)
    assert res.code == 2, res.stdout + res.stderr
    assert "bad.yaml:" in res.stderr and "checkpoint_dir" in res.stderr and "plain absolute path" in res.stderr, res.stderr
