"""storage.slow's and storage.error's node program: a FUSE passthrough mounted over the checkpoint folder, which
delays (``latency``, ``jitter``, ``rate``) or fails (an errno for a share) the chosen operations on the files that
match a glob. ``SOURCE_PREFIX``, ``FSTYPE``, ``GRACE_S`` and ``READY_S`` come in front of it, with
:mod:`chaoskit.nodeside.nodefs` and :mod:`.procstat`.

``python3 -I -c STORAGE_IO OP ...`` on the node, as root:

- ``probe ROOT PATH``: the folder (walked as below), whether ``/dev/fuse`` and the FUSE binding are there, and
  whether a chaoskit FUSE mount is on it already; JSON.
- ``serve ROOT ROOT_ID PATH FOLDER_ID TOKEN STATE NSPID NSSTART CONFIG``: the daemon (started detached). It enters
  the mount namespace of the job's process ``NSPID`` (when it still has the start time ``NSSTART``; ``-``: its own),
  opens the folder from ``/`` without following a link anyone but root could have made and goes down ``PATH`` by
  names with ``O_NOFOLLOW`` (no ``..``, no link: exit 2), checks both inodes against ``ROOT_ID`` and ``FOLDER_ID``
  (exit 3), then mounts ``fuse.chaoskit`` (source ``chaoskit-io-TOKEN``) on ``/proc/self/fd/N`` of that checked
  descriptor, so no name is looked up again. The file system serves the folder's original contents through that
  descriptor, opened before the mount hid them: every call is relative to it, each name walked with
  ``O_NOFOLLOW``. The mount is ``allow_other,default_permissions,nosuid,nodev``: the kernel checks each caller's
  rights against the files' own owners and modes. A child process serves it as the folder's owner (the job's user;
  what it makes is theirs, as without the fault); the parent stays root only to take the mount away again, which it
  does as soon as the child ends, however it ends (a child killed with SIGKILL leaves no hung mount point), and on
  SIGTERM. It writes ``STATE`` (in the node's state folder: its pids, or why it failed) once the mount answers.
- ``unmount TOKEN STATE``: the revert (the lease's watchdog runs it). The mount is lazily detached (``umount -l``)
  in every mount namespace that shows it (a namespace made while it was mounted, such as another job's
  ``ip netns exec``, holds a copy): found in ``/proc/*/mountinfo`` by its source, entered with ``setns``, walked to
  as above and detached through an ``O_PATH`` descriptor only when that descriptor's mount id is the mount's. No
  call there waits on the daemon, so a hung or dead daemon cannot hang the revert. New opens then see the original
  folder; the daemon ends by itself once the files still open through the mount are closed, and is killed after
  ``GRACE_S``. Idempotent; removes ``STATE``.
- ``check TOKEN STATE``: what is left of the fault (a mount, a daemon); empty when nothing.
"""

import ctypes, errno, fnmatch, json, os, random, select, signal, stat, sys, threading, time

MS_NOSUID, MS_NODEV, MNT_DETACH, UMOUNT_NOFOLLOW, CLONE_NEWNS = 2, 4, 2, 8, 0x00020000
D = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    """An operation refused with an exit status and one line for people."""

    def __init__(self, code, message):
        Exception.__init__(self, message)
        self.code = code


def libc():
    return ctypes.CDLL(None, use_errno=True)


def os_error(what):
    err = ctypes.get_errno()
    return OSError(err, "%s: %s" % (what, os.strerror(err)))


def ident(st):
    return "%d:%d" % (st.st_dev, st.st_ino)


def valid(value, what):
    if not value or len(value) > 4096 or any(ord(c) < 32 or c == "\x7f" for c in value):
        raise Refused(6, "refusing: %s %r is not a valid path" % (what, value))
    return value


def token_ok(token):
    if len(token) != 16 or any(c not in "0123456789abcdef" for c in token):
        raise Refused(6, "refusing: %r is not a token chaoskit makes" % token)
    return token


