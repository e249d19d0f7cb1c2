"""The on-node agent of the SSH transport (standard library only, Python 3.6+).

Nothing is installed on the node: the controller opens one SSH exec channel
running :data:`BOOT` (``python3 -u -c ...``), sends this file's source over it,
and from then on every command travels over that one channel. Opening a new SSH
session costs ~100 ms on the server even over a reused connection; a request
written to this already running process comes back in well under a millisecond.

Protocol, one JSON object per line in each direction::

    -> {"id": 7, "op": "run", "argv": ["ip", "link", "set", "dev", "eth0", "down"], "timeout": 10}
    <- {"id": 7, "ok": true, "rc": 0, "stdout": "", "stderr": "", "t": 1767225600.123}
    <- {"id": 8, "ok": false, "error": "pid 42 is not a process of the drilled job (run id r1, uid 1000); not signalled"}

The first line the agent writes is ``{"id": 0, "ok": true, "hello": VERSION, ...}``.
Requests run concurrently (cheap ones inline, commands on threads), so replies
may come out of order; ``id`` pairs them. Every command has a deadline the agent
enforces itself (it kills the command's process group and answers ``rc`` 124).
EOF on stdin ends the agent once in-flight requests are answered; processes it
started detached (lease watchdogs) live on. So does hearing nothing for
``CHAOSKIT_IDLE_EXIT_S`` seconds (the controller sends a ``ping`` every few
seconds): a controller that died behind a connection that never closed (a cut
management link, a lost host) leaves no agent behind. No shell is ever involved:
``argv`` is executed as given.

A *stream* (``follow``: a file's lines; ``kmsg``: the kernel log's records) answers many times under its request's id, each message with
``"more": true``, until it is cancelled (``{"op": "cancel", "stream": ID}``) or stdin ends;
its last message has no ``more``.

Times the agent reports are the node's clock (``time.time()`` there, plus the skew a test
may set with ``{"op": "skew", "seconds": S}``: one machine cannot give a lab node a clock
of its own, so the tests of clock correction shift the agent's instead).

Fed a single request followed by EOF, the same program serves one command per
exec, which is the transport's fallback when a persistent agent cannot be kept.

Files: the agent keeps its state in one folder (:mod:`chaoskit.nodeside.nodefs`, whose source the controller
puts in front of this one, with ``CHAOSKIT_WORKDIR``, the inventory's ``workdir`` or ``None``): made and
checked when the agent starts, named in its hello (``state_dir``, or ``state_error`` saying why it was
refused). ``write``, ``touch``, ``rmtree`` and ``watchdog`` act only inside it, without following links;
with a refused folder they fail with that reason.
"""

import json
import os
import select
import signal
import stat
import subprocess
import sys
import threading
import time

try:
    StateDirError  # noqa: B018 - defined when the controller put nodefs' (jobscope's, procstat's) source in front of this one
except NameError:  # imported on the controller (tests, BOOT)
    from chaoskit.nodeside.nodefs import StateDirError, make_dirs, read_file, remove_tree, state_dir, touch_file, write_file
    from chaoskit.nodeside.nodefs import inside as _inside_dir
    from chaoskit.nodeside.jobscope import job_marks, job_owns, uid_of  # noqa: I001 - bundled after nodefs on a node
    from chaoskit.nodeside.procstat import proc_start_time, proc_stat_fields

    CHAOSKIT_WORKDIR = None
    CHAOSKIT_IDLE_EXIT_S = None
else:
    _inside_dir = inside  # noqa: F821 - nodefs' ``inside``; the agent's own ``inside`` would be too vague a name

VERSION = 1
MAX_OUTPUT = 1 << 20

BOOT = (
    "import sys;b=sys.stdin.buffer;n=int(b.readline());"
    "exec(compile(b.read(n),'chaoskit-agent','exec'))"
)
"""What the controller runs with ``python3 -I -u -c``: read a byte count, then that much source, and run it.
(``-I``: nothing from the current folder, the user's site folder or ``PYTHON*`` is imported as root.)"""


class OpError(Exception):
    """An op's refusal or failure, answered ``ok: false``; ``gone``: the process it named is no more (it exited, or
    its pid names another now), so nothing was done to it."""

    def __init__(self, message, gone=False):
        Exception.__init__(self, message)
        self.gone = gone


_SKEW = [0.0]
_STOP = threading.Event()
"""Set when stdin ends: streams finish."""
_STREAMS = {}
_STREAMS_LOCK = threading.Lock()


def now():
    """The node's clock as this agent reports it."""
    return time.time() + _SKEW[0]


def _own_netns():
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return None


def _netns_of(pid):
    try:
        return os.readlink("/proc/%d/ns/net" % pid)
    except OSError:
        return None


ENV_KEYS = frozenset((
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID",
))
ENV_PREFIXES = ("TORCHELASTIC_", "CHAOSKIT_")
"""The only environment variables of a process that leave the node (``procs``): what chaoskit reads.
Kept equal to chaoskit.cluster.transports.api.PROC_ENV_KEYS/PREFIXES (a test checks)."""


def _proc(pid):
    base = "/proc/%d" % pid
    try:
        with open(base + "/stat", "rb") as fh:
            stat = fh.read().decode("utf-8", "replace")
        with open(base + "/cmdline", "rb") as fh:  # any user can make theirs long: only the first CMDLINE_MAX bytes
            cmdline = fh.read(CMDLINE_MAX).replace(b"\0", b" ").decode("utf-8", "replace").strip()
        try:
            with open(base + "/environ", "rb") as fh:
                raw = fh.read(ENVIRON_MAX)
        except OSError:
            raw = b""
    except (OSError, ValueError):
        return None
    rest = stat[stat.rfind(")") + 2:].split()
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    try:
        start = int(rest[19])
    except (IndexError, ValueError):
        return None
    return {"pid": pid, "ppid": int(rest[1]), "cmdline": cmdline, "env": env, "state": rest[0],
            "uid": uid_of(pid), "start": start}


