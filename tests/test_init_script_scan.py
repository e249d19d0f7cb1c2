"""``chaoskit init`` reads a plain script's own lines (issue 51, item 5): the rules it writes match what the script
prints for its steps, checkpoints and start, and a tutorial script drilled with that scenario unchanged passes with
the lost work its own log shows."""

from __future__ import annotations

import json
import re
import shutil
import textwrap

import pytest

from chaoskit.observe.script_lines import scan
from tests.conftest import ROOT, need_torch, run_cli

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

TUTORIAL = ROOT / "examples" / "plain" / "ddp_tutorial.py"


def _rules(source: str) -> dict[str, str]:
    return {f.event: f.match for f in scan(textwrap.dedent(source))}


def _matches(rule: str, line: str) -> dict[str, str] | None:
    m = re.search(rule, line)
    return None if m is None else m.groupdict()


def test_the_tutorials_rules_match_what_its_lines_print():
    found = {f.event: f for f in scan(TUTORIAL.read_text())}
    assert sorted(found) == ["ckpt.load.end", "ckpt.save.end", "step", "worker.start"]
    assert _matches(found["step"].match, "[RANK1] Step 42 loss 0.3772") == {"rank": "1", "step": "42"}
    assert _matches(found["ckpt.save.end"].match, "Step 40 | Training snapshot saved at snapshot.pt") == {"step": "40"}
    assert _matches(found["ckpt.load.end"].match, "[RANK0] Resuming training from snapshot at Step 40") == \
        {"rank": "0", "step": "40"}
    assert _matches(found["worker.start"].match, "[RANK1] starting worker pid 9799") == {"rank": "1", "pid": "9799"}
    # the step rule takes neither the save line nor the load line (their steps are not steps made)
    assert _matches(found["step"].match, "Step 40 | Training snapshot saved at snapshot.pt") is None
    assert _matches(found["step"].match, "[RANK0] Resuming training from snapshot at Step 40") is None
    line = TUTORIAL.read_text().splitlines()[found["step"].line - 1].strip()
    assert found["step"].source == line and "Step {step}" in line


def test_logging_percent_format_and_print_arguments():
    rules = _rules("""
        import logging, torch
        logger = logging.getLogger(__name__)
        def save(model, path, global_step):
            torch.save(model.state_dict(), path)
            logger.info("saved checkpoint %s at step %d", path, global_step)
        def main(model):
            if os.path.exists("ckpt.pt"):
                logger.warning("loading checkpoint ckpt.pt")
                model.load_state_dict(torch.load("ckpt.pt"))
            for global_step in range(100):
                logger.info("step %d | loss %.4f", global_step, 0.5)
                if global_step % 10 == 0:
                    save(model, "ckpt.pt", global_step)
    """)
    assert rules["step"] == r"step (?P<step>\d+) \| loss"
    assert rules["ckpt.save.end"] == r"saved checkpoint .*? at step (?P<step>\d+)"
    assert rules["ckpt.load.start"] == r"loading checkpoint ckpt\.pt"  # announced before the load: its start
    assert _matches(rules["ckpt.save.end"], "INFO:__main__:saved checkpoint ckpt.pt at step 20") == {"step": "20"}
    assert _rules('for step in range(9):\n    print("step", step, "loss", 1.0)\n')["step"] == r"step (?P<step>\d+) loss"
    assert _rules('for it in range(9):\n    print("iter {}: loss={:.3f}".format(it, 0.1))\n')["step"] == \
        r"iter (?P<step>\d+): loss="
    assert _rules('for step in range(9):\n    print(f"step={step}")\n')["step"] == r"step=(?P<step>\d+)"


def test_a_line_that_says_too_little_and_a_script_that_does_not_parse_give_no_rule():
    assert scan("for step in range(9):\n    print(step)\n") == []
    assert scan("def broken(:\n") == []


def test_init_writes_the_scripts_rules_with_their_lines_and_validate_accepts_them(tmp_path):
    shutil.copy(TUTORIAL, tmp_path / "train.py")  # beside the scenario: read without --script
    res = run_cli("init", "--out", tmp_path / "s.yaml")
    assert res.code == 0 and res.stdout.startswith(f"wrote {tmp_path / 's.yaml'}\n"), res.stderr  # no starter written
    text = (tmp_path / "s.yaml").read_text()
    assert "command: [train.py]" in text and "\n  steps:" not in text
    assert "    - event: step                      # train.py:59: print(f\"[RANK{self.rank}] Step {step} loss" in text
    assert "match: '\\[RANK(?P<rank>\\d+)\\] Step (?P<step>\\d+) loss'" in text
    assert (tmp_path / "train.py").read_bytes() == TUTORIAL.read_bytes()
    assert run_cli("validate", tmp_path / "s.yaml").code == 0


