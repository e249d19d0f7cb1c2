"""One run per cluster: the lock refuses a second holder and leaves no file behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from chaoskit.core.errors import InfraError
from chaoskit.safety.lock import ClusterLock

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from chaoskit.safety.lock import ClusterLock
    lock = ClusterLock(Path(sys.argv[1]), "lab-x").acquire()
    print("held", flush=True)
    sys.stdin.readline()
    lock.release()
""")


def test_a_second_run_is_refused_while_one_holds_the_lock(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(InfraError, match=r"cluster 'lab-x' is locked by pid \d+"):
            ClusterLock(tmp_path, "lab-x").acquire()
    finally:
        holder.communicate("\n", timeout=10)
    assert not (tmp_path / "locks" / "lab-x.lock").exists()
    with ClusterLock(tmp_path, "lab-x"):
        assert (tmp_path / "locks" / "lab-x.lock").exists()
    assert not (tmp_path / "locks" / "lab-x.lock").exists()
