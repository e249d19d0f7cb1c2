"""Programs that run on a node: standard library only, Python 3.6+, never installed there.

Each module here is a real, linted file. The controller sends its source with ``python3 -I -c`` (so
nothing of the node's ``sys.path``, current folder or ``PYTHON*`` is imported), with
:mod:`chaoskit.nodeside.nodefs` and any shared module (:mod:`.jobscope`, :mod:`.cgroups`) in front of it
(:func:`chaoskit.nodeside.nodefs.bundle`) and the constants it names set there. A program's work is in its
``main()``, which runs when the source runs as ``-c`` (``__name__ == "__main__"``); importing it here, on
the controller, runs nothing. This package imports nothing of chaoskit: it is the lowest layer (the agent and
the watchdog import their siblings here, on the controller only: on a node those come bundled in front).

- :mod:`.nodefs`: chaoskit's state folder on a node and the files made there (in front of every program here);
- :mod:`.agent`: the agent the SSH and docker transports talk to (:mod:`chaoskit.cluster.transports.channel`
  sends it); :mod:`.watchdog`: the lease watchdog behind every lasting fault (:mod:`chaoskit.safety.lease`);
- :mod:`.jobscope`: which processes are the drilled job's (the node's agent and the crash loop share it);
- :mod:`.procstat`: a process's ``/proc/PID/stat`` on a node (the agent carries it; the controller's own reader is
  :mod:`chaoskit.core.procs`);
- :mod:`.crashloop` (``gpu.fail``), :mod:`.xid_writer` (``gpu.xid``), :mod:`.memory_tool` and
  :mod:`.ballast` (``mem.oom``), :mod:`.cpu_tool` (``node.slow``), :mod:`.cgroups` (what those two share),
  :mod:`.storage_tool` (``storage.*``), :mod:`.cont_if_same` (``process.hang``'s revert),
  :mod:`.netem_check` (does the kernel have netem), :mod:`.inproc_tool` (``inproc.*``'s orders in the node's
  channel folder).
"""

import os

__all__ = ["source"]


def source(name: str) -> str:
    """The text of the node program ``name`` (this package's ``<name>.py``)."""
    with open(os.path.join(os.path.dirname(__file__), name + ".py"), encoding="utf-8") as fh:
        return fh.read()
