"""mem.oom's ballast: joins the capped cgroup and fills it (``BALLAST_NAME``, its process name, comes in front).

``python3 -I -c BALLAST CGROUP_PROCS DIR DURATION_S RANK_PID...``: joins the cgroup, fills it a MiB at a time
until every rank process is gone (or ``DIR/stop``, or the deadline); writes ``DIR/started`` and ``DIR/exited``.
"""

import ctypes, os, sys, time


def main():
    try:
        ctypes.CDLL(None).prctl(15, BALLAST_NAME.encode(), 0, 0, 0)  # PR_SET_NAME: the kmsg probe knows the ballast's kill is not the rank's
    except (OSError, AttributeError):
        pass
    procs, d, deadline = sys.argv[1], sys.argv[2], time.time() + float(sys.argv[3])
    ranks = [int(p) for p in sys.argv[4:]]
    check_dir(os.path.dirname(d))
    os.mkdir(d, 0o700)
    with open(procs, "w") as fh:
        fh.write(str(os.getpid()))
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("-999")
    except OSError:
        pass  # no CAP_SYS_RESOURCE: the cap raised the rank's own score instead
    def alive(pid):
        try:
            with open("/proc/%d/stat" % pid) as fh:
                return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except (OSError, IndexError):
            return False
    with open("/proc/self/stat") as fh:
        start = int(fh.read().rsplit(")", 1)[1].split()[19])
    create_file(os.path.join(d, "started"), "%f %d %d\n" % (time.time(), os.getpid(), start))
    held, reason = [], None
    while reason is None:
        if os.path.exists(os.path.join(d, "stop")):
            reason = "stopped"
        elif time.time() >= deadline:
            reason = "deadline"
        elif not any(alive(p) for p in ranks):
            reason = "rank gone"
        elif len(held) < 65536:
            held.append(b"\x01" * (1 << 20))  # written, not just reserved: every page is charged to the cgroup
        else:
            time.sleep(0.05)
    del held
    create_file(os.path.join(d, "exited"), "%f %s\n" % (time.time(), reason))


if __name__ == "__main__":
    main()