CMDLINE_MAX = 4096
"""The bytes of a command line a node reads and sends (``procs``, ``watch``): enough for any regex of a scenario."""
ENVIRON_MAX = 1 << 20
"""The bytes of a process's environment a node reads (it keeps only ENV_KEYS/ENV_PREFIXES)."""
ENV_VALUE_MAX = 256
"""The longest environment value, and key, that leaves the node."""


def _wire(info):
    """A process as it leaves the node: only the environment keys chaoskit reads, each value capped."""
    out = dict(info)
    out["env"] = dict((k, v[:ENV_VALUE_MAX]) for k, v in info["env"].items()
                      if len(k) <= ENV_VALUE_MAX and (k in ENV_KEYS or k.startswith(ENV_PREFIXES)))
    return out


def _in_node(info, scope):
    """Whether the process belongs to the node: its netns and/or its CHAOSKIT_SCOPE token."""
    if info is None:
        return False
    scope = scope or {}
    if scope.get("netns") and _netns_of(info["pid"]) != _own_netns():
        return False
    token = scope.get("env")
    if token and info["env"].get("CHAOSKIT_SCOPE") != token:
        return False
    return True


def _owned(info, job):
    """Same uid and Slurm job as the drilled job (:func:`chaoskit.nodeside.jobscope.job_owns`)."""
    return job_owns(info["uid"], info["env"], job)


def _carries(info, job):
    """Whether the process itself carries every mark of the drilled job (:func:`chaoskit.nodeside.jobscope.job_marks`)."""
    return job_marks(info["uid"], info["env"], job)


def _child_procs(pid):
    """The live processes whose parent is ``pid``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = proc_stat_fields(int(name))
        try:
            if fields is None or int(fields[1]) != pid:
                continue
        except (ValueError, IndexError):
            continue
        info = _proc(int(name))
        if info is not None:
            out.append(info)
    return out


def _in_scope(info, scope):
    """``scope``: {"netns": bool, "env": token or None,
    "job": {"run_id", "uid", "slurm_job", "pending", "agents": [[pid, start], ...]} or None}.

    True when the process belongs to the node and, with ``job``, to the drilled job: it carries the job's
    marks, or it is the torchrun agent of a worker that does (its parent, same uid and Slurm job: torchrun
    sets the run id for its workers only), or an agent the controller saw so before (``agents``)."""
    if not _in_node(info, scope):
        return False
    job = (scope or {}).get("job")
    if not job:
        return True
    if _carries(info, job):
        return True
    if job.get("pending") or not _owned(info, job):
        return False
    if _known_agent(info, job):
        return True
    return any(_carries(c, job) and c["env"].get("RANK", "").isdigit() for c in _child_procs(info["pid"]))


def _known_agent(info, job):
    """One of the job's torchrun agents the controller saw before (its pid and start time on this node)."""
    return [info["pid"], info["start"]] in (job.get("agents") or [])


