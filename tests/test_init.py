"""``chaoskit init``: every framework x cluster x launch it offers writes a starter scenario that validates."""

from __future__ import annotations

import itertools

import pytest

from chaoskit.cli.init_cmd import CLUSTERS, FRAMEWORKS, LAUNCHES
from tests.conftest import run_cli

COMBOS = [(f, c, l) for f, c in itertools.product(FRAMEWORKS, CLUSTERS) for l in LAUNCHES[c]]


def test_every_combination_validates(tmp_path):
    assert len(COMBOS) == len(FRAMEWORKS) * 4  # lab: command; inventory: attach, sbatch; slurm: sbatch
    for framework, cluster, launch in COMBOS:
        folder = tmp_path / f"{framework}-{cluster}-{launch}"
        res = run_cli("init", "--framework", framework, "--cluster", cluster, "--launch", launch,
                      "--out", folder / "scenario.yaml")
        assert res.code == 0, (framework, cluster, launch, res.stderr)
        text = (folder / "scenario.yaml").read_text()
        assert "# EDIT" in text and f"presets: [torchrun{', ' + framework if framework != 'torchrun' else ''}]" in text
        check = run_cli("validate", folder / "scenario.yaml")
        assert check.code == 0, (framework, cluster, launch, check.stderr, text)


def test_the_cluster_picks_the_launch_and_a_wrong_one_is_refused(tmp_path):
    res = run_cli("init", "--framework", "hf", "--cluster", "inventory", "--out", tmp_path / "a" / "s.yaml")
    assert res.code == 0 and "launch: attach" in (tmp_path / "a" / "s.yaml").read_text()
    assert (tmp_path / "a" / "inventory.yaml").is_file()
    res = run_cli("init", "--cluster", "lab", "--launch", "sbatch", "--out", tmp_path / "b.yaml")
    assert res.code == 2 and res.stderr == "error: --launch sbatch does not run on --cluster lab; it runs command\n"
    assert not (tmp_path / "b.yaml").exists()
    res = run_cli("init", "--framework", "keras", "--out", tmp_path / "c.yaml")
    assert res.code == 2 and res.stderr.startswith("error: --framework keras: not one of torchrun, hf,")


def test_an_existing_file_is_kept_unless_forced(tmp_path):
    out = tmp_path / "s.yaml"
    out.write_text("mine\n")
    assert run_cli("init", "--out", out).code == 2 and out.read_text() == "mine\n"
    assert run_cli("init", "--out", out, "--force").code == 0 and "launch: command" in out.read_text()
    assert run_cli("validate", out).code == 0


@pytest.mark.parametrize("framework", ["hf", "megatron"])
def test_the_starter_names_the_presets_verbosity(tmp_path, framework):
    run_cli("init", "--framework", framework, "--out", tmp_path / "s.yaml")
    text = (tmp_path / "s.yaml").read_text()
    assert ("TRANSFORMERS_VERBOSITY=info" if framework == "hf" else "print_rank_0") in text


def test_the_shipped_framework_scenarios_validate():
    from tests.conftest import ROOT

    shipped = sorted((ROOT / "examples" / "frameworks").glob("*.yaml"))
    res = run_cli("validate", ROOT / "examples" / "frameworks")
    assert len(shipped) >= 5 and res.code == 0 and res.stdout.count("ok  ") == len(shipped), res.stdout + res.stderr


def test_a_plain_scripts_starter_names_the_step_rule_to_fill_not_a_callback_that_is_not_there(tmp_path):
    """Issue 51, item 5(a), in part: ``chaoskit init --framework torchrun`` said "add the callback above" with no
    callback above. It writes the step and checkpoint rules commented, marked EDIT; once the starter train.py is
    replaced by a plain script, validate refuses the drill (no step can come) until the rules are uncommented."""
    path = tmp_path / "s.yaml"
    res = run_cli("init", "--framework", "torchrun", "--cluster", "lab", "--launch", "command", "--out", path)
    assert res.code == 0, res.stderr
    text = path.read_text()
    assert "callback above" not in text and "EDIT: once train.py is your script" in text
    assert run_cli("validate", path).code == 0  # the starter script reports through the SDK
    (tmp_path / "train.py").write_text("for step in range(100):\n    print(f'Step {step}', flush=True)\n")
    refused = run_cli("validate", path)
    assert refused.code == 2 and "can never fire: no step event can come" in refused.stderr
    path.write_text(text.replace("  # log:", "  log:").replace("  #   - {event:", "    - {event:"))
    assert run_cli("validate", path).code == 0
