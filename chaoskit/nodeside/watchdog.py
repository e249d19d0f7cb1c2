"""The on-node dead-man switch behind every lasting fault (standard library only).

Started detached (its own session) on the node *before* the fault is injected, as one program with
:mod:`chaoskit.nodeside.nodefs` in front of it (:func:`watchdog_source`) and ``python3 -I``::

    python3 -I watchdog.py LEASE_DIR TTL_S DEADLINE_UNIX

It runs the revert, the JSON list of argv in ``LEASE_DIR/revert.json`` (written by the controller or the
agent before it starts: a command line is readable by every user of the node, through ``ps``, and a
revert may carry a secret, e.g. a BMC's password in ``ipmitool -P``), when the fault's deadline passes **or** when the file
``LEASE_DIR/lease`` has not been touched for ``TTL_S`` seconds (the controller
died or lost its connection). It exits quietly when ``LEASE_DIR/released``
appears (the controller reverted the fault itself). After firing it writes
``LEASE_DIR/fired`` with the reason. It needs nothing from the controller's
connection, so it can be shipped to a remote node as a single file.

``LEASE_DIR`` must be a folder of chaoskit's own (:func:`~chaoskit.nodeside.nodefs.check_dir`: the
effective user's, not a link, writable by nobody else); the watchdog refuses any other, and makes
its files there without following links.
"""

import json
import os
import stat
import subprocess
import sys
import time

try:
    StateDirError  # noqa: B018 - defined when nodefs' source was put in front of this one (watchdog_source)
except NameError:  # imported on the controller
    from chaoskit.nodeside.nodefs import REVERT_FILE, StateDirError, bundle, check_dir, create_file, read_file, write_file

POLL_S = 0.05
USAGE = "usage: python3 -I watchdog.py LEASE_DIR TTL_S DEADLINE_UNIX   (the revert's argv in LEASE_DIR/revert.json)\n"


def watchdog_source():
    """On the controller: the watchdog as one self-contained program (nodefs' source, then this file's)."""
    with open(__file__, encoding="utf-8") as fh:
        return bundle(fh.read())


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(USAGE)
        return 2
    lease_dir, ttl, deadline = argv[0], float(argv[1]), float(argv[2])
    try:
        check_dir(lease_dir)
        text = read_file(os.path.join(lease_dir, REVERT_FILE), 1 << 16)
    except (StateDirError, OSError) as exc:
        sys.stderr.write("chaoskit watchdog: %s\n" % exc)
        return 2
    try:
        revert = json.loads(text) if text is not None else None
    except ValueError:
        revert = None
    if not (isinstance(revert, list) and revert and all(isinstance(a, str) for a in revert)):
        sys.stderr.write("chaoskit watchdog: %s is not a JSON list of argv\n" % os.path.join(lease_dir, REVERT_FILE))
        return 2
    lease = os.path.join(lease_dir, "lease")
    released = os.path.join(lease_dir, "released")
    create_file(os.path.join(lease_dir, "watchdog.pid"), str(os.getpid()))
    reason = None
    while reason is None:
        if os.path.lexists(released):
            return 0
        now = time.time()
        try:
            st = os.lstat(lease)
            age = now - st.st_mtime if stat.S_ISREG(st.st_mode) else float("inf")
        except FileNotFoundError:
            age = float("inf")
        if now >= deadline:
            reason = "deadline"
        elif age > ttl:
            reason = "lease expired (%.1fs without renewal)" % age
        else:
            time.sleep(POLL_S)
    if os.path.lexists(released):
        return 0
    rc = subprocess.call(revert, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/")
    write_file(os.path.join(lease_dir, "fired"), "%f %s rc=%d\n" % (time.time(), reason, rc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
