"""Recovery stacks are plugins (issue 50, items 1 and 4): a stack registered like another package's is a
``workload.recovery`` value, with its settings under its own key, accepted by ``validate`` only under its own
launches and refused elsewhere at the line that names it; the NVRx stack refuses, at its line, a setting the NVRx
it drives lacks. ``validate`` runs in-process on real scenario files; nothing is started."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import Field

from chaoskit.core.launches import LAUNCH_NAMES
from chaoskit.core.models import StrictModel
from chaoskit.measure import measure_fault
from chaoskit.stacks import nvrx
from chaoskit.stacks.api import Stack, StackRun
from chaoskit.stacks.registry import STACKS, builtin_stacks, by_column, stack
from tests.conftest import run_cli

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)


class RetrySettings(StrictModel):
    retries: int = Field(2, ge=0, le=9, description="How often the toy launcher retries.")


class RetryRun(StackRun):
    def launcher(self, plan: bool = False) -> list[str]:
        return ["-m", "toy_launcher", "--retries", str(self.job.workload.toy.retries)]


class ToyStack(Stack):
    """A throwaway stack, measured like ``restart``, that runs ``launch: command`` only."""

    name = "toy-retry"
    describe = "a toy launcher that retries"
    launches = ("command",)
    settings_key = "toy"
    Settings = RetrySettings
    settings_doc = "recovery: toy-retry only."
    run_class = RetryRun

    def measure(self, events: Any, t_fault: float, t_fault_uncertainty: float = 0.0, *, node: str | None = None,
                fault_step: int | None = None) -> dict[str, Any]:
        return measure_fault(events, t_fault, t_fault_uncertainty, node=node, fault_step=fault_step)


@pytest.fixture
def toy_stack():
    STACKS.register(ToyStack.name, ToyStack)
    yield ToyStack
    STACKS.unregister(ToyStack.name)


def _scenario(tmp_path, launch: str, recovery: str, extra: list[str] = ()) -> str:
    needs = {"command": ["  command: [train.py]"], "attach": ["  process: train"], "sbatch": ["  script: job.sh"]}
    lines = ["name: t", "cluster: lab", "workload:", f"  launch: {launch}", *needs.get(launch, []),
             f"  recovery: {recovery}", *extra, "probes: {log: [{match: 'step (?P<step>[0-9]+)', event: step}]}",
             "faults: [{kind: process.kill, target: {nodes: [n1]}, at: {step: 5}}]"]
    path = tmp_path / f"{launch}.yaml"
    path.write_text("\n".join(lines) + "\n")
    (tmp_path / "train.py").write_text("print('train')\n")
    return str(path)


def test_the_built_in_stacks_are_found_in_their_modules_source():
    found = builtin_stacks()  # a new stack's module adds itself: this list is a floor, not the whole
    assert {"nvrx": "chaoskit.stacks.nvrx:Nvrx", "nvrx-inprocess": "chaoskit.stacks.nvrx_inprocess:NvrxInprocess",
            "restart": "chaoskit.stacks.restart:Restart", "torchft": "chaoskit.stacks.torchft:Torchft"}.items() <= found.items()
    for name in STACKS.names():
        assert stack(name).name == name and set(stack(name).launches) <= set(LAUNCH_NAMES)


def test_a_plugin_stack_is_accepted_only_under_its_own_launches(tmp_path, toy_stack):
    ok = run_cli("validate", _scenario(tmp_path, "command", "toy-retry", ["  toy: {retries: 4}"]))
    assert ok.code == 0, ok.stderr
    for launch in ("reference", "uninstrumented", "attach", "sbatch", "ray-train"):
        path = _scenario(tmp_path, launch, "toy-retry")
        res = run_cli("validate", path)
        assert res.code == 2, (launch, res.stdout, res.stderr)
        line = 6 if launch in ("attach", "sbatch") else 5  # the recovery line, after the launch's own field
        assert f"{path}:{line}:13: workload.recovery: recovery: toy-retry is only used with launch: command, not " \
               f"launch: {launch}" in res.stderr, res.stderr
    # its settings go with it only, refused at their line under another stack
    path = _scenario(tmp_path, "command", "restart", ["  toy: {retries: 4}"])
    res = run_cli("validate", path)
    assert res.code == 2 and f"{path}:7:8: workload.toy: 'toy' is only used with recovery: toy-retry" in res.stderr, res.stderr


def test_a_plugin_stack_is_in_the_schema_and_starts_its_own_launcher(tmp_path, toy_stack):
    from chaoskit.scenario import load_scenario
    from chaoskit.scenario.checks import check_scenario
    from chaoskit.workloads.launch import TorchrunJob

    schema = run_cli("schema").json
    assert "toy-retry" in schema["$defs"]["Workload"]["properties"]["recovery"]["enum"]
    loaded = load_scenario(_scenario(tmp_path, "command", "toy-retry", ["  toy: {retries: 4}"]))
    job = TorchrunJob(check_scenario(loaded), loaded.model.workload, tmp_path / "run", "rid", None, base=tmp_path)
    argv = job.agent_argv("n0")
    assert argv[1:5] == ["-m", "toy_launcher", "--retries", "4"] and "torch.distributed.run" not in argv
    assert STACKS.names().count("toy-retry") == 1
    assert by_column()["torchrun"].name == "restart" and "toy-retry" not in {s.name for s in by_column().values()}


def test_a_plugin_stack_that_names_a_column_gets_one_in_the_scorecard(tmp_path, toy_stack, monkeypatch):
    from chaoskit.scorecard import CannotRun, adapt_row

    monkeypatch.setattr(ToyStack, "scorecard_column", "toy", raising=False)
    row = tmp_path / "kill.yaml"
    row.write_text("name: kill\ncluster: lab\nworkload: {launch: command, command: [train.py]}\n"
                   "faults: [{kind: process.kill, target: {nodes: [n1]}, at: {step: 5}}]\n")
    doc = adapt_row(row, "toy")
    assert doc["name"] == "kill--toy" and doc["workload"]["recovery"] == "toy-retry"
    row.write_text("name: kill\ncluster: lab\nworkload: {launch: reference}\n"
                   "faults: [{kind: process.kill, target: {ranks: [1]}, at: {step: 5}}]\n")
    with pytest.raises(CannotRun, match="recovery: toy-retry is only used with launch: command"):
        adapt_row(row, "toy")


def test_a_plugin_stack_reads_its_own_naming_for_blame(toy_stack, monkeypatch):
    """What a stack named as the failed rank is read by the stack's own reader: blame asks the registry, never a name."""
    from chaoskit.blame import blame

    def retried(e, timeline, i, where, pids):
        return {"by": "toy launcher", "words": e["line"], "parties": [{"rank": e["rank"], "node": e.get("node")}]}

    monkeypatch.setattr(ToyStack, "blame_readers", {("detect", "toy"): retried}, raising=False)
    events = [{"ts": 1.0, "kind": "fault.injected", "node": "n1", "targets": ["n1/rank1"]},
              {"ts": 1.5, "kind": "detect", "source": "toy", "rank": 1, "node": "n1", "line": "rank 1 is gone, retry 1"}]
    [verdict] = blame(events, [{"t_fault": 1.0, "node": "n1", "targets": ["n1/rank1"]}])
    assert verdict["verdict"] == "right" and verdict["blamed"]["by"] == "toy launcher", verdict


