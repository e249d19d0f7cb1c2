"""process.hang's revert.

The hang's revert, run as ``python3 -I -c CONT_IF_SAME PID START_TIME``: SIGCONT to ``PID`` only while
``/proc/PID/stat`` field 22 is still ``START_TIME`` (a gone or reused pid is left alone, exit 0: nothing of
ours is stopped). The pidfd is opened before the check, so the signal reaches the process that was checked.
"""

import os, signal, sys


def main():
    pid, start = int(sys.argv[1]), sys.argv[2]
    fd = None
    if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            sys.exit(0)
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            stat = fh.read()
    except OSError:
        sys.exit(0)
    if stat[stat.rfind(b")") + 2:].split()[19].decode() != start:
        sys.exit(0)
    if fd is not None:
        signal.pidfd_send_signal(fd, signal.SIGCONT)
    else:
        os.kill(pid, signal.SIGCONT)


if __name__ == "__main__":
    main()
