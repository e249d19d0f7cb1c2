"""What the node-side cgroup tools share (:mod:`.memory_tool`, :mod:`.cpu_tool`): finding a controller's hierarchy
and a process's cgroup in it, for ``CONTROLLER`` (``cpu``, ``memory``), which the controller sets in front of it:
the v2 hierarchy when it has that controller, else the v1 one.
"""

import os


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
