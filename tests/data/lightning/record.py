"""How tests/data/lightning/kill-rank1.jsonl was recorded (run by hand, once, with the real lightning 2.6.6):
examples/frameworks/lightning_train.py run unchanged (--no-callback) under torchrun on two local workers, read as
chaoskit's job reader reads it (workloads/launch.py: each line with the moment it arrived), rank 1 SIGKILLed a
moment after the job's step-20 checkpoint appeared; torchrun restarts both workers and fit(ckpt_path="last")
resumes. Each line of the recording: {"t": seconds since the start, "line": ...}; the first, {"meta": ...}, says
when rank 1 was killed and which checkpoints the folder held then.

    python tests/data/lightning/record.py tests/data/lightning/kill-rank1.jsonl
"""

from __future__ import annotations

import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from chaoskit.core.lines import terminal_lines

ROOT = Path(__file__).resolve().parents[3]


def main(out: str) -> int:
    work = Path(tempfile.mkdtemp(prefix="lightning-record-"))  # removed at the end, torchrun's own files included
    try:
        return _record(out, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _record(out: str, work: Path) -> int:
    ckpt = work / "ckpt"
    ckpt.mkdir()
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
            "--monitor-interval", "0.1", "--log-dir", str(work / "torchelastic"), str(ROOT / "examples" / "frameworks" / "lightning_train.py"), "--no-callback",
            "--steps", "40", "--checkpoint-every", "10", "--step-time", "0.2", "--checkpoint-dir", str(ckpt)]
    mark = f"LIGHTNING_RECORD={os.getpid()}".encode()  # this recording's workers, and only they, carry it
    env = {**os.environ, "LIGHTNING_RECORD": str(os.getpid()), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    t0 = time.time()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    lines: list[dict] = []
    meta: dict = {}

    def killer() -> None:
        while not any(p.name.endswith("step=20.ckpt") for p in ckpt.iterdir()):
            time.sleep(0.05)
        time.sleep(0.5)
        for pid in (p.name for p in Path("/proc").iterdir() if p.name.isdigit()):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if mark in environ and b"LOCAL_RANK=1" in environ and b"torch.distributed.run" not in cmdline:
                meta.update(t_fault=time.time() - t0, checkpoints=sorted(p.name for p in ckpt.iterdir()))
                os.kill(int(pid), signal.SIGKILL)
                return

    threading.Thread(target=killer, daemon=True).start()
    for _, got in terminal_lines(proc.stdout):
        t = time.time() - t0
        lines.extend({"t": round(t, 4), "line": line.decode(errors="replace")} for line in got)
    proc.wait()
    meta.update(exit=proc.returncode, checkpoints_after=sorted(p.name for p in ckpt.iterdir()))
    with open(out, "w") as f:
        f.write(json.dumps({"meta": meta}) + "\n")
        for entry in lines:
            f.write(json.dumps(entry) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
