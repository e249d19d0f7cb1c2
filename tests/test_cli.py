"""The CLI surface: start-up stays light, the schema stays in sync, errors map to exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chaoskit.core.errors import ExitCode
from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

HEAVY = ("torch", "ray", "paramiko", "docker", "numpy", "jinja2", "prometheus_client")


def test_importing_the_cli_loads_no_heavy_dependency():
    code = (
        "import sys, chaoskit.cli.app, chaoskit.cli.main;"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_lists_the_verbs_and_loads_nothing_heavy():
    code = (
        "import sys; from chaoskit.cli import main;"
        "rc = main(['--help']) if False else None\n"
        "from chaoskit.cli.main import CliEnv; import io; o=io.StringIO();"
        "rc = main(['--help'], CliEnv(stdout=o, stderr=o));"
        f"print(rc, [m for m in {HEAVY!r} if m in sys.modules]); print(o.getvalue())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    first, _, text = out.partition("\n")
    assert first == "0 []"
    for verb in ("run", "validate", "schema", "rollback", "catalog", "gameday", "report", "export", "simulate", "lab"):
        assert f"  {verb} " in text


def test_each_command_loads_only_what_it_needs():
    """--help lists the commands from a table (no pydantic, no scenario model); validate loads no runner, not the
    result model (``schema --result`` does), no probe, not the ``regex`` package (a pattern is compiled where it is
    first searched), and of the fault kinds only the one the file names."""
    def loaded(*args: str) -> list[str]:
        code = ("import io, sys; from chaoskit.cli.main import CliEnv, main; o = io.StringIO();"
                f"rc = main({list(args)!r}, CliEnv(stdout=o, stderr=o));"
                "print(rc, sorted(m for m in ('pydantic', 'chaoskit.scenario', 'chaoskit.runner', 'chaoskit.workloads',"
                " 'chaoskit.report.html', 'chaoskit.core.result', 'chaoskit.observe.probes', 'regex',"
                " 'chaoskit.faults.network', 'chaoskit.cluster.transports.ssh') if m in sys.modules))")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()

    assert loaded("--help") == "0 []"
    assert loaded("validate", "scenarios/kill-rank.yaml") == "0 ['chaoskit.scenario', 'pydantic']"
    assert loaded("schema", "--result") == "0 ['chaoskit.core.result', 'chaoskit.scenario', 'pydantic']"


def test_the_chaoskit_process_keeps_what_a_command_loaded_out_of_the_collectors_way():
    """The ``chaoskit`` process freezes what loading its command built (gc.freeze: no collection, the one at exit
    included, walks it again; about 5% of validate) and collects as usual after; a program or a test calling main()
    in its own process keeps its collector as it was, nothing frozen."""
    code = ("import atexit, gc, io, sys; from chaoskit.cli.main import CliEnv, main;"
            "o = io.StringIO(); rc = main(['validate', 'scenarios/kill-rank.yaml'], CliEnv(stdout=o, stderr=o));"
            "print('in-process', rc, gc.get_freeze_count(), gc.isenabled());"
            "atexit.register(lambda: print('standalone', gc.get_freeze_count() > 1000, gc.isenabled()));"
            "sys.argv = ['chaoskit', 'validate', 'scenarios/kill-rank.yaml']; main()")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["in-process 0 0 True", "ok  scenarios/kill-rank.yaml", "standalone True True"]


def test_console_script_and_module_entry_point():
    res = subprocess.run([sys.executable, "-m", "chaoskit", "--version"], capture_output=True, text=True)
    assert res.returncode == 0
    assert res.stdout.startswith("chaoskit ")


def test_committed_schema_matches_the_models():
    res = run_cli("schema")
    assert res.code == 0
    committed = json.loads((ROOT / "chaoskit.schema.json").read_text())
    assert json.loads(res.stdout) == committed, "run: chaoskit schema -o chaoskit.schema.json"


def test_schema_validates_the_shipped_scenarios():
    import jsonschema
    import yaml

    schema = json.loads((ROOT / "chaoskit.schema.json").read_text())
    # one validator for every file: jsonschema.validate() checks the schema itself against its meta-schema on each
    # call, 90% of this test's time (issue 52); the schema is still checked, once
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator = cls(schema)
    for path in (ROOT / "scenarios").glob("*.yaml"):
        validator.validate(yaml.safe_load(path.read_text()))


def test_usage_errors_exit_2_with_a_hint():
    res = run_cli("run")
    assert res.code == ExitCode.BAD_INPUT
    assert res.stderr.startswith("error: ")
    assert "hint: see 'chaoskit run --help'" in res.stderr
    res = run_cli("no-such-verb")
    assert res.code == ExitCode.BAD_INPUT


def test_exit_codes_are_the_documented_ones():
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 4, 70, 130]
    readme = (ROOT / "README.md").read_text()
    for code in ExitCode:
        assert f"| {int(code)} " in readme, f"README's exit-code table lacks {int(code)}"


def test_lab_status_names_the_lab_a_dead_run_left_and_the_command_that_removes_it(tmp_path):
    """A run killed before its teardown leaves the lab it made for itself; 'lab status' and 'lab down' (which
    touch only labs made by 'lab up') say so and point to rollback, which reverts its faults too."""
    import os
    from pathlib import Path

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    runs = Path(os.environ["CHAOSKIT_STATE_DIR"]) / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    (runs / "20261201T000000Z-kill-rank.json").write_text(json.dumps(
        {"pid": gone.pid, "run_dir": str(tmp_path), "lab": "lab-deadbeef", "kind": "process", "ephemeral": True}))
    (runs / "20261201T000001Z-shared.json").write_text(json.dumps(  # on a lab 'lab up' made: not the run's
        {"pid": gone.pid, "run_dir": str(tmp_path), "lab": "lab-0000beef", "kind": "process", "ephemeral": False}))
    res = run_cli("lab", "status")
    assert res.code == 0, res.stderr
    assert res.stdout.splitlines()[1:] == [
        f"run 20261201T000000Z-kill-rank (pid {gone.pid} is gone) left its process lab lab-deadbeef: "
        "'chaoskit rollback' reverts what it left armed and removes the lab"]
