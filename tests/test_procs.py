"""The controller's /proc reader (core/procs.py) and the node programs' (nodeside/procstat.py): what each answers
about real processes started here, and that the two read ``stat`` alike (two readers, one per side, because
``core`` and ``nodeside`` are independent layers of the import contract)."""

from __future__ import annotations

import os
import subprocess
import sys

from chaoskit.core import procs
from chaoskit.core.accounts import processes_of
from chaoskit.nodeside import procstat

# a command name with a space and parentheses of its own: the name is read up to stat's last ')'
ODD_NAME = "a (b) c"


def _sleeper(name: str | None = None) -> subprocess.Popen:
    code = "import sys, time; sys.stdout.write('up\\n'); sys.stdout.flush(); time.sleep(60)"
    if name:
        code = f"import ctypes; ctypes.CDLL(None).prctl(15, {name.encode()!r}); " + code  # PR_SET_NAME
    proc = subprocess.Popen([sys.executable, "-c", code, "marker-procs-test"], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"up\n"
    return proc


def test_a_process_started_here_is_listed_with_its_command_line_owner_name_and_state():
    proc = _sleeper(ODD_NAME)
    try:
        assert proc.pid in procs.pids() and os.getpid() in procs.pids()
        assert procs.cmdline(proc.pid).split(b"\0")[-2] == b"marker-procs-test"
        assert procs.owner(proc.pid) == os.getuid()
        assert procs.name(proc.pid) == ODD_NAME
        assert procs.state(proc.pid) in ("S", "R")
        assert int(procs.stat_fields(proc.pid)[1]) == os.getpid()  # the parent's pid, past the odd name
        assert b"PATH=" in procs.environ(proc.pid)
        assert proc.pid in processes_of(os.getuid())
    finally:
        proc.kill()
        proc.wait()
    gone = proc.pid
    assert procs.cmdline(gone) is None and procs.owner(gone) is None and procs.state(gone) is None
    assert procs.stat_fields(gone) is None and procs.start_time(gone) is None and gone not in processes_of(os.getuid())


def test_a_zombie_reads_Z_and_the_controller_and_node_readers_agree():
    proc = _sleeper(ODD_NAME)
    try:
        for pid in (os.getpid(), proc.pid):
            ours, node = procs.stat_fields(pid), procstat.proc_stat_fields(pid)
            assert [ours[i] for i in (1, 2, 3, 19)] == [node[i] for i in (1, 2, 3, 19)]  # parent, group, session, start
            assert procs.start_time(pid) == procstat.proc_start_time(pid)
        proc.kill()
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped: a zombie
        assert procs.state(proc.pid) == procstat.proc_state(proc.pid) == "Z"
    finally:
        proc.kill()
        proc.wait()