def open_root(root):
    """The folder ``root``, walked from / without following a link anyone but root could have made (as the storage
    tool walks it)."""
    valid(root, "the checkpoint folder")
    if not root.startswith("/"):
        raise Refused(5, "refusing: the checkpoint folder %r is not an absolute path" % root)
    fd, parts, hops = os.open("/", D), [p for p in root.split("/") if p not in ("", ".")], 0
    while parts:
        name = parts.pop(0)
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            os.close(fd)
            raise Refused(1, "%s does not exist" % root)
        if stat.S_ISLNK(st.st_mode):
            here, hops = os.fstat(fd), hops + 1
            if st.st_uid != 0 or here.st_uid != 0 or here.st_mode & 0o022 or hops > 40:
                os.close(fd)
                raise Refused(5, "refusing: %s has a symbolic link (%s) that a user other than root can change; give "
                                 "its real path" % (root, name))
            target = os.readlink(name, dir_fd=fd)
            if target.startswith("/"):
                os.close(fd)
                fd = os.open("/", D)
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        if not stat.S_ISDIR(st.st_mode):
            os.close(fd)
            raise Refused(1, "%s is not a folder" % root)
        nfd = os.open(name, D, dir_fd=fd)
        os.close(fd)
        fd = nfd
    return fd


def parts_of(root, rel):
    valid(rel, "path")
    if rel.startswith("/"):
        top, norm = os.path.normpath(root).rstrip("/"), os.path.normpath(rel)
        if norm != top and not norm.startswith(top + "/"):
            raise Refused(2, "%s is outside the job's checkpoint folder %s" % (rel, root))
        rel = norm[len(top) + 1:] or "."
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Refused(2, "%s leaves the job's checkpoint folder %s ('..')" % (rel, root))
    return parts


def descend(fd, parts, root, rel):
    """Down from ``fd`` by names: no link, no ``..``; ``fd`` is closed."""
    for i, name in enumerate(parts):
        where = os.path.join(root, *parts[:i + 1])
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            os.close(fd)
            raise Refused(1, "%s does not exist" % where)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            os.close(fd)
            raise Refused(2, "%s: %s is %s; storage faults follow no links, so it counts as outside the job's "
                             "checkpoint folder %s" % (rel, where, "a symbolic link" if stat.S_ISLNK(st.st_mode)
                                                        else "not a folder", root))
        nfd = os.open(name, D, dir_fd=fd)
        os.close(fd)
        fd = nfd
    return fd