def test_a_column_whose_stack_is_not_installed_is_explained_before_any_drill(tmp_path, toy_stack, monkeypatch):
    """A scorecard column whose stack's package is missing: every cell of it says so with the install line, and no
    drill is started for it (here none at all: the only column is the toy's)."""
    from chaoskit.scorecard import run_scorecard

    monkeypatch.setattr(ToyStack, "scorecard_column", "toy", raising=False)
    monkeypatch.setattr(ToyStack, "requires", "toy_launcher_not_installed", raising=False)
    monkeypatch.setattr(ToyStack, "install", "pip install toy-launcher", raising=False)
    rows = tmp_path / "rows"
    rows.mkdir()
    (rows / "train.py").write_text("print(1)\n")
    (rows / "kill.yaml").write_text("name: kill\ncluster: lab\nworkload: {launch: command, command: [train.py]}\n"
                                    "faults: [{kind: process.kill, target: {nodes: [n1]}, at: {step: 5}}]\n")
    card = run_scorecard(rows, ["toy"], out=tmp_path / "card")
    assert [(c["stack"], c["verdict"], c["why"]) for c in card["cells"]] == [
        ("toy", "cannot run", "cannot run here: toy_launcher_not_installed is not installed (recovery: toy-retry): "
                              "pip install toy-launcher")]
    assert not (tmp_path / "card" / "gameday").exists()


