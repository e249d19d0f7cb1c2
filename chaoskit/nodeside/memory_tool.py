"""mem.oom's tool: probe the node's memory cgroups, cap the ranks' memory, restore them, check nothing is left.

The cgroup helpers (:mod:`chaoskit.nodeside.cgroups`, ``CONTROLLER = "memory"``) come in front of it: the probe, the
moves in and back, the check and the command line (:func:`~chaoskit.nodeside.cgroups.tool_main`) are theirs.

``python3 -I -c MEMORY_TOOL probe | cap NAME LIMIT_BYTES STATE BALLAST_DIR PID... | restore STATE | check STATE CGROUP``.
"""

import json, os, signal, sys, time


def main():
    tool_main(cap, uncap)


def ballast_of(state, ballast):
    return inside(os.path.dirname(state), ballast)


def cap(args):
    """``cap NAME LIMIT_BYTES STATE BALLAST_DIR PID...``: the pids into a new memory cgroup of that limit."""
    name, limit, state = args[0], int(args[1]), state_file(args[2])
    ballast = ballast_of(state, args[3])
    pids = [int(p) for p in args[4:]]
    version, mount = controller()
    original = originals(pids, version)
    if not original:
        sys.exit("the rank's processes are gone")
    parent = "/" if version == "v2" else original[pids[0]] if pids[0] in original else "/"
    target = os.path.join(mount, parent.lstrip("/"), name)
    create_file(state, json.dumps({"version": version, "mount": mount, "cgroup": target, "original": original,
                                   "ballast": ballast}))
    os.mkdir(target)
    if version == "v2":
        enable(mount)
        write(os.path.join(target, "memory.max"), str(limit))
        if os.path.exists(os.path.join(target, "memory.swap.max")):
            write(os.path.join(target, "memory.swap.max"), "0")
    else:
        write(os.path.join(target, "memory.limit_in_bytes"), str(limit))
        if os.path.exists(os.path.join(target, "memory.memsw.limit_in_bytes")):
            write(os.path.join(target, "memory.memsw.limit_in_bytes"), str(limit))
    t_moved = time.time()  # the cap binds the ranks from their move on: the kernel may kill one before the ballast starts
    moved = move_in(target, original)
    adj = {}
    try:
        write("/proc/self/oom_score_adj", "-999")  # the ballast (same credentials) can put itself last
    except OSError:
        for pid in moved:  # no CAP_SYS_RESOURCE (a container): put the rank first instead, undone at restore
            try:
                with open("/proc/%d/oom_score_adj" % pid) as fh:
                    adj[pid] = fh.read().strip()
                write("/proc/%d/oom_score_adj" % pid, "1000")
            except OSError:
                pass
    write_file(state, json.dumps({"version": version, "mount": mount, "cgroup": target, "original": original,
                                  "ballast": ballast, "oom_score_adj": adj}))
    print(json.dumps({"version": version, "cgroup": target, "limit_bytes": limit, "moved": moved,
                      "victim_first": sorted(adj), "t": t_moved}))


def uncap(state, info):
    """``restore``'s work: the ballast stopped, the ranks' ``oom_score_adj`` back, every process back to its own
    cgroup, the fault's cgroup and the ballast's folder removed."""
    target, mount, ballast = info["cgroup"], info["mount"], ballast_of(state, info["ballast"])
    make_dirs(os.path.dirname(state), ballast)  # made now, a ballast not started yet never starts
    touch_file(os.path.join(ballast, "stop"))
    try:  # the ballast's pid and start time as it wrote them: a pid that names another process now is not signalled
        words = (read_file(os.path.join(ballast, "started")) or "").split()
        pid, start = int(words[1]), int(words[2])
        with open("/proc/%d/stat" % pid) as fh:
            now = int(fh.read().rsplit(")", 1)[1].split()[19])
        if now == start:
            os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError, IndexError):
        pass  # gone, or a started file of no start time: the stop file ends a ballast by itself
    for pid, value in info.get("oom_score_adj", {}).items():
        try:
            write("/proc/%s/oom_score_adj" % pid, value)
        except OSError:
            pass
    move_back(target, mount, {int(k): v for k, v in info["original"].items()})
    for _ in range(50):
        try:
            os.rmdir(target)
            break
        except FileNotFoundError:
            break
        except OSError:
            time.sleep(0.1)  # a killed ballast still exiting
    for leftover in ("started", "stop", "exited"):
        try:
            os.unlink(os.path.join(ballast, leftover))
        except OSError:
            pass
    try:
        os.rmdir(ballast)
    except OSError:
        pass


if __name__ == "__main__":
    main()
