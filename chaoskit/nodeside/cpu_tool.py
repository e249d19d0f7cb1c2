"""node.slow's tool: probe the node's cpu cgroups, throttle the ranks, restore them, check nothing is left.

The cgroup helpers (:mod:`chaoskit.nodeside.cgroups`, ``CONTROLLER = "cpu"``) come in front of it: the probe, the
moves in and back and the check are theirs.

``python3 -I -c CGROUP_TOOL probe|throttle NAME SHARE PERIOD STATE PID...|restore STATE|check STATE CGROUP`` on the node.
"""

import json, os, sys


def main():
    def state_of(path):
        check_dir(os.path.dirname(path))  # chaoskit's own folder, or nothing is done
        return path
    op = sys.argv[1]
    if op == "probe":
        probe()
    elif op == "throttle":
        name, share, period, state = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), state_of(sys.argv[5])
        pids = [int(p) for p in sys.argv[6:]]
        version, mount = pick()
        if version is None:
            sys.exit("no cgroup cpu controller on this node")
        quota = share * period // 100
        target = os.path.join(mount, name)
        original = originals(pids, version)
        create_file(state, json.dumps({"version": version, "mount": mount, "cgroup": target, "original": original}))
        os.mkdir(target)
        if version == "v2":
            enable(mount)
            write(os.path.join(target, "cpu.max"), "%d %d" % (quota, period))
        else:
            write(os.path.join(target, "cpu.cfs_period_us"), str(period))
            write(os.path.join(target, "cpu.cfs_quota_us"), str(quota))
        moved = move_in(target, original)
        print(json.dumps({"version": version, "cgroup": target, "quota_us": quota, "period_us": period, "moved": moved}))
    elif op == "restore":
        state = state_of(sys.argv[2])
        text = read_file(state)
        if text is None:
            sys.exit(0)
        info = json.loads(text)
        move_back(info["cgroup"], info["mount"], {int(k): v for k, v in info["original"].items()})
        try:
            os.rmdir(info["cgroup"])
        except FileNotFoundError:
            pass
        os.unlink(state)
    elif op == "check":
        check(state_of(sys.argv[2]), sys.argv[3])


if __name__ == "__main__":
    main()