def test_init_writes_what_it_cannot_find_commented_with_the_line_to_fill(tmp_path):
    (tmp_path / "job.py").write_text("import torch\nfor step in range(9):\n    print(step)\n"
                                     "torch.save({}, 'c.pt')\nprint('checkpoint written to c.pt')\n")
    res = run_cli("init", "--script", tmp_path / "job.py", "--out", tmp_path / "s.yaml")
    assert res.code == 0, res.stderr
    text = (tmp_path / "s.yaml").read_text()
    assert "    - event: ckpt.save.end             # job.py:5: print('checkpoint written to c.pt')" in text
    assert ("  # EDIT: no line of job.py says it makes a step; uncomment and match the one it prints (validate "
            "refuses the drill without it: no step could come)\n  #   - {event: step, match: 'Step (?P<step>\\d+)'}") in text
    refused = run_cli("validate", tmp_path / "s.yaml")
    assert refused.code == 2 and "can never fire: no step event can come" in refused.stderr


def test_a_missing_script_is_one_line_and_nothing_is_written(tmp_path):
    res = run_cli("init", "--script", tmp_path / "nope.py", "--out", tmp_path / "s.yaml")
    assert res.code == 2 and res.stderr == f"error: --script: no script {tmp_path / 'nope.py'}; nothing was written\n"
    assert not (tmp_path / "s.yaml").exists()


@pytest.mark.slow
def test_a_tutorial_script_drilled_with_inits_scenario_unchanged_passes_with_the_lost_work_its_log_shows(tmp_path):
    """Issue 51's "done when": a plain tutorial script, chaoskit init's scenario, nothing edited: PASS, and lost work
    equal to the truth in the job's own log: the last step the killed rank printed minus the step it resumed from."""
    need_torch()
    shutil.copy(TUTORIAL, tmp_path / "train.py")
    assert run_cli("init", "--out", tmp_path / "s.yaml").code == 0
    res = run_cli("run", tmp_path / "s.yaml", "--out", tmp_path / "run")
    assert res.code == 0, res.with_logs(tmp_path / "run")
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["verdict"] == "pass", res.with_logs(tmp_path / "run")
    killed = (tmp_path / "run" / "logs" / "n1.log").read_text()  # rank 1, on n1 (one worker a node)
    first_life, _, second = killed.partition("starting worker pid")[2].partition("[RANK1] starting worker pid")
    last = max(int(s) for s in re.findall(r"\[RANK1\] Step (\d+) loss", first_life))
    resumed = int(re.search(r"Resuming training from snapshot at Step (\d+)", second).group(1))
    assert result["phases"]["restored_from"] == "load line" and result["phases"]["restored_step"] == resumed
    assert result["phases"]["lost_steps"] == last - resumed > 0
    assert all(result["phases"][k] is not None for k in ("detection_s", "reallocation_s", "checkpoint_load_s",
                                                          "recovery_s"))


def test_a_script_behind_a_link_is_not_read(tmp_path):
    """The script's lines go into the scenario: a link at its name (another user's, to a file they cannot read) is
    not followed. Named with --script: refused in one line; a train.py beside the scenario: kept, not read."""
    secret = tmp_path / "secret.py"
    secret.write_text("for step in range(9):\n    print(f'password hunter2 step {step}')\n")
    (tmp_path / "drill").mkdir()
    (tmp_path / "drill" / "train.py").symlink_to(secret)
    res = run_cli("init", "--script", tmp_path / "drill" / "train.py", "--out", tmp_path / "drill" / "s.yaml")
    assert res.code == 2 and res.stderr == (f"error: --script: {tmp_path / 'drill' / 'train.py'} is a link; name the "
                                            "script itself; nothing was written\n")
    res = run_cli("init", "--out", tmp_path / "drill" / "s.yaml")
    text = (tmp_path / "drill" / "s.yaml").read_text()
    assert res.code == 0 and "hunter2" not in text and "command: [train.py]" in text
    assert (tmp_path / "drill" / "train.py").is_symlink() and "train.py" not in res.stdout
