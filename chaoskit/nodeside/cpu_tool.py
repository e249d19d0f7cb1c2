"""node.slow's tool: probe the node's cpu cgroups, throttle the ranks, restore them, check nothing is left.

The cgroup helpers (:mod:`chaoskit.nodeside.cgroups`, ``CONTROLLER = "cpu"``) come in front of it: the probe, the
moves in and back, the check and the command line (:func:`~chaoskit.nodeside.cgroups.tool_main`) are theirs.

``python3 -I -c CGROUP_TOOL probe|throttle NAME SHARE PERIOD STATE PID...|restore STATE|check STATE CGROUP`` on the node.
"""

import json, os


def main():
    tool_main(throttle, unthrottle)


def throttle(args):
    """``throttle NAME SHARE PERIOD STATE PID...``: the pids into a new cpu cgroup with ``SHARE`` % of one cpu."""
    name, share, period, state = args[0], int(args[1]), int(args[2]), state_file(args[3])
    pids = [int(p) for p in args[4:]]
    version, mount = controller()
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


def unthrottle(state, info):
    """``restore``'s work: every process back to its own cgroup, the fault's cgroup removed."""
    move_back(info["cgroup"], info["mount"], {int(k): v for k, v in info["original"].items()})
    try:
        os.rmdir(info["cgroup"])
    except FileNotFoundError:
        pass


if __name__ == "__main__":
    main()