def mounts(text):
    """``(mount id, mount point, fstype, source)`` of each line of a ``mountinfo``."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        words, rest = left.split(" "), right.split(" ")
        if not sep or len(words) < 5 or len(rest) < 2 or not words[0].isdigit():
            continue
        point = words[4]
        for code in ("\\040", "\\011", "\\012", "\\134"):
            point = point.replace(code, chr(int(code[1:], 8)))
        out.append((int(words[0]), point, rest[0], rest[1]))
    return out


def read_text(path):
    try:
        with open(path, "rb") as fh:
            return fh.read(1 << 22).decode("utf-8", "replace")
    except OSError:
        return ""


def mnt_id(fd):
    for line in read_text("/proc/self/fdinfo/%d" % fd).splitlines():
        if line.startswith("mnt_id:"):
            return int(line.split()[1])
    return None


def ours(token):
    """The mount namespaces that show the mount ``chaoskit-io-TOKEN``: ``{namespace inode: (pid in it, [(mount id,
    mount point)])}`` (this process's own under pid 0)."""
    source, found = SOURCE_PREFIX + token, {}
    own = os.stat("/proc/self/ns/mnt").st_ino
    for pid in ["self"] + [p for p in os.listdir("/proc") if p.isdigit()]:
        text = read_text("/proc/%s/mountinfo" % pid)
        if source not in text:
            continue
        try:
            ns = os.stat("/proc/%s/ns/mnt" % pid).st_ino
        except OSError:
            continue
        if ns in found:
            continue
        hits = [(i, point) for i, point, fstype, src in mounts(text) if src == source and fstype == FSTYPE]
        if hits:
            found[ns] = (0 if ns == own else int(pid), hits)
    return found


def detach_in_view(hits):
    """Detach each ``(mount id, mount point)`` of the namespace this process is in: walked to from /, and detached
    through an O_PATH descriptor whose mount id is the mount's. What could not be: one line each."""
    problems = []
    for want, point in hits:
        try:
            parts = [p for p in point.split("/") if p]
            if not parts:
                raise Refused(3, "it is mounted on /")
            parent = descend(open_root("/"), parts[:-1], point, point)
            try:
                fd = os.open(parts[-1], os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            finally:
                os.close(parent)
            try:
                if mnt_id(fd) != want:
                    raise Refused(3, "another mount is on top of it")
                if libc().umount2(("/proc/self/fd/%d" % fd).encode(), MNT_DETACH) != 0:
                    raise os_error("umount2")
            finally:
                os.close(fd)
        except (Refused, OSError) as exc:
            problems.append("%s: %s" % (point, exc))
    return problems


def detach_all(token):
    """Detach the mount in every namespace that shows it; what could not be detached."""
    problems = []
    found = ours(token)
    if not found:
        return problems
    home = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    cwd = os.open("/", D)
    try:
        for ns, (pid, hits) in sorted(found.items()):
            if pid:
                try:
                    nsfd = os.open("/proc/%d/ns/mnt" % pid, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    continue  # the namespace's last process ended: its mounts went with it
                try:
                    if libc().setns(nsfd, CLONE_NEWNS) != 0:
                        problems.append("mount namespace of pid %d: %s" % (pid, os_error("setns")))
                        continue
                finally:
                    os.close(nsfd)
            try:
                problems += detach_in_view(hits)
            finally:
                if pid and libc().setns(home, CLONE_NEWNS) != 0:
                    raise os_error("setns back")
    finally:
        os.fchdir(cwd)
        os.close(cwd)
        os.close(home)
    return problems


def daemons(token):
    """``(pid, start time)`` of the daemon's processes for ``token`` (``serve ... TOKEN`` on their command line)."""
    out = []
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        words = read_text("/proc/%s/cmdline" % pid).split("\0")
        if len(words) > 9 and words[1:3] == ["-I", "-c"] and words[4] == "serve" and words[9] == token:
            start = proc_start_time(int(pid))
            if start is not None and int(pid) != os.getpid():
                out.append((int(pid), start))
    return out


def kill_daemons(token, grace):
    end = time.time() + grace
    while True:
        left = [(p, s) for p, s in daemons(token) if proc_state(p) not in (None, "Z")]
        if not left or time.time() >= end:
            break
        time.sleep(0.05)
    for pid, start in left:
        if proc_start_time(pid) == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return left


def enter_job_namespace(nspid, nsstart):
    if nspid == "-":
        return
    if not nspid.isdigit() or proc_start_time(int(nspid)) != nsstart.encode():
        raise Refused(1, "the job's process %s is gone (its mount namespace is not known)" % nspid)
    fd = os.open("/proc/%s/ns/mnt" % nspid, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if os.stat("/proc/self/ns/mnt").st_ino != os.fstat(fd).st_ino and libc().setns(fd, CLONE_NEWNS) != 0:
            raise os_error("setns into the job's mount namespace")
    finally:
        os.close(fd)
    os.chdir("/")


def become(st):
    """Act as the owner of the folder ``st`` describes (the job's user), not as root."""
    if os.geteuid() != 0 or st.st_uid == 0:
        return
    try:
        import pwd
        pw = pwd.getpwuid(st.st_uid)
        gid, groups = pw.pw_gid, os.getgrouplist(pw.pw_name, pw.pw_gid)
    except (ImportError, KeyError):
        gid, groups = st.st_gid, []
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(st.st_uid, st.st_uid, st.st_uid)


class Harm:
    """What the file system does to the chosen operations of the matching files (the fault's CONFIG)."""

    def __init__(self, cfg):
        self.ops = set(cfg.get("ops") or ())
        self.files = cfg.get("files") or "*"
        self.latency, self.jitter = float(cfg.get("latency") or 0), float(cfg.get("jitter") or 0)
        self.rate = float(cfg.get("rate") or 0)
        self.errno, self.share = cfg.get("errno"), float(cfg.get("share") or 0)
        self.lock, self.free_at = threading.Lock(), 0.0

    def matches(self, path):
        rel = path.lstrip("/")
        return fnmatch.fnmatchcase(rel, self.files) or fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], self.files)

    def before(self, op, path, size=0):
        if op not in self.ops or not self.matches(path):
            return
        if self.errno and random.random() * 100 < self.share:
            raise OSError(self.errno, os.strerror(self.errno))
        wait = 0.0
        if self.latency or self.jitter:
            wait = max(0.0, self.latency + random.uniform(-self.jitter, self.jitter))
        if self.rate and size:
            with self.lock:  # one device: transfers queue behind each other at the rate
                now = time.time()
                self.free_at = max(self.free_at, now) + size / self.rate
                wait = max(wait, self.free_at - now)
        if wait > 0:
            time.sleep(wait)


def passthrough(base, harm, mfusepy, ready):
    """The file system (an ``mfusepy.Operations`` class): the folder behind the descriptor ``base``, each name
    walked without following a link; ``ready()`` once the kernel's first request (INIT) is answered."""

    def walk(path):
        parts = [p for p in path.split("/") if p]
        if ".." in parts:
            raise OSError(errno.EACCES, "..")
        fd = os.open(".", D, dir_fd=base)
        try:
            for name in parts[:-1]:
                nfd = os.open(name, D, dir_fd=fd)
                os.close(fd)
                fd = nfd
        except OSError:
            os.close(fd)
            raise
        return fd, parts[-1] if parts else "."

    def at(path, call):
        fd, name = walk(path)
        try:
            return call(fd, name)
        finally:
            os.close(fd)

    def give(fd, name, dirfd, caller):
        # root serving a root-owned folder: what a user makes through it is that user's, as without the mount
        if os.geteuid() == 0 and caller[0] != 0:
            os.chown(name, caller[0], caller[1], dir_fd=dirfd, follow_symlinks=False) if fd is None else os.fchown(fd, caller[0], caller[1])

    def attrs(st):
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks", "st_ino", "st_rdev")
        out = {k: getattr(st, k) for k in keys}
        out.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return out

    class Passthrough(mfusepy.Operations):
        use_ns = True

        def init(self, path):
            ready()

        def getattr(self, path, fh=None):
            if fh is not None:
                return attrs(os.fstat(fh))
            return attrs(at(path, lambda d, n: os.stat(n, dir_fd=d, follow_symlinks=False)))

        def readdir(self, path, fh):
            def names(d, n):
                fd = os.open(n, D, dir_fd=d)
                try:
                    return [".", ".."] + os.listdir(fd)
                finally:
                    os.close(fd)
            return at(path, names)

        def readlink(self, path):
            return at(path, lambda d, n: os.readlink(n, dir_fd=d))

        def open(self, path, flags):
            harm.before("open", path)
            flags = (flags & ~(os.O_CREAT | os.O_EXCL)) | os.O_NOFOLLOW | os.O_CLOEXEC
            return at(path, lambda d, n: os.open(n, flags, dir_fd=d))

        def create(self, path, mode, flags=os.O_WRONLY):
            harm.before("open", path)
            caller = mfusepy.fuse_get_context()

            def make(d, n):
                fd = os.open(n, (flags & ~os.O_TRUNC) | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=d)
                give(fd, n, d, caller)
                return fd
            try:
                return at(path, make)
            except FileExistsError:  # an O_CREAT without O_EXCL of a file that is there: open it
                return at(path, lambda d, n: os.open(n, (flags & ~os.O_CREAT) | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d))

        def read(self, path, size, offset, fh):
            harm.before("read", path, size)
            return os.pread(fh, size, offset)

        def write(self, path, data, offset, fh):
            harm.before("write", path, len(data))
            return os.pwrite(fh, data, offset)

        def fsync(self, path, datasync, fh):
            harm.before("fsync", path)
            (os.fdatasync if datasync else os.fsync)(fh)
            return 0

        def flush(self, path, fh):
            return 0

        def release(self, path, fh):
            os.close(fh)
            return 0

        def truncate(self, path, length, fh=None):
            if fh is not None:
                os.ftruncate(fh, length)
                return 0
            def cut(d, n):
                fd = os.open(n, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d)
                try:
                    os.ftruncate(fd, length)
                finally:
                    os.close(fd)
            at(path, cut)
            return 0

        def unlink(self, path):
            at(path, lambda d, n: os.unlink(n, dir_fd=d))
            return 0

        def rmdir(self, path):
            at(path, lambda d, n: os.rmdir(n, dir_fd=d))
            return 0

        def mkdir(self, path, mode):
            caller = mfusepy.fuse_get_context()

            def make(d, n):
                os.mkdir(n, mode, dir_fd=d)
                give(None, n, d, caller)
            at(path, make)
            return 0

        def symlink(self, target, source):
            caller = mfusepy.fuse_get_context()

            def make(d, n):
                os.symlink(source, n, dir_fd=d)
                give(None, n, d, caller)
            at(target, make)
            return 0

        def link(self, target, source):
            fd, name = walk(source)
            try:
                at(target, lambda d, n: os.link(name, n, src_dir_fd=fd, dst_dir_fd=d, follow_symlinks=False))
            finally:
                os.close(fd)
            return 0

        def rename(self, old, new):
            fd, name = walk(old)
            try:
                at(new, lambda d, n: os.rename(name, n, src_dir_fd=fd, dst_dir_fd=d))
            finally:
                os.close(fd)
            return 0

        def chmod(self, path, mode):
            def change(d, n):
                if stat.S_ISLNK(os.stat(n, dir_fd=d, follow_symlinks=False).st_mode):
                    raise OSError(errno.EOPNOTSUPP, "a link's mode")
                fd = os.open(n, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d)
                try:
                    os.chmod("/proc/self/fd/%d" % fd, mode)
                finally:
                    os.close(fd)
            at(path, change)
            return 0

        def chown(self, path, uid, gid):
            at(path, lambda d, n: os.chown(n, uid, gid, dir_fd=d, follow_symlinks=False))
            return 0

        def utimens(self, path, times=None):
            at(path, lambda d, n: os.utime(n, ns=times, dir_fd=d, follow_symlinks=False) if times
               else os.utime(n, dir_fd=d, follow_symlinks=False))
            return 0

        def statfs(self, path):
            st = os.fstatvfs(base)
            return {k: getattr(st, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                                                "f_ffree", "f_favail", "f_namemax")}

    return Passthrough


def own_state(state):
    """``state`` when it is a file chaoskit names in its own state folder (``storage-io-<token>.json``)."""
    folder, name = os.path.split(valid(state, "the state file"))
    if not (name.startswith("storage-io-") and name.endswith(".json")):
        raise Refused(6, "refusing: %r is not a state file chaoskit names" % state)
    check_dir(folder)
    return state


def serve(argv):
    root, root_id, rel, folder_id, token, state, nspid, nsstart, config = argv
    cfg = json.loads(config)
    os.chdir("/")
    enter_job_namespace(nspid, nsstart)
    rootfd = open_root(root)
    if ident(os.fstat(rootfd)) != root_id:
        raise Refused(3, "refusing: the checkpoint folder %s is not the folder it was (it was replaced)" % root)
    parts = parts_of(root, rel)
    fd = descend(rootfd, parts, root, rel)
    folder = os.path.join(root, *parts)
    st = os.fstat(fd)
    if ident(st) != folder_id:
        raise Refused(3, "refusing: %s is not the folder it was (it was replaced)" % folder)
    if any(i == mnt_id(fd) and fstype == FSTYPE for i, _, fstype, _ in mounts(read_text("/proc/self/mountinfo"))):
        raise Refused(3, "refusing: a chaoskit FUSE mount is on %s already (one storage.slow or storage.error per "
                         "folder at a time)" % folder)
    fuse = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    opts = "fd=%d,rootmode=%o,user_id=0,group_id=0,allow_other,default_permissions" % (fuse, stat.S_IFMT(st.st_mode))
    if libc().mount((SOURCE_PREFIX + token).encode(), ("/proc/self/fd/%d" % fd).encode(), FSTYPE.encode(),
                    MS_NOSUID | MS_NODEV, opts.encode()) != 0:
        raise os_error("mount on %s" % folder)
    try:
        r, w = os.pipe()
        child = os.fork()
    except OSError:
        detach_all(token)
        raise
    if child == 0:  # the server: the folder's owner from here on, the mount's only /dev/fuse descriptor
        code = 1
        try:
            os.close(r)
            import mfusepy  # as root: the binding and libfuse3 may lie where the job's user cannot read
            Passthrough = passthrough(fd, Harm(cfg), mfusepy, lambda: os.write(w, b"r"))
            become(st)
            mfusepy.FUSE(Passthrough(), "/dev/fd/%d" % fuse, foreground=True)
            code = 0
        except BaseException as exc:  # noqa: B036 - said on the pipe, then the parent detaches
            try:
                os.write(w, ("x%s: %s" % (type(exc).__name__, exc)).encode()[:500])
            except OSError:
                pass
        finally:
            os._exit(code)
    os.close(w)
    os.close(fuse)  # the child's descriptor is the connection's only one: its death aborts the connection
    os.close(fd)
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.append(1))
    ready, _, _ = select.select([r], [], [], READY_S)
    said = os.read(r, 600) if ready else b""
    if said != b"r":
        detach_all(token)
        kill_daemons(token, 0)
        why = said[1:].decode("utf-8", "replace") if said.startswith(b"x") else "the FUSE daemon did not answer within %gs" % READY_S
        write_file(state, json.dumps({"failed": why}))
        return 1
    write_file(state, json.dumps({"pid": os.getpid(), "child": child, "mount": folder, "t": time.time()}))
    reaped = []

    def ended():
        if not reaped and os.waitpid(child, os.WNOHANG)[0] != 0:
            reaped.append(child)
        return bool(reaped)
    while not stop and not ended():
        time.sleep(0.1)
    detach_all(token)  # however the server ended: no mount point is left behind it
    end = time.time() + GRACE_S  # stopped: the server ends once the files still open through the mount are closed
    while not ended() and time.time() < end:
        time.sleep(0.05)
    if not ended():
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    return 0


def main():
    op, args = sys.argv[1], sys.argv[2:]
    try:
        if op == "probe":
            root, rel = args
            parts = parts_of(root, rel)
            rootfd = open_root(root)
            out = {"folder": os.path.join(root, *parts), "rel": "/".join(parts) or ".", "root_id": ident(os.fstat(rootfd)),
                   "fuse": os.path.exists("/dev/fuse")}
            fd = descend(rootfd, parts, root, rel)
            out["folder_id"] = ident(os.fstat(fd))
            here = os.open(".", os.O_PATH | os.O_CLOEXEC, dir_fd=fd)
            out["mounted_here"] = any(i == mnt_id(here) for i, _, fstype, _ in mounts(read_text("/proc/self/mountinfo"))
                                      if fstype == FSTYPE)
            os.close(here)
            os.close(fd)
            try:
                import mfusepy  # the binding the daemon uses: libfuse3 through ctypes
                out["binding"] = "mfusepy %s (%s)" % (getattr(mfusepy, "__version__", "?"), getattr(mfusepy, "_libfuse_path", "?"))
            except (ImportError, OSError, AttributeError) as exc:
                out["binding"], out["binding_error"] = None, str(exc)
            print(json.dumps(out))
        elif op == "serve":
            token_ok(args[4])
            state = own_state(args[5])
            try:
                code = serve(args)
            except (Refused, OSError, ValueError) as exc:
                write_file(state, json.dumps({"failed": str(exc), "code": getattr(exc, "code", 1)}))
                raise Refused(getattr(exc, "code", 1), str(exc))
            sys.exit(code)
        elif op in ("unmount", "check"):
            token, state = token_ok(args[0]), own_state(args[1])
            if op == "check":
                found = ours(token)
                left = ["mount %s (in %d mount namespace%s)" % (point, len(found), "s" if len(found) > 1 else "")
                        for point in sorted({p for _, hits in found.values() for _, p in hits})]
                left += ["daemon pid %d" % p for p, _ in daemons(token) if proc_state(p) not in (None, "Z")]
                print("; ".join(left))
                return
            problems = detach_all(token)
            kill_daemons(token, GRACE_S)
            problems += detach_all(token)  # a namespace made meanwhile
            if problems:
                raise Refused(3, "could not detach: %s" % "; ".join(problems))
            try:
                os.unlink(state)
            except FileNotFoundError:
                pass
        else:
            raise Refused(6, "unknown operation %r" % op)
    except Refused as exc:
        sys.stderr.write("%s\n" % exc)
        sys.exit(exc.code)


if __name__ == "__main__":
    main()
