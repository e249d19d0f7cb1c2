"""node.slow's tool: probe the node's cpu cgroups, throttle the ranks, restore them, check nothing is left.

The cgroup helpers (:mod:`chaoskit.nodeside.cgroups`, ``CONTROLLER = "cpu"``) come in front of it.

``python3 -I -c CGROUP_TOOL probe|throttle NAME SHARE PERIOD STATE PID...|restore STATE|check STATE CGROUP`` on the node.
"""

import json, os, sys


def main():
    def state_of(path):
        check_dir(os.path.dirname(path))  # chaoskit's own folder, or nothing is done
        return path
    op = sys.argv[1]
    if op == "probe":
        version, mount = pick()
        print(json.dumps({"version": version, "mount": mount, "root": os.geteuid() == 0}))
    elif op == "throttle":
        name, share, period, state = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), state_of(sys.argv[5])
        pids = [int(p) for p in sys.argv[6:]]
        version, mount = pick()
        if version is None:
            sys.exit("no cgroup cpu controller on this node")
        quota = share * period // 100
        target = os.path.join(mount, name)
        original = {}
        for pid in pids:
            try:
                original[pid] = own(pid, version)
            except OSError:
                pass
        create_file(state, json.dumps({"version": version, "mount": mount, "cgroup": target, "original": original}))
        os.mkdir(target)
        if version == "v2":
            with open(os.path.join(mount, "cgroup.subtree_control")) as fh:
                enabled = fh.read().split()
            if "cpu" not in enabled:
                write(os.path.join(mount, "cgroup.subtree_control"), "+cpu")
            write(os.path.join(target, "cpu.max"), "%d %d" % (quota, period))
        else:
            write(os.path.join(target, "cpu.cfs_period_us"), str(period))
            write(os.path.join(target, "cpu.cfs_quota_us"), str(quota))
        moved = []
        for pid in original:
            try:
                write(os.path.join(target, "cgroup.procs"), str(pid))
                moved.append(pid)
            except OSError:
                pass
        print(json.dumps({"version": version, "cgroup": target, "quota_us": quota, "period_us": period, "moved": moved}))
    elif op == "restore":
        state = state_of(sys.argv[2])
        text = read_file(state)
        if text is None:
            sys.exit(0)
        info = json.loads(text)
        target, mount = info["cgroup"], info["mount"]
        original = {int(k): v for k, v in info["original"].items()}
        fallback = next(iter(original.values()), "/")
        for _ in range(20):
            left = procs(target)
            if not left:
                break
            for pid in left:
                back = os.path.join(mount, original.get(pid, fallback).lstrip("/"))
                try:
                    write(os.path.join(back, "cgroup.procs"), str(pid))
                except OSError:
                    write(os.path.join(mount, "cgroup.procs"), str(pid))
        try:
            os.rmdir(target)
        except FileNotFoundError:
            pass
        os.unlink(state)
    elif op == "check":
        state, target = state_of(sys.argv[2]), sys.argv[3]
        left = os.path.exists(target) or os.path.lexists(state)
        print("cgroup %s is still there" % target if left else "")


if __name__ == "__main__":
    main()
