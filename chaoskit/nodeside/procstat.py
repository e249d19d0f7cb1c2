"""A process's ``/proc/PID/stat``, read one way: the fields after its command name.

Standard library only, Python 3.6+, like every module of :mod:`chaoskit.nodeside`: the node's agent
(:mod:`chaoskit.nodeside.agent`) and the storage io daemon carry its source in front of their own
(:func:`chaoskit.nodeside.nodefs.bundle`). The controller reads its own machine's processes with
:mod:`chaoskit.core.procs` (``core`` and ``nodeside`` are independent layers, so ``core/accounts.py`` could not
import this one): two readers, one per side, by the same rule (tests/test_procs.py). The command name (field 2)
is skipped up to its last ``)``: a name may hold spaces and parentheses of its own.
"""


def proc_stat_fields(pid):
    """The fields of ``/proc/PID/stat`` after the command name, as bytes (``[0]`` the state, ``[1]`` the
    parent's pid, ``[19]`` the start time), or None when it cannot be read (the process is gone)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2:].split()


def proc_start_time(pid):
    """When ``pid`` started, in clock ticks after boot (field 22, as bytes), or None: with the pid it names one
    process, where the pid alone may since name another."""
    fields = proc_stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def proc_state(pid):
    """The state letter of ``pid`` (``"R"``, ``"S"``, ``"Z"`` for a zombie, ...), or None when it cannot be read."""
    fields = proc_stat_fields(pid)
    return fields[0].decode("ascii", "replace") if fields else None