def _pidfd(pid):
    """A pidfd of ``pid`` where the kernel and Python have them (it names that process even if the pid is reused)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None or not hasattr(signal, "pidfd_send_signal"):
        return None
    try:
        return opener(pid)
    except OSError:
        return None


def op_ping(req):
    return {"t": now(), "pid": os.getpid()}


def op_run(req):
    argv = [str(a) for a in req["argv"]]
    timeout = float(req.get("timeout", 30))
    data = req.get("stdin")
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        return {"rc": 127, "stdout": "", "stderr": "%s: %s" % (argv[0], exc.strerror), "t": now(), "timed_out": False}
    timed_out = False
    try:
        out, err = proc.communicate(data.encode() if data is not None else None, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        out, err = proc.communicate()
    t = now()
    return {
        "rc": 124 if timed_out else proc.returncode,
        "stdout": out[:MAX_OUTPUT].decode("utf-8", "replace"),
        "stderr": err[:MAX_OUTPUT].decode("utf-8", "replace"),
        "t": t,
        "timed_out": timed_out,
    }


_children = []
_children_lock = threading.Lock()


def _reap():
    with _children_lock:
        _children[:] = [p for p in _children if p.poll() is None]


def _spawn(argv, cwd=None):
    proc = subprocess.Popen(
        [str(a) for a in argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        cwd=cwd,
    )
    with _children_lock:
        _children.append(proc)  # polled later so a finished one does not linger as a zombie
    return proc.pid


def op_spawn(req):
    try:
        return {"pid": _spawn(req["argv"], req.get("cwd")), "t": now()}
    except OSError as exc:
        raise OpError("%s: %s" % (req["argv"][0], exc.strerror))


_STATE = {"dir": None, "error": "the agent has not checked its state folder yet"}


def _init_state(wanted):
    try:
        _STATE["dir"], _STATE["error"] = state_dir(wanted), None
    except StateDirError as exc:
        _STATE["dir"], _STATE["error"] = None, str(exc)
    except OSError as exc:
        _STATE["dir"], _STATE["error"] = None, "chaoskit's state folder: %s" % exc


def _state_path(path):
    """``path``, which must lie inside the checked state folder."""
    if _STATE["dir"] is None:
        raise OpError(_STATE["error"])
    try:
        return _inside_dir(_STATE["dir"], path)
    except StateDirError as exc:
        raise OpError(str(exc))


def _state_parent(path):
    """``path`` inside the state folder, with the folders above it made (0700, checked)."""
    path = _state_path(path)
    parent = os.path.dirname(path)
    if parent != _STATE["dir"]:
        try:
            make_dirs(_STATE["dir"], parent)
        except (StateDirError, OSError) as exc:
            raise OpError(str(exc))
    return path


def op_statedir(req):
    """The checked state folder (what the hello says, for a transport that runs one request per exec)."""
    if _STATE["dir"] is None:
        raise OpError(_STATE["error"])
    return {"state_dir": _STATE["dir"]}


def op_touch(req):
    touch_file(_state_parent(req["path"]))
    return {"t": now()}


def op_write(req):
    write_file(_state_parent(req["path"]), req["data"], int(req.get("mode", 0o600)))
    return {}


def op_read(req):
    return {"data": read_file(req["path"], MAX_OUTPUT)}


def op_rmtree(req):
    remove_tree(_state_path(req["path"]))
    return {}


_NOT_WORKERS = {}
"""pid -> the start time of a process seen not to be a training worker: never read again while it lives."""


def _is_worker(info):
    return "TORCHELASTIC_RUN_ID" in info["env"] and info["env"].get("RANK", "").isdigit()


def op_procs(req):
    """The node's processes in scope (see :func:`_in_scope`); with ``workers``, only torchrun's workers (a
    process table polled every 50 ms must not ship every process's environment each time). Only the
    environment keys chaoskit reads leave the node."""
    scope = req.get("scope") or {}
    job = scope.get("job")
    workers = bool(req.get("workers"))
    own = _own_netns() if scope.get("netns") else None
    found = []
    seen = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if own is not None and _netns_of(pid) != own:
            continue  # cheap test first: the host's other processes are never read
        if workers:
            seen.add(pid)
            if pid in _NOT_WORKERS:
                started = proc_start_time(pid)  # bytes, where _proc's "start" is an int
                if started is not None and int(started) == _NOT_WORKERS[pid]:
                    continue
        info = _proc(pid)
        if info is None or not _in_node(info, scope):
            continue
        if workers and not _is_worker(info):
            if info["cmdline"] and info["env"]:  # mid-exec, both read empty for a moment: not known yet
                _NOT_WORKERS[pid] = info["start"]  # an exec could make it one: rare, and a new start time is not
            continue
        found.append(info)
    if workers:
        for pid in [p for p in _NOT_WORKERS if p not in seen]:
            del _NOT_WORKERS[pid]
    if job:
        marked = [i for i in found if _carries(i, job)]
        parents = set(i["ppid"] for i in marked if i["env"].get("RANK", "").isdigit())
        ids = set(i["pid"] for i in marked)
        found = [i for i in found if i["pid"] in ids or (not job.get("pending") and _owned(i, job) and (
            i["pid"] in parents or _known_agent(i, job)))]
    return {"procs": [_wire(i) for i in found]}


def op_state(req):
    info = _proc(int(req["pid"]))
    start = req.get("start")
    if info is not None and start is not None and info["start"] != int(start):
        return {"state": None}  # the pid names another process now
    return {"state": info["state"] if _in_scope(info, req.get("scope")) else None}


def op_signal(req):
    """Signal one process of the scope. With ``start`` (its start time when it was selected), a pid that names
    another process now (reused) is refused. The pidfd, opened before the checks, makes the signal reach the
    very process that was checked."""
    pid, signum = int(req["pid"]), int(req["signal"])
    start = req.get("start")
    scope = req.get("scope") or {}
    fd = _pidfd(pid) if pid > 1 else None
    try:
        info = _proc(pid)
        if pid <= 1:
            raise OpError("pid %d is not a live process of this node" % pid)
        if info is None or info["state"] == "Z":
            raise OpError("pid %d exited before it was signalled; not signalled" % pid, gone=True)
        if start is not None and info["start"] != int(start):
            raise OpError("pid %d is not the process that was selected: its start time changed from %s to %s "
                          "(the pid was reused); not signalled" % (pid, start, info["start"]), gone=True)
        if not _in_node(info, scope):
            raise OpError("pid %d is not a process of this node" % pid)
        if not _in_scope(info, scope):
            raise OpError("pid %d is not a process of the drilled job (%s); not signalled"
                          % (pid, _describe_job(scope.get("job"))))
        if fd is not None:
            signal.pidfd_send_signal(fd, signum)
        else:
            os.kill(pid, signum)
    finally:
        if fd is not None:
            os.close(fd)
    return {"t": now()}


def _describe_job(job):
    if not job or job.get("pending"):
        return "no job chosen yet"
    parts = []
    for key, label in (("run_id", "run id"), ("uid", "uid"), ("slurm_job", "Slurm job")):
        if job.get(key) is not None:
            parts.append("%s %s" % (label, job[key]))
    return ", ".join(parts) or "any"


def op_watchdog(req):
    """Start the lease watchdog detached; answer once it is watching.

    The lease folder and the watchdog's script (shipped before with ``write``) lie in the state folder; the
    watchdog runs with ``python3 -I``. The deadline is computed here, on the node's clock, from ``duration``.
    """
    lease_dir, script = _state_path(req["lease_dir"]), _state_path(req["script"])
    _state_parent(os.path.join(lease_dir, "lease"))  # the lease folder and those above it, made and checked
    for stale in ("released", "fired", "watchdog.pid", REVERT_FILE):
        try:
            os.unlink(os.path.join(lease_dir, stale))
        except FileNotFoundError:
            pass
    touch_file(os.path.join(lease_dir, "lease"))
    # the revert in a file of the lease folder, not on the command line, which every user of the node reads
    create_file(os.path.join(lease_dir, REVERT_FILE), json.dumps([str(a) for a in req["revert"]]))
    deadline = time.time() + float(req["duration"])
    argv = [sys.executable, "-I", script, lease_dir, "%g" % float(req["ttl"]), "%.3f" % deadline]
    pid = _spawn(argv, cwd="/")
    pidfile = os.path.join(lease_dir, "watchdog.pid")
    end = time.time() + float(req.get("wait", 5))
    while time.time() < end:
        if os.path.exists(pidfile):
            return {"pid": pid, "deadline": deadline, "t": now()}
        time.sleep(0.005)
    raise OpError("the watchdog did not start within %gs" % float(req.get("wait", 5)))


def op_skew(req):
    """Tests only: shift the clock this agent reports by ``seconds``."""
    _SKEW[0] = float(req["seconds"])
    return {"t": now()}


def _open_log(path, roots=None):
    """``path`` opened for reading only once it is checked, never blocking and never anything but a regular file:
    its links resolved once (``realpath``), inside ``roots`` where given, then walked from ``/`` one folder at a time
    with ``O_NOFOLLOW`` (a folder swapped for a link meanwhile is refused), the file itself ``lstat``-ed before it is
    opened (a FIFO, a device such as ``/dev/watchdog``, a socket is never opened) and opened
    ``O_NOFOLLOW|O_NONBLOCK``, then ``fstat``-ed again. ``OpError`` with the reason otherwise."""
    real = os.path.realpath(path)
    if roots is not None and not any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots):
        raise OpError("%s is %s, outside the site policy's log roots (%s)" % (path, real, ", ".join(roots)))
    parts = [p for p in real.split("/") if p]
    if not parts:
        raise OpError("%s is not a regular file" % path)
    dfd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            os.close(dfd)
            dfd = nfd
        st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            raise OpError("%s (%s) is %s, not a regular file; chaoskit follows regular files only and never opens it"
                          % (path, real, _file_kind(st.st_mode)))
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OpError("%s is %s, not a regular file" % (path, _file_kind(st.st_mode)))
    return os.fdopen(fd, "rb")


def _file_kind(mode):
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a link")):
        if test(mode):
            return name
    return "not a regular file"


def _open_at(path, inode, roots=None):
    """The file to go on reading: ``path`` itself, or, when ``inode`` names another file (``path`` was
    rotated since), the rotated file in the same folder that still has that inode (each opened by :func:`_open_log`)."""
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if inode is None or (st is not None and st.st_ino == inode):
        return (_open_log(path, roots), True) if st is not None else (None, True)
    folder = os.path.dirname(path) or "."
    try:
        names = os.listdir(folder)
    except OSError:
        names = []
    for name in names:
        candidate = os.path.join(folder, name)
        try:
            if os.lstat(candidate).st_ino == inode:
                return _open_log(candidate, roots), False
        except OSError:
            continue
    return (_open_log(path, roots), True) if st is not None else (None, True)


FOLLOW_MAX_LINE = 64 * 1024
"""The longest line op_follow sends (chaoskit.core.limits.MAX_LINE_BYTES): a longer one is cut there and its
rest skipped up to its newline, so a line with no end holds at most this much in memory."""


def op_follow(req, emit):
    """Follow a log file: every complete line with the time it was read, across rotation and truncation.

    ``inode``/``offset`` say where a previous stream stopped; lines come in batches
    ``{"lines": [[t, text], ...], "inode": I, "offset": O}``, where ``inode``/``offset`` is the
    position after the batch, so a new stream started there neither loses nor repeats a line.
    A line longer than :data:`FOLLOW_MAX_LINE` bytes is sent cut to that length as soon as it is
    that long (newline or not); the rest of it is read past, never kept. With ``roots`` (the site
    policy's log roots), a file that is not really inside one (a link planted in a root) is refused."""
    path, interval = req["path"], float(req.get("interval", 0.02))
    inode, pos = req.get("inode"), int(req.get("offset") or 0)
    roots = req.get("roots")
    cancel = threading.Event()
    with _STREAMS_LOCK:
        _STREAMS[req.get("id")] = cancel
    fh, current = None, True
    buf = b""  # the line read so far, never longer than FOLLOW_MAX_LINE; the file is read from pos + len(buf)
    skipping = False  # the current line was sent cut: read past it to its newline
    try:
        while not cancel.is_set() and not _STOP.is_set():
            if fh is None:
                try:
                    fh, current = _open_at(path, inode, roots)
                except OSError as exc:  # a folder on the way swapped for a link, the file gone meanwhile
                    raise OpError("%s: not opened: %s" % (path, exc.strerror or exc))
                if fh is None:
                    cancel.wait(interval)
                    continue
                if roots is not None:  # the site policy's log roots: where the open file really is, links resolved
                    real = os.readlink("/proc/self/fd/%d" % fh.fileno())
                    if not any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots):
                        fh.close()
                        fh = None
                        raise OpError("%s is %s, outside the site policy's log roots (%s)" % (path, real, ", ".join(roots)))
                st = os.fstat(fh.fileno())
                if inode != st.st_ino:
                    inode, pos, buf, skipping = st.st_ino, 0, b"", False
                if st.st_size < pos:  # truncated (copytruncate) while no stream was reading it
                    pos, buf, skipping = 0, b"", False
                fh.seek(pos + len(buf))
            chunk = fh.read(1 << 20)
            if chunk:
                lines, start, t = [], 0, now()
                while True:
                    nl = chunk.find(b"\n", start)
                    piece = chunk[start:] if nl < 0 else chunk[start:nl]
                    if skipping:
                        pos += len(piece)
                    elif len(buf) + len(piece) > FOLLOW_MAX_LINE:
                        line = buf + piece[:FOLLOW_MAX_LINE - len(buf)]
                        lines.append([t, line.decode("utf-8", "replace")])
                        pos += len(buf) + len(piece)
                        buf, skipping = b"", True
                    elif nl < 0:
                        buf += piece
                    else:
                        lines.append([t, (buf + piece).decode("utf-8", "replace")])
                        pos += len(buf) + len(piece)
                        buf = b""
                    if nl < 0:
                        break
                    pos += 1  # the newline
                    skipping = False
                    start = nl + 1
                if lines:
                    emit({"lines": lines, "inode": inode, "offset": pos, "more": True})
                continue
            # at the end of the file: rotated or truncated?
            try:
                st = os.stat(path)
            except OSError:
                st = None
            size = os.fstat(fh.fileno()).st_size
            if size < pos + len(buf):  # truncated in place: start over
                pos, buf, skipping = 0, b"", False
                fh.seek(0)
                continue
            if not current or (st is not None and st.st_ino != inode):  # rotated: the old file is drained
                fh.close()
                fh, current, inode, pos, buf, skipping = None, True, None, 0, b"", False
                continue
            cancel.wait(interval)
    finally:
        if fh is not None:
            fh.close()
        with _STREAMS_LOCK:
            _STREAMS.pop(req.get("id"), None)
    return {"inode": inode, "offset": pos}


WATCH_SCAN_S = 0.25
"""How often ``watch`` lists ``/proc`` for new workers (exits come at once through pidfds)."""
WATCH_HEARTBEAT_S = 1.0
WATCH_RECHECK_S = 5.0
"""How often ``watch`` re-reads the start time of every process it set aside (a pid reused in between)."""


def _exit_status(fields):
    """exitcode/signal of a zombie from ``/proc/PID/stat`` field 52 (its wait status, Linux 3.5+)."""
    try:
        status = int(fields[49])
    except (IndexError, ValueError, TypeError):
        return {}
    if status & 0x7F:
        return {"exitcode": -(status & 0x7F), "signal": status & 0x7F}
    return {"exitcode": (status >> 8) & 0xFF}


def _uptime_ticks():
    try:
        with open("/proc/uptime", "rb") as fh:
            return float(fh.read().split()[0]) * os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _young(start, ticks):
    """Whether a process started (``start``: its start time in clock ticks, int or the bytes of
    ``/proc/PID/stat``) less than 2 s before ``ticks`` (:func:`_uptime_ticks`; ``None``: unknown, so young).
    Between fork and exec a process still shows its parent's environment and namespaces."""
    try:
        return ticks is None or ticks - int(start) < 2 * os.sysconf("SC_CLK_TCK")
    except (TypeError, ValueError):
        return True


class _WorkerWatch(object):
    """What ``watch`` knows of the node's workers of the scope, and how it learns what changed.

    New pids are read once (their netns first, then their environment) and set aside when they are not the
    job's workers; a process younger than 2 s is read again on the next scan, since between fork and exec it
    still shows its parent's environment and, until it joins, its parent's netns. Known workers are followed
    through a pidfd each (their exit comes at once) and their state is read on every scan (stopped, resumed,
    zombie)."""

    def __init__(self, scope, known):
        self.scope = scope or {}
        self.job = self.scope.get("job")
        self.own = _own_netns() if self.scope.get("netns") else None
        self.workers = {}   # pid -> {"start", "rank", "state", "fd", ...}
        self.aside = {}     # pid -> start time (bytes) of a process that is not one of the job's workers
        self.known = dict((int(k[0]), (int(k[1]) if k[1] is not None else None, k[2] if len(k) > 2 else "S"))
                          for k in (known or []))
        self.last_recheck = time.time()

    def _worker(self, info):
        if not _in_node(info, self.scope) or not _is_worker(info):
            return False
        if self.job:
            return _carries(info, self.job)
        return True

    def scan(self):
        """Changes since the last scan: appeared, stopped, resumed, zombie, exited."""
        changes = []
        try:
            names = os.listdir("/proc")
        except OSError:
            return changes
        present = set()
        ticks = None
        recheck = time.time() - self.last_recheck >= WATCH_RECHECK_S
        if recheck:
            self.last_recheck = time.time()
        for name in names:
            if not name.isdigit():
                continue
            pid = int(name)
            present.add(pid)
            if pid in self.workers:
                continue
            if pid in self.aside:
                if not recheck or self.aside[pid] == proc_start_time(pid):
                    continue
                del self.aside[pid]
            if self.own is not None and _netns_of(pid) != self.own:
                # Not in the node's netns now; a young process may still be on its way in (``ip netns exec``,
                # a container runtime: fork outside, setns, exec), so it is read again on the next scan.
                start = proc_start_time(pid)
                if ticks is None:
                    ticks = _uptime_ticks()
                if start is not None and not _young(start, ticks):
                    self.aside[pid] = start
                continue
            info = _proc(pid)
            if info is None:
                continue
            if not self._worker(info):
                if ticks is None:
                    ticks = _uptime_ticks()
                if not _young(info["start"], ticks) and info["cmdline"] and info["env"]:
                    self.aside[pid] = str(info["start"]).encode()
                continue
            changes.extend(self._appeared(info))
        for pid in [p for p in self.aside if p not in present]:
            del self.aside[pid]
        for pid in list(self.workers):
            changes.extend(self._check(pid, pid in present))
        for pid, (start, state) in list(self.known.items()):  # known to the controller, not found here: gone
            del self.known[pid]
            changes.append({"ev": "exited", "pid": pid, "start": start, "t": now()})
        return changes

    def _appeared(self, info):
        pid = info["pid"]
        env = info["env"]
        restart = env.get("TORCHELASTIC_RESTART_COUNT", "")
        w = {"start": info["start"], "rank": int(env["RANK"]), "state": info["state"], "fd": _pidfd(pid),
             "restart_count": int(restart) if restart.isdigit() else None}
        self.workers[pid] = w
        base = {"pid": pid, "start": info["start"], "rank": w["rank"], "t": now()}
        was = self.known.pop(pid, None)
        if was is not None and was[0] in (None, info["start"]):  # the controller knows it already: only what changed
            out = []
            if (was[1] == "T") != (info["state"] == "T"):
                out.append(dict(base, ev="stopped" if info["state"] == "T" else "resumed"))
            if info["state"] == "Z":
                out.append(dict(base, ev="zombie"))
            return out
        out = []
        if was is not None:  # the pid was reused while nobody watched
            out.append({"ev": "exited", "pid": pid, "start": was[0], "t": now()})
        out.append(dict(base, ev="appeared", ppid=info["ppid"], state=info["state"], restart_count=w["restart_count"],
                        local_rank=env.get("LOCAL_RANK"), run_id=env.get("TORCHELASTIC_RUN_ID")))
        if info["state"] == "Z":
            out.append(dict(base, ev="zombie"))
        return out

    def _check(self, pid, present):
        w = self.workers[pid]
        fields = proc_stat_fields(pid) if present else None
        base = {"pid": pid, "start": w["start"], "rank": w["rank"]}
        try:
            same = fields is not None and int(fields[19]) == w["start"]
        except (IndexError, ValueError):
            same = False
        if not same:
            self._forget(pid)
            return [dict(base, ev="exited", t=now(), **w.get("status", {}))]
        state = fields[0].decode("ascii", "replace")
        if state == w["state"]:
            return []
        old, w["state"] = w["state"], state
        if state == "Z":
            w["status"] = _exit_status(fields)
            if w.get("fd") is not None:  # a zombie's pidfd stays readable: the scan sees it reaped
                os.close(w["fd"])
                w["fd"] = None
            return [dict(base, ev="zombie", t=now(), **w["status"])]
        if state in ("T", "t") and old not in ("T", "t"):
            return [dict(base, ev="stopped", t=now())]
        if old in ("T", "t") and state not in ("T", "t"):
            return [dict(base, ev="resumed", t=now())]
        return []

    def _forget(self, pid):
        w = self.workers.pop(pid, None)
        if w is not None and w.get("fd") is not None:
            os.close(w["fd"])

    def exited_fds(self, timeout):
        """Wait up to ``timeout`` for a known worker's pidfd; the pids whose process ended."""
        fds = dict((w["fd"], pid) for pid, w in self.workers.items() if w.get("fd") is not None)
        if not fds:
            return None  # nothing to wait on: the caller sleeps
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        try:
            ready = poller.poll(timeout * 1000.0)
        except (OSError, ValueError):
            return []
        return [fds[fd] for fd, _ in ready if fd in fds]

    def close(self):
        for pid in list(self.workers):
            self._forget(pid)


def op_watch(req, emit):
    """Stream the changes of the node's training workers in scope (the drilled job's, see :func:`_in_scope`).

    Each message: ``{"seq": N, "t": T, "changes": [...], "more": true}``; a change is ``{"ev": "appeared" |
    "stopped" | "resumed" | "zombie" | "exited", "pid", "start", "rank", "t", ...}`` (``appeared`` with ``ppid``,
    ``state``, ``restart_count``, ``local_rank``, ``run_id``; ``zombie``, and ``exited`` after it, with ``exitcode``
    and ``signal`` read from the zombie). A message with no change is the heartbeat, about every
    ``heartbeat`` seconds; the first one comes at once. ``seq`` counts this stream's messages from 1.

    ``known`` (``[[pid, start, state], ...]``: the workers the controller believes alive, from an earlier
    stream) is where this stream starts: what changed since is reported once, as changes of the first
    message (a worker that came and went while no stream watched is not seen). Exits come through a pidfd per
    worker where the node has them, new workers from a ``/proc`` scan every ``interval`` seconds, in which only
    new pids are read (in the lab, where every node shares one kernel, each agent reads only its own)."""
    interval = float(req.get("interval", WATCH_SCAN_S))
    beat = float(req.get("heartbeat", WATCH_HEARTBEAT_S))
    cancel = threading.Event()
    with _STREAMS_LOCK:
        _STREAMS[req.get("id")] = cancel
    watch = _WorkerWatch(req.get("scope"), req.get("known"))
    seq = [0]

    def send(changes):
        seq[0] += 1
        emit({"seq": seq[0], "t": now(), "changes": changes, "more": True})

    try:
        send(watch.scan())
        last_beat = last_scan = time.time()
        while not cancel.is_set() and not _STOP.is_set():
            wait = max(0.0, min(last_scan + interval, last_beat + beat) - time.time())
            ended = watch.exited_fds(wait)
            if ended is None:
                cancel.wait(wait)
            changes = []
            if ended:
                for pid in ended:
                    if pid in watch.workers:
                        changes.extend(watch._check(pid, True))
            if time.time() >= last_scan + interval:
                changes.extend(watch.scan())
                last_scan = time.time()
            if changes or time.time() >= last_beat + beat:
                send(changes)
                last_beat = time.time()
    finally:
        watch.close()
        with _STREAMS_LOCK:
            _STREAMS.pop(req.get("id"), None)
    return {"seq": seq[0] + 1, "t": now(), "changes": []}


KMSG_PATH = "/dev/kmsg"
KMSG_BATCH = 256
"""The most records one ``kmsg`` message carries."""
KMSG_IDLE_S = 1.0
"""How often a ``kmsg`` stream says where it is (``seq``) when records were read but none matched."""


def _kmsg_record(raw):
    """(seq, usec, prio, message) of one ``/dev/kmsg`` record (``PRIO,SEQ,USEC,FLAGS;text``), or None."""
    head, sep, rest = raw.partition(b";")
    if not sep:
        return None
    fields = head.split(b",")
    try:
        prio, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
    except (IndexError, ValueError):
        return None
    return seq, usec, prio, rest[:FOLLOW_MAX_LINE].decode("utf-8", "replace")


class _KmsgReader(object):
    """Records from ``/dev/kmsg`` (one per read, then its `` KEY=value`` lines) or from a plain file of records
    (tests: many per read); ``read`` returns a list, empty at the end, None when nothing is there yet."""

    def __init__(self, fd):
        self.fd, self.pending = fd, b""

    def read(self):
        try:
            chunk = os.read(self.fd, 8192)
        except BlockingIOError:
            return None
        except BrokenPipeError:  # records overwritten before they were read: the next read goes on after them
            return []
        if not chunk:
            return None
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        out = []
        for line in lines:
            if line and not line.startswith(b" "):  # " KEY=value" continuation lines carry no message
                rec = _kmsg_record(line)
                if rec is not None:
                    out.append(rec)
        return out


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return None


def op_kmsg(req, emit):
    """Follow the node's kernel log (``/dev/kmsg``): the records whose text contains one of ``match`` (plain
    substrings; none: every record), each ``[t, seq, prio, text]`` with the node's time it was logged.

    ``seq``: the last record an earlier stream delivered; records after it are sent (those the ring buffer
    still holds: ``lost`` counts any overwritten since), so a stream resumed there neither loses nor doubles
    one. Without it the stream starts at the end of the log (what it held before is not sent). The first
    message (``started``) names the kernel (``boot_id``: nodes that share one kernel share it) and the
    position; later ones ``{"records": [...], "seq": S, "lost": N}``, ``seq`` the last record read."""
    after = req.get("seq")
    after = int(after) if after is not None else None
    match = [str(m) for m in (req.get("match") or [])]
    interval = float(req.get("interval", 0.2))
    path = req.get("path") or KMSG_PATH
    cancel = threading.Event()
    with _STREAMS_LOCK:
        _STREAMS[req.get("id")] = cancel
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        with _STREAMS_LOCK:
            _STREAMS.pop(req.get("id"), None)
        raise OpError("cannot read the kernel log %s: %s" % (path, exc.strerror))
    import select

    def wall(usec):  # the record's time (since boot) on the node's wall clock
        return min(now(), now() - (time.monotonic() - usec / 1e6))

    reader = _KmsgReader(fd)
    last, lost = after, 0
    try:
        if after is None:  # from now on, knowing where "now" is (the last record's seq) so a resumed stream has one
            while True:
                recs = reader.read()
                if recs is None:
                    break
                for rec in recs:
                    last = rec[0]
        emit({"started": True, "boot_id": _boot_id(), "seq": last, "records": [], "more": True})
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        sent, sent_at = last, time.monotonic()
        while not cancel.is_set() and not _STOP.is_set():
            batch, idle = [], False
            while len(batch) < KMSG_BATCH:
                recs = reader.read()
                if recs is None:
                    idle = True
                    break
                for seq, usec, prio, text in recs:
                    if last is not None and seq <= last:
                        continue  # delivered by an earlier stream
                    if last is not None and seq > last + 1:
                        lost += seq - last - 1
                    last = seq
                    if not match or any(m in text for m in match):
                        batch.append([wall(usec), seq, prio, text])
            if batch or (last != sent and time.monotonic() - sent_at >= KMSG_IDLE_S):
                emit({"records": batch, "seq": last, "lost": lost, "more": True})
                sent, sent_at = last, time.monotonic()
            if idle:
                if poller.poll(interval * 1000) and os.fstat(fd).st_size:  # a plain file (tests) is always "ready"
                    cancel.wait(interval)
    finally:
        os.close(fd)
        with _STREAMS_LOCK:
            _STREAMS.pop(req.get("id"), None)
    return {"seq": last, "lost": lost}


NVML_LIB = "libnvidia-ml.so.1"
"""The NVIDIA driver's management library, loaded with ctypes where it exists (no pip package on the node)."""
NVML_WAIT_MS = 500
"""How long one ``nvmlEventSetWait_v2`` blocks: the stream's reaction time to a cancel."""
NVML_EVENTS = {0x8: "xid", 0x2: "ecc"}
"""The events watched: ``nvmlEventTypeXidCriticalError`` (its data is the Xid) and
``nvmlEventTypeDoubleBitEccError`` (an uncorrectable ECC error)."""
NVML_TIMEOUT = 10
"""``NVML_ERROR_TIMEOUT``: nothing happened within the wait."""


def _nvml_structs(ctypes):
    class PciInfo(ctypes.Structure):  # nvmlPciInfo_t (v3)
        _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                    ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                    ("busId", ctypes.c_char * 32)]

    class EventData(ctypes.Structure):  # nvmlEventData_t
        _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong), ("eventData", ctypes.c_ulonglong),
                    ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]

    return PciInfo, EventData


