"""The launch table and the Job contract: every ``workload.launch`` the schema offers has its row, its job class
keeps :class:`~chaoskit.workloads.api.Job`, and the row's fields are what ``validate`` takes and refuses."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

from chaoskit.scenario import LoadedScenario, validate_file
from chaoskit.core.launches import LAUNCH_FIELDS, LAUNCH_NAMES, LAUNCHES, taking
from chaoskit.scenario.model import Workload
from chaoskit.stacks.registry import STACKS, stack
from chaoskit.scenario.schema import schema_dict
from chaoskit.workloads.api import Job
from chaoskit.workloads.attach import AttachedJob
from chaoskit.workloads.launch import TorchrunJob
from chaoskit.workloads.registry import JOBS, job_class
from chaoskit.workloads.slurm import SlurmJob
from tests.conftest import ROOT, SCENARIOS, run_cli

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

FIELD_VALUES = {
    "command": "[train.py]", "process": "train", "inproc": "sdk", "checkpoint_dir": "/ckpt", "checkpoint_fs": "64MiB",
    "script": "job.sh", "run_id": "r1", "user": "alice", "slurm_job": "7", "step_compute": "10ms",
    "env": "{OMP_NUM_THREADS: '2'}",
}
"""A valid value of every launch-specific field (a new one in the table needs one here)."""
CLASSES = sorted({cls for entry in JOBS.values() for cls in (entry.job, entry.scheduled) if cls is not None},
                 key=lambda c: c.__name__)


def _scenario(tmp_path: Path, launch: str, fields: dict[str, str], recovery: str | None = None) -> Path:
    lines = ["name: t", "cluster: lab", "workload:", f"  launch: {launch}",
             *([f"  recovery: {recovery}"] if recovery else []), *(f"  {k}: {v}" for k, v in fields.items()),
             "faults: [{kind: process.kill, target: {ranks: [1]}, at: {step: 5}}]"]
    path = tmp_path / "s.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _needed(launch: str) -> dict[str, str]:
    needs = LAUNCHES[launch].needs
    return {needs.field: FIELD_VALUES[needs.field]} if needs is not None else {}


def test_every_launch_of_the_schema_has_its_row_in_both_tables():
    enum = schema_dict()["$defs"]["Workload"]["properties"]["launch"]["enum"]
    assert tuple(enum) == LAUNCH_NAMES == tuple(LAUNCHES) == tuple(JOBS)
    assert all(JOBS[name].spec is LAUNCHES[name] for name in LAUNCHES)
    assert set(FIELD_VALUES) == set(LAUNCH_FIELDS)
    for name, spec in LAUNCHES.items():
        assert spec.fields <= set(LAUNCH_FIELDS), name
        assert spec.needs is None or spec.needs.field in spec.fields, name
    assert stack("restart").launches == LAUNCH_NAMES  # plain torchrun runs every launch
    assert all(set(stack(name).launches) <= set(LAUNCH_NAMES) for name in STACKS.names())


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_each_job_class_keeps_the_contract(cls):
    assert issubclass(cls, Job) and not inspect.isabstract(cls)
    # built by the runner as make_job does
    inspect.signature(cls).bind("cluster", "workload", Path("run"), "run-id", None, None, base=Path("."))
    for name, member in vars(Job).items():
        if name.startswith("_") or not callable(member):
            continue
        wanted = inspect.signature(member)
        mine = inspect.signature(getattr(cls, name))
        # whatever the contract passes, the class takes
        mine.bind(*(p.name for p in wanted.parameters.values()
                    if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD))
        assert set(wanted.parameters) <= set(mine.parameters), (cls.__name__, name, mine)


def test_the_flags_say_what_isinstance_used_to():
    assert [c.__name__ for c in CLASSES if not c.started] == ["AttachedJob"]
    assert [c.__name__ for c in CLASSES if c.bootstraps] == ["TorchrunJob"]


@pytest.mark.parametrize("launch", LAUNCH_NAMES)
def test_the_table_picks_the_job_class(launch):
    plain, slurm = SimpleNamespace(scheduler=None), SimpleNamespace(scheduler=object())
    expected = {"reference": (TorchrunJob, SlurmJob), "uninstrumented": (TorchrunJob, SlurmJob),
                "command": (TorchrunJob, TorchrunJob), "attach": (AttachedJob, AttachedJob),
                "sbatch": (SlurmJob, SlurmJob)}
    if launch == "ray-train":
        assert job_class(launch, plain) is job_class(launch, slurm) is JOBS[launch].job
        return
    assert (job_class(launch, plain), job_class(launch, slurm)) == expected[launch]


def test_the_runner_never_asks_which_job_class_it_has():
    """The runner builds its job from the table and asks the job: it imports no job class."""
    tree = ast.parse((ROOT / "chaoskit" / "runner.py").read_text())
    names = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names}
    assert not names & {cls.__name__ for cls in CLASSES}


@pytest.mark.parametrize("launch", LAUNCH_NAMES)
def test_a_field_the_launch_does_not_take_is_refused_at_the_workload(tmp_path, launch):
    for field in LAUNCH_FIELDS:
        if field in LAUNCHES[launch].fields:
            continue
        path = _scenario(tmp_path, launch, {**_needed(launch), field: FIELD_VALUES[field]})
        res = run_cli("validate", path)
        assert res.code == 2, (launch, field)
        line = next(line for line in res.stderr.splitlines() if line.startswith(f"{path}:"))
        assert line.startswith(f"{path}:4:3: workload: '{field}' is only used with "), line
        if "{launches}" in LAUNCH_FIELDS[field]:
            assert all(name in line for name in taking(field)), line
        else:
            assert f"not launch: {launch}" in line


@pytest.mark.parametrize("launch", LAUNCH_NAMES)
def test_every_field_the_launch_takes_validates(tmp_path, launch):
    for field in LAUNCHES[launch].fields:
        loaded = validate_file(_scenario(tmp_path, launch, {**_needed(launch), field: FIELD_VALUES[field]}))
        assert isinstance(loaded, LoadedScenario), (launch, field, loaded)


@pytest.mark.parametrize("launch", [name for name, spec in LAUNCHES.items() if spec.needs is not None])
def test_the_field_a_launch_needs_is_asked_for(tmp_path, launch):
    path = _scenario(tmp_path, launch, {})
    res = run_cli("validate", path)
    assert res.code == 2 and f"{path}:4:3: workload: launch: {launch} needs '{LAUNCHES[launch].needs.field}: " in res.stderr


@pytest.mark.parametrize("recovery", [n for n in STACKS.names() if stack(n).launches != LAUNCH_NAMES])
def test_a_recovery_model_runs_only_under_its_launches(tmp_path, recovery):
    for launch in LAUNCH_NAMES:
        found = validate_file(_scenario(tmp_path, launch, _needed(launch), recovery=recovery))
        if launch in stack(recovery).launches:
            assert isinstance(found, LoadedScenario), (launch, found)
        else:
            assert not isinstance(found, LoadedScenario) and f"not launch: {launch}" in str(found[0]), (launch, found)


def test_what_finished_means_comes_from_the_launch():
    class Stub(Job):
        def __init__(self, workload, codes):
            self.workload, self.codes = workload, codes

        def commands(self): return {}
        def start(self): pass
        def running(self): return False
        def returncodes(self): return self.codes
        def stop(self): pass

    reference = Stub(Workload(steps=100), {})
    assert reference.finish_step() == 100
    assert reference.finished(100) == {"pass": True, "final_step": 100, "expected_step": 100}
    assert not reference.finished(99)["pass"]
    own = Stub(Workload(launch="command", command=["train.py"]), {"n0": 1, "n1": 0})
    assert own.finish_step() is None
    assert own.finished(7) == {"pass": True, "final_step": 7, "expected_step": None, "exit_codes": {"n0": 1, "n1": 0}}
    assert not Stub(Workload(launch="command", command=["train.py"]), {"n0": 1}).finished(7)["pass"]
    assert Stub(Workload(launch="command", command=["train.py"], steps=50), {"n0": 0}).finish_step() == 50


@pytest.mark.parametrize("scenario, key", [("kill-rank.yaml", None), ("slurm-kill-rank.yaml", "submit")])
def test_the_dry_run_carries_the_jobs_own_part(scenario, key):
    res = run_cli("run", SCENARIOS / scenario, "--dry-run", "--json")
    assert res.code == 0, res.stderr
    assert [k for k in ("attach", "submit") if k in res.json] == ([key] if key else [])


def test_what_faults_refuse_of_a_launch_comes_from_its_row_of_the_table():
    """The storage, in-process and requeue faults ask the launch table where a job keeps its checkpoints, how an
    in-process fault reaches it and whether it is found rather than started: no launch name in their code."""
    from types import SimpleNamespace

    from chaoskit.core.launches import LAUNCHES
    from chaoskit.core.errors import InfraError
    from chaoskit.faults.inproc import InprocHangFault as InprocHang
    from chaoskit.faults.slurm import RequeueFault
    from chaoskit.faults.storage import CorruptFault

    def spec(cls, **fields):
        return cls(cls.Spec.model_validate({"kind": cls.kind, "target": {"ranks": [0]} if cls.target_type == "process"
                                            else {"nodes": ["n0"]}, **fields}), "f0")

    corrupt = spec(CorruptFault, path=".", duration="5s", mode="truncate")
    hang = spec(InprocHang, duration="5s")
    requeue = spec(RequeueFault)
    for name, row in LAUNCHES.items():
        w = SimpleNamespace(launch=name, checkpoint_dir=None, inproc=None, slurm_job=None)
        refused = corrupt.check_job(w)
        assert (refused is not None) == (row.checkpoints in ("ray", "given")), name
        if row.inproc == "sdk":
            with pytest.raises(InfraError, match="cannot take in-process faults"):
                hang.check_job(w)
        else:
            assert (hang.check_job(w) is not None) == (row.inproc == "none"), name
        assert (requeue.check_job(w) is not None) == row.found, name
    assert [n for n, r in LAUNCHES.items() if r.found] == ["attach"]
    assert {n for n, r in LAUNCHES.items() if not r.restarts_own} == {"attach", "sbatch"}