def test_the_dry_run_says_what_a_stack_needs_installed(tmp_path, toy_stack, monkeypatch):
    path = _scenario(tmp_path, "command", "toy-retry")
    assert "preflight" not in run_cli("run", path, "--dry-run", "--json").json
    monkeypatch.setattr(ToyStack, "requires", "toy_launcher_not_installed", raising=False)
    monkeypatch.setattr(ToyStack, "install", "pip install toy-launcher", raising=False)
    plan = run_cli("run", path, "--dry-run", "--json")
    assert plan.code == 0 and plan.json["preflight"] == [
        "toy_launcher_not_installed is not installed (recovery: toy-retry): pip install toy-launcher"], plan.stderr


def test_a_setting_the_driven_nvrx_lacks_is_refused_at_its_line(tmp_path):
    assert nvrx.nvrx_version() == "0.4.1"  # the installed one here (the newest the registry serves), else the pin
    path = _scenario(tmp_path, "reference", "nvrx", ["  nvrx:", "    heartbeat_timeout: 5s", "    hot_spares: 1"])
    res = run_cli("validate", path)
    assert res.code == 2 and f"{path}:8:17: workload.nvrx.hot_spares: " in res.stderr, res.stderr
    assert "hot_spares needs NVRx 0.7.0 or later, and chaoskit drives NVRx 0.4.1" in res.stderr
    # what 0.4.1 has is accepted
    ok = run_cli("validate", _scenario(tmp_path, "reference", "nvrx", ["  nvrx: {check_interval: 1s}"]))
    assert ok.code == 0, ok.stderr


def _on(tmp_path, cluster: str, launch: str, recovery: str | None) -> str:
    """A scenario on ``cluster`` (its line), ``launch``, and ``recovery`` on line 5 (or none)."""
    needs = {"command": ["  command: [train.py]"], "sbatch": ["  script: job.sh"]}
    lines = ["name: t", f"cluster: {cluster}", "workload:", f"  launch: {launch}",
             *([f"  recovery: {recovery}"] if recovery else []), *needs.get(launch, []),
             "probes: {log: [{match: 'step (?P<step>[0-9]+)', event: step}]}",
             "faults: [{kind: process.kill, target: {nodes: [n1]}, at: {step: 5}}]"]
    path = tmp_path / f"{launch}-{recovery}.yaml"
    path.write_text("\n".join(lines) + "\n")
    (tmp_path / "train.py").write_text("print('train')\n")
    (tmp_path / "job.sh").write_text("#!/bin/bash\n#SBATCH --requeue\nsrun true\n")
    return str(path)


def _checked_recovery(path: str) -> str:
    from chaoskit.scenario import load_scenario
    from chaoskit.scenario.checks import check_scenario

    loaded = load_scenario(path)
    check_scenario(loaded)
    return loaded.model.workload.recovery


