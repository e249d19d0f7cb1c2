"""What the node-side cgroup tools share (:mod:`.memory_tool`, :mod:`.cpu_tool`): finding a controller's hierarchy
and a process's cgroup in it, for ``CONTROLLER`` (``cpu``, ``memory``), which the controller sets in front of it:
the v2 hierarchy when it has that controller, else the v1 one. :func:`tool_main` is both tools' command line.
"""

import json
import os
import sys
import time


def tool_main(act, restore):
    """A cgroup tool's command line: ``probe``; ``ACT ARGS...`` (``act(args)``, whose function's name is the
    operation: ``throttle``, ``cap``); ``restore STATE`` (``restore(state, info)``, ``info`` the state file's
    JSON, the file removed after; no file: nothing was done, nothing to undo); ``check STATE CGROUP``."""
    op, args = sys.argv[1], sys.argv[2:]
    if op == "probe":
        probe()
    elif op == act.__name__:
        act(args)
    elif op == "restore":
        state = state_file(args[0])
        text = read_file(state)
        if text is None:
            sys.exit(0)
        restore(state, json.loads(text))
        os.unlink(state)
    elif op == "check":
        check(state_file(args[0]), args[1])


def state_file(path):
    """``path``, a fault's state file, once its folder is checked to be chaoskit's own (or nothing is done)."""
    check_dir(os.path.dirname(path))
    return path


def controller():
    """(version, mount) of ``CONTROLLER``'s hierarchy (:func:`pick`); the tool exits saying so when there is none."""
    version, mount = pick()
    if version is None:
        sys.exit("no cgroup %s controller on this node" % CONTROLLER)
    return version, mount


def mounts():
    v1 = v2 = None
    with open("/proc/self/mounts") as fh:
        for line in fh:
            dev, path, fs, opts = line.split()[:4]
            if fs == "cgroup2" and v2 is None:
                v2 = path
            if fs == "cgroup" and CONTROLLER in opts.split(",") and v1 is None:
                v1 = path
    return v1, v2


def pick():
    v1, v2 = mounts()
    if v2 is not None:
        try:
            with open(os.path.join(v2, "cgroup.controllers")) as fh:
                if CONTROLLER in fh.read().split():
                    return "v2", v2
        except OSError:
            pass
    if v1 is not None:
        return "v1", v1
    return None, None


def own(pid, version):
    with open("/proc/%d/cgroup" % pid) as fh:
        for line in fh:
            num, ctrl, path = line.rstrip("\n").split(":", 2)
            if version == "v2" and num == "0":
                return path
            if version == "v1" and CONTROLLER in ctrl.split(","):
                return path
    return "/"


def write(path, text):
    with open(path, "w") as fh:
        fh.write(text)


def procs(path):
    try:
        with open(os.path.join(path, "cgroup.procs")) as fh:
            return [int(x) for x in fh.read().split()]
    except OSError:
        return []


def probe():
    """``probe``: print the controller's hierarchy (version, mount) and whether this program runs as root."""
    version, mount = pick()
    print(json.dumps({"version": version, "mount": mount, "root": os.geteuid() == 0}))


def originals(pids, version):
    """pid -> its cgroup now, for the pids still there."""
    original = {}
    for pid in pids:
        try:
            original[pid] = own(pid, version)
        except OSError:
            pass
    return original


def enable(mount):
    """On v2: the controller enabled for the root's children (``cgroup.subtree_control``)."""
    with open(os.path.join(mount, "cgroup.subtree_control")) as fh:
        enabled = fh.read().split()
    if CONTROLLER not in enabled:
        write(os.path.join(mount, "cgroup.subtree_control"), "+" + CONTROLLER)


def move_in(target, pids):
    """Move each pid into ``target``; the pids moved (one gone meanwhile is not)."""
    moved = []
    for pid in pids:
        try:
            write(os.path.join(target, "cgroup.procs"), str(pid))
            moved.append(pid)
        except OSError:
            pass
    return moved


def move_back(target, mount, original):
    """Every process left in ``target`` back to its own cgroup (``original``: pid -> path; a child it forked
    meanwhile goes where its parent came from), else to the root; a few passes, for processes forking meanwhile."""
    fallback = next(iter(original.values()), "/")
    for _ in range(50):
        left = procs(target)
        if not left:
            return
        for pid in left:
            back = os.path.join(mount, original.get(pid, fallback).lstrip("/"))
            try:
                write(os.path.join(back, "cgroup.procs"), str(pid))
            except OSError:
                try:
                    write(os.path.join(mount, "cgroup.procs"), str(pid))
                except OSError:
                    pass
        time.sleep(0.02)


def check(state, target):
    """``check``: print what is left of the fault (its cgroup, its state file), or an empty line."""
    left = os.path.exists(target) or os.path.lexists(state)
    print("cgroup %s is still there" % target if left else "")
