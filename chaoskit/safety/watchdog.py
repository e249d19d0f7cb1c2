"""The on-node dead-man switch behind every lasting fault (standard library only).

Started detached (its own session) on the node *before* the fault is injected::

    python3 watchdog.py LEASE_DIR TTL_S DEADLINE_UNIX -- REVERT_ARGV...

It runs ``REVERT_ARGV`` when the fault's deadline passes **or** when the file
``LEASE_DIR/lease`` has not been touched for ``TTL_S`` seconds (the controller
died or lost its connection). It exits quietly when ``LEASE_DIR/released``
appears (the controller reverted the fault itself). After firing it writes
``LEASE_DIR/fired`` with the reason. It needs nothing from the controller's
connection, so it can be shipped to a remote node as a single file.
"""

import os
import subprocess
import sys
import time

POLL_S = 0.05


def main(argv):
    if "--" not in argv:
        sys.stderr.write(__doc__)
        return 2
    cut = argv.index("--")
    lease_dir, ttl, deadline = argv[0], float(argv[1]), float(argv[2])
    revert = argv[cut + 1 :]
    lease = os.path.join(lease_dir, "lease")
    released = os.path.join(lease_dir, "released")
    with open(os.path.join(lease_dir, "watchdog.pid"), "w") as fh:
        fh.write(str(os.getpid()))
    reason = None
    while reason is None:
        if os.path.exists(released):
            return 0
        now = time.time()
        try:
            age = now - os.stat(lease).st_mtime
        except FileNotFoundError:
            age = float("inf")
        if now >= deadline:
            reason = "deadline"
        elif age > ttl:
            reason = "lease expired (%.1fs without renewal)" % age
        else:
            time.sleep(POLL_S)
    if os.path.exists(released):
        return 0
    rc = subprocess.call(revert, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(lease_dir, "fired"), "w") as fh:
        fh.write("%f %s rc=%d\n" % (time.time(), reason, rc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