@pytest.mark.parametrize("cluster, launch, recovery", [
    ("'{kind: ray, nodes: 3}'", "ray-train", "ray-train"),
    ("'{kind: slurm, nodes: 2, spare: 1}'", "reference", "slurm-requeue"),
    ("'{kind: slurm, nodes: 2, spare: 1}'", "uninstrumented", "slurm-requeue"),
    ("lab", "reference", "restart"),
    ("lab", "command", "restart"),
    ("'{kind: ray, nodes: 3}'", "reference", "restart"),  # torchrun on the Ray lab's nodes: no Ray Train in it
])
def test_a_scenario_that_names_no_stack_gets_its_launch_s_own(tmp_path, cluster, launch, recovery):
    """Issue 50 item 1: Ray Train's own restart for launch: ray-train, Slurm's requeue for a batch job Slurm runs,
    plain torchrun for the rest; result.json's recovery_model is this name (runner/assembler: workload.recovery)."""
    path = _on(tmp_path, cluster.strip("'"), launch, None)
    assert run_cli("validate", path).code == 0
    assert _checked_recovery(path) == recovery


def test_ray_train_and_slurm_requeue_are_refused_at_the_recovery_line_where_they_cannot_run(tmp_path):
    cases = [("lab", "reference", "ray-train", "recovery: ray-train is Ray Train's own restart, only used with "
              "launch: ray-train (a cluster of kind: ray), not launch: reference"),
             ("lab", "command", "slurm-requeue", "recovery: slurm-requeue is Slurm's requeue of a batch job, only "
              "used with launch: reference, uninstrumented or sbatch on a cluster with Slurm, not launch: command"),
             ("lab", "reference", "slurm-requeue", "recovery: slurm-requeue needs a cluster with Slurm to requeue "
              "the job (kind: slurm, or an inventory with scheduler: slurm)")]
    for cluster, launch, recovery, said in cases:
        path = _on(tmp_path, cluster, launch, recovery)
        res = run_cli("validate", path)
        assert res.code == 2 and f"{path}:5:13: workload.recovery: {said}" in res.stderr, (recovery, res.stderr)


@pytest.mark.parametrize("cluster, launch, recovery", [
    ("{kind: ray, nodes: 3}", "ray-train", "ray-train"),
    ("{kind: ray, nodes: 3}", "ray-train", "restart"),  # what it said before the stack was one: the same model
    ("{kind: slurm, nodes: 2, spare: 1}", "reference", "slurm-requeue"),
    ("{kind: slurm, nodes: 2, spare: 1}", "reference", "restart"),
])
def test_naming_the_stack_or_restart_under_ray_train_and_slurm_is_accepted(tmp_path, cluster, launch, recovery):
    path = _on(tmp_path, cluster, launch, recovery)
    res = run_cli("validate", path)
    assert res.code == 0, res.stderr
    assert _checked_recovery(path) == recovery


def test_ray_train_and_slurm_requeue_own_their_columns_and_timeouts():
    from chaoskit.scorecard import stack_timeouts

    columns = by_column()
    assert columns["ray"].name == "ray-train" and columns["slurm"].name == "slurm-requeue"
    assert list(columns)[0] == "torchrun" and list(columns)[-2:] == ["ray", "slurm"]  # clusters of their own last
    assert stack("ray-train").requires == "ray" and "chaoskit[ray]" in stack("ray-train").install
    # the Ray lab's health check is the ray column's, the SlurmdTimeout the slurm column's, read from result.json
    timeouts, _ = stack_timeouts("ray", {"workload": {"launch": "ray-train"}}, {})
    assert timeouts["Ray health check"].startswith("1s x 3 failures")
    timeouts, warnings = stack_timeouts("slurm", {"workload": {"recovery": "slurm-requeue"}},
                                        {"cluster": {"slurm": {"settings": {"slurmd_timeout": "10s"}}}})
    assert timeouts["SlurmdTimeout"] == "10s" and not warnings
    assert "Ray health check" not in stack_timeouts("torchrun", {"workload": {}}, {})[0]
