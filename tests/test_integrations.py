"""The framework callbacks against the real frameworks: a tiny Hugging Face Trainer and a tiny Lightning run
(examples/frameworks/, models built from configs, synthetic data, nothing downloaded), each in a subprocess
with CHAOSKIT_EVENTS set, trained, then resumed from its own checkpoint folder."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from chaoskit.core.files import torch_cache_env
from tests.conftest import ROOT, need

EXAMPLES = ROOT / "examples" / "frameworks"


def _need(module: str) -> None:
    need(importlib.util.find_spec(module) is not None, f"{module} (pip install 'chaoskit[frameworks]')")


def _run(script: str, tmp_path: Path, calls: list[list[str]]) -> list[dict]:
    """Run ``script``'s main once per argument list, in one process (one import of the framework); its events."""
    events = tmp_path / "events.jsonl"
    env = {**os.environ, "CHAOSKIT_EVENTS": str(events), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLES)]), "OMP_NUM_THREADS": "1",
           **torch_cache_env(tmp_path)}  # torch's compile cache in the test's folder, not /tmp/torchinductor_root
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    code = f"import {script} as job\n" + "".join(f"job.main({args!r})\n" for args in calls)
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return [json.loads(line) for line in events.read_text().splitlines()]


def _kinds(events, *kinds):
    return [(e["kind"], e.get("step")) for e in events if e["kind"] in kinds]


def test_hf_trainer_callback_reports_steps_saves_and_the_restored_step(tmp_path):
    _need("transformers")
    out = str(tmp_path / "out")
    events = _run("hf_train", tmp_path, [
        ["--steps", "4", "--checkpoint-every", "2", "--output-dir", out, "--step-time", "0"],
        # a restarted job: get_last_checkpoint finds checkpoint-4 and trains on to step 6
        ["--steps", "6", "--checkpoint-every", "2", "--output-dir", out, "--step-time", "0"],
    ])
    assert sorted(p.name for p in Path(out).iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert _kinds(events, "worker.start", "step", "ckpt.save.end", "ckpt.load.end") == [
        ("worker.start", None), ("step", 1), ("step", 2), ("ckpt.save.end", 2), ("step", 3), ("step", 4),
        ("ckpt.save.end", 4),
        ("worker.start", None), ("ckpt.load.end", 4), ("step", 5), ("step", 6), ("ckpt.save.end", 6)]
    assert all(e["source"] == "hf" and e["pid"] for e in events)


def test_lightning_callback_reports_steps_saves_and_the_restored_step(tmp_path):
    _need("lightning")
    ckpt = str(tmp_path / "ckpt")
    events = _run("lightning_train", tmp_path, [
        ["--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir", ckpt, "--step-time", "0"],
        # ckpt_path="last": the restarted job resumes from last.ckpt (step 4)
        ["--steps", "6", "--checkpoint-every", "2", "--checkpoint-dir", ckpt, "--step-time", "0"],
    ])
    assert {"epoch=0-step=4.ckpt", "last.ckpt"} <= {p.name for p in Path(ckpt).iterdir()}
    assert _kinds(events, "worker.start", "step", "ckpt.save.start", "ckpt.save.end", "ckpt.load.start",
                  "ckpt.load.end") == [
        ("worker.start", None), ("step", 1), ("step", 2), ("ckpt.save.start", 2), ("ckpt.save.end", 2),
        ("step", 3), ("step", 4), ("ckpt.save.start", 4), ("ckpt.save.end", 4),
        ("worker.start", None), ("ckpt.load.start", 4), ("ckpt.load.end", 4), ("step", 5), ("step", 6),
        ("ckpt.save.start", 6), ("ckpt.save.end", 6)]


def test_the_hooks_write_nothing_without_chaoskit_events(tmp_path, monkeypatch):
    """The callbacks' hooks (stdlib only: the frameworks' Callback is only their base) with CHAOSKIT_EVENTS unset."""
    from chaoskit.integrations._lightning_hooks import Hooks
    from chaoskit.sdk import probe

    monkeypatch.delenv("CHAOSKIT_EVENTS", raising=False)
    monkeypatch.chdir(tmp_path)

    class Trainer:
        global_step = 3

    hooks = Hooks()
    hooks.setup(Trainer, None, "fit")
    hooks.on_load_checkpoint(Trainer, None, {"global_step": 3})
    hooks.on_train_start(Trainer, None)
    hooks.on_train_batch_end(Trainer, None, None, None, 0)
    hooks.on_save_checkpoint(Trainer, None, {})
    hooks.on_exception(Trainer, None, RuntimeError("x"))
    assert probe.emit("step", step=1) is None and list(tmp_path.iterdir()) == []
    assert sys.excepthook is sys.__excepthook__ or "chaoskit" not in getattr(sys.excepthook, "__module__", "")


def test_import_chaoskit_imports_no_framework():
    code = ("import sys, chaoskit, chaoskit.probe; import chaoskit.integrations; "
            "print(sorted(m for m in ('transformers', 'lightning', 'pytorch_lightning', 'torch') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr


def test_the_exception_that_stops_a_rank_is_reported_and_still_printed(tmp_path):
    """What the callbacks install at their first hook: an exception ending the process is a ``detect`` event
    (this rank noticed the failure, e.g. a collective to a dead peer), and Python still prints its traceback."""
    events = tmp_path / "events.jsonl"
    code = ("from chaoskit.integrations._common import report_failures\nreport_failures('hf')\nreport_failures('hf')\n"
            "raise RuntimeError('[/gloo/pair.cc:537] Connection closed by peer\\nsecond line')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "CHAOSKIT_EVENTS": str(events), "RANK": "1", "PYTHONPATH": str(ROOT)})
    assert res.returncode == 1 and "RuntimeError: [/gloo/pair.cc:537] Connection closed by peer" in res.stderr
    (event,) = [json.loads(line) for line in events.read_text().splitlines()]  # installed once
    assert event["kind"] == "detect" and event["rank"] == 1 and event["source"] == "hf"
    assert event["why"] == "RuntimeError: [/gloo/pair.cc:537] Connection closed by peer"