def op_nvml(req, emit):
    """Stream the node's GPU health from NVML, read here (``libnvidia-ml.so.1`` through ctypes): Xid critical
    errors and uncorrectable (double-bit) ECC errors, each ``[t, index, pci, kind, data]`` with the node's time
    (``kind`` ``"xid"`` with the Xid as ``data``, or ``"ecc"``). The first message names the GPUs that take events
    (``{"started": true, "gpus": [[index, pci], ...]}``), later ones ``{"events": [...]}``. No library, no driver,
    or no GPU that takes events: one clear error."""
    import ctypes

    try:
        lib = ctypes.CDLL(NVML_LIB)
    except OSError as exc:
        raise OpError("NVML is not on this node (%s does not load: %s)" % (NVML_LIB, exc))
    PciInfo, EventData = _nvml_structs(ctypes)
    lib.nvmlErrorString.restype = ctypes.c_char_p

    def check(name, *args):
        rc = getattr(lib, name)(*args)
        if rc != 0:
            raise OpError("NVML %s failed: %s" % (name, (lib.nvmlErrorString(rc) or b"error %d" % rc).decode()))

    check("nvmlInit_v2")
    event_set = ctypes.c_void_p()
    cancel = threading.Event()
    with _STREAMS_LOCK:
        _STREAMS[req.get("id")] = cancel
    try:
        count = ctypes.c_uint()
        check("nvmlDeviceGetCount_v2", ctypes.byref(count))
        check("nvmlEventSetCreate", ctypes.byref(event_set))
        gpus, index_of = [], {}
        mask = sum(NVML_EVENTS)
        for index in range(count.value):
            handle = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
                continue
            supported = ctypes.c_ulonglong()
            if lib.nvmlDeviceGetSupportedEventTypes(handle, ctypes.byref(supported)) != 0 or not supported.value & mask:
                continue
            if lib.nvmlDeviceRegisterEvents(handle, ctypes.c_ulonglong(supported.value & mask), event_set) != 0:
                continue
            pci = PciInfo()
            bus_id = pci.busId.decode("ascii", "replace") if lib.nvmlDeviceGetPciInfo_v3(handle, ctypes.byref(pci)) == 0 else None
            gpus.append([index, bus_id])
            index_of[handle.value] = (index, bus_id)
        if not gpus:
            raise OpError("no GPU of this node takes NVML events")
        emit({"started": True, "gpus": gpus, "more": True})
        data = EventData()
        while not cancel.is_set() and not _STOP.is_set():
            rc = lib.nvmlEventSetWait_v2(event_set, ctypes.byref(data), ctypes.c_uint(NVML_WAIT_MS))
            if rc == NVML_TIMEOUT:
                continue
            if rc != 0:
                raise OpError("NVML nvmlEventSetWait_v2 failed: %s" % (lib.nvmlErrorString(rc) or b"?").decode())
            kinds = [k for bit, k in sorted(NVML_EVENTS.items(), reverse=True) if data.eventType & bit]
            if not kinds:
                continue
            index, bus_id = index_of.get(data.device, (None, None))
            emit({"events": [[now(), index, bus_id, kinds[0], int(data.eventData)]], "more": True})
    finally:
        with _STREAMS_LOCK:
            _STREAMS.pop(req.get("id"), None)
        if event_set.value:
            lib.nvmlEventSetFree(event_set)
        lib.nvmlShutdown()
    return {"events": []}


