"""The reference job leaves without torch's interpreter teardown (``plain_train.leave``), and loses nothing by it.

A worker whose training returned frees torch's modules one by one as the interpreter ends: 0.4 s of CPU a worker
here, seconds on a loaded node, at the end of every drill's job. ``leave`` ends it as the interpreter would, less
that: it waits for the threads that are not daemons, runs the exit handlers (the SDK's final checksum is one),
flushes the streams and exits with the training's code. A real child Python here, no torch: what ``leave`` keeps
is the interpreter's, not torch's.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)


def test_leave_waits_for_threads_runs_exit_handlers_flushes_and_keeps_the_code(tmp_path):
    program = textwrap.dedent(f"""
        import atexit, sys, threading, time
        from pathlib import Path
        from chaoskit.workloads.plain_train import leave

        out = Path({str(tmp_path)!r})
        def late():
            time.sleep(0.3)
            (out / "thread").write_text("done")
        threading.Thread(target=late, daemon=False).start()
        atexit.register(lambda: (out / "atexit").write_text("ran after " + (out / "thread").read_text()))
        sys.stdout.write("unflushed line")  # no newline, no flush: still in the buffer at leave()
        leave(3)
        (out / "after").write_text("leave returned")
    """)
    res = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert res.returncode == 3, res.stderr
    assert res.stdout == "unflushed line"
    assert (tmp_path / "atexit").read_text() == "ran after done"  # the thread was waited for, then the handlers ran
    assert not (tmp_path / "after").exists()