def op_cancel(req):
    with _STREAMS_LOCK:
        event = _STREAMS.get(req["stream"])
    if event is not None:
        event.set()
    return {}


INLINE = {
    "ping": op_ping, "touch": op_touch, "write": op_write, "read": op_read,
    "state": op_state, "signal": op_signal, "skew": op_skew, "cancel": op_cancel, "statedir": op_statedir,
}
THREADED = {"run": op_run, "spawn": op_spawn, "procs": op_procs, "rmtree": op_rmtree, "watchdog": op_watchdog}
STREAMING = {"follow": op_follow, "watch": op_watch, "kmsg": op_kmsg, "nvml": op_nvml}
"""Ops that answer many times: ``fn(req, emit)``; what ``fn`` returns is the last answer."""


def main():
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    write_lock = threading.Lock()
    threads = []

    def reply(obj):
        data = (json.dumps(obj) + "\n").encode()
        with write_lock:
            stdout.write(data)
            stdout.flush()

    def handle(req):
        rid = req.get("id")

        def emit(part):
            part["id"], part["ok"] = rid, True
            reply(part)

        try:
            stream = STREAMING.get(req.get("op"))
            fn = INLINE.get(req.get("op")) or THREADED.get(req.get("op"))
            if stream is not None:
                out = stream(req, emit)
            elif fn is None:
                raise OpError("unknown op %r" % req.get("op"))
            else:
                out = fn(req)
            out["id"], out["ok"] = rid, True
        except (OpError, StateDirError) as exc:
            out = {"id": rid, "ok": False, "error": str(exc)}
            if getattr(exc, "gone", False):
                out["gone"] = True
        except Exception as exc:  # noqa: BLE001 - every failure becomes an answer, never a dead agent
            out = {"id": rid, "ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
        try:
            reply(out)
        except (OSError, ValueError):
            pass

    heard = [time.monotonic()]

    def finish():
        _STOP.set()
        for t in list(threads):
            t.join()
        _reap()
        sys.stdout.flush()
        os._exit(0)

    def idle_watch(limit):
        """Ends the agent as EOF would, once nothing has come for ``limit`` seconds."""
        while not _STOP.wait(min(1.0, limit / 4)):
            if time.monotonic() - heard[0] > limit:
                finish()

    _init_state(CHAOSKIT_WORKDIR)
    if CHAOSKIT_IDLE_EXIT_S:
        w = threading.Thread(target=idle_watch, args=(float(CHAOSKIT_IDLE_EXIT_S),))
        w.daemon = True
        w.start()
    reply({"id": 0, "ok": True, "hello": VERSION, "pid": os.getpid(), "uid": os.getuid(),
           "python": sys.executable, "t": now(), "state_dir": _STATE["dir"], "state_error": _STATE["error"]})
    for line in iter(stdin.readline, b""):
        heard[0] = time.monotonic()
        try:
            req = json.loads(line)
        except ValueError:
            continue
        _reap()
        if req.get("op") in INLINE:
            handle(req)
        else:
            t = threading.Thread(target=handle, args=(req,))
            t.daemon = True
            t.start()
            threads.append(t)
            threads[:] = [x for x in threads if x.is_alive()]
    finish()


if __name__ == "__main__":
    main()
