"""inproc.*'s node side: write a process's fault order into the in-process channel folder, wait for its answer
and its firing, take the order back, and end a process that missed its fault's end.

``python3 -I -c HELPER order|wait|clear|end FOLDER PID ...`` (nodefs in front). FOLDER, named ``inproc``, is
either chaoskit's own, in the node's state folder (made and checked as nodefs makes a state folder's), or the
channel of a job that runs as another account (``RUN.job/inproc``, that account's, where the job writes its
answers): walked from ``/`` one name at a time with ``O_NOFOLLOW`` (no link anywhere on the way), every folder
above it root's, ours or that account's and writable by nobody else (sticky ones aside), the channel itself a
folder of that account's that nobody else may write. Every name in it is then reached from the folder's
descriptor: an answer is read ``O_NOFOLLOW|O_NONBLOCK``, only as a regular file of the folder's owner with one
link, at most 64 KiB; an order is made under a random name ``O_CREAT|O_EXCL|O_NOFOLLOW`` and renamed
over its name (a link planted there is replaced, never followed); names are unlinked from the descriptor.
"""

import json, os, signal, stat, sys, time

MAX_ANSWER = 1 << 16
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _folder(path):
    """``(descriptor, owner)``: the channel folder ``path`` opened, and the uid whose answers count there."""
    if not os.path.isabs(path) or ".." in path.split("/") or os.path.basename(path) != "inproc":
        raise StateDirError("%s is not chaoskit's in-process channel folder" % path)
    path = os.path.normpath(path)
    euid = os.geteuid()
    try:
        parent_uid = os.lstat(os.path.dirname(path)).st_uid
    except OSError as exc:
        raise StateDirError("the in-process channel folder %s: %s" % (path, exc.strerror))
    if parent_uid == euid:  # chaoskit's own state folder: checked, and the channel made in it, as nodefs does
        base = check_dir(os.path.dirname(path))
        make_dirs(base, path)
        return os.open(path, _OPEN_DIR), euid
    return _walk(path, euid)


def _walk(path, euid):
    """A job's own channel folder, opened from ``/`` one name at a time without following any link."""
    fd, above = os.open("/", _OPEN_DIR), []
    try:
        parts = [p for p in path.split("/") if p]
        for i, part in enumerate(parts):
            try:
                nfd = os.open(part, _OPEN_DIR, dir_fd=fd)
            except OSError as exc:
                raise StateDirError("refusing the in-process channel folder %s: %s (%s; a link is never followed)"
                                    % (path, "/" + "/".join(parts[:i + 1]), exc.strerror))
            above.append(os.fstat(fd))
            os.close(fd)
            fd = nfd
        st = os.fstat(fd)
        owner = st.st_uid
        if st.st_mode & 0o022:
            raise StateDirError("refusing the in-process channel folder %s: others than its owner may write in it "
                                "(mode %04o)" % (path, stat.S_IMODE(st.st_mode)))
        for pst in above:
            if pst.st_uid not in (0, euid, owner) or pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX:
                raise StateDirError("refusing the in-process channel folder %s: a folder above it may be changed by "
                                    "another user" % path)
        return fd, owner
    except BaseException:
        os.close(fd)
        raise


def _status(folder, pid):
    """The process's answer, or ``None``: a file of anyone's but the folder's owner (ours too, say an order the
    job renamed) is no answer."""
    dfd, owner = folder
    try:
        fd = os.open("status-%d.json" % pid, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != owner:
            return None
        data = os.read(fd, MAX_ANSWER + 1)
        if len(data) > MAX_ANSWER:
            return None
        return json.loads(data.decode("utf-8", "replace"))
    except (OSError, ValueError, TypeError, RecursionError):
        return None
    finally:
        os.close(fd)


def _write_order(folder, pid, text):
    """``order-PID.json`` replaced atomically: a new file of ours (0644: the folder keeps others out) under a
    random name, renamed over it."""
    dfd = folder[0]
    tmp = ".order-%d.%s.tmp" % (pid, random_name())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
    try:
        os.fchmod(fd, 0o644)
        _fs_write_all(fd, text)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, "order-%d.json" % pid, src_dir_fd=dfd, dst_dir_fd=dfd)
    except OSError:
        _unlink(folder, tmp)
        raise


def _unlink(folder, name):
    try:
        os.unlink(name, dir_fd=folder[0])
    except FileNotFoundError:
        pass


def _start_time(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2:].split()[19].decode()


def _take_back(folder, pid, status=False):
    for name in ("order", "status") if status else ("order",):
        _unlink(folder, "%s-%d.json" % (name, pid))


def main():
    op, folder, pid = sys.argv[1], _folder(sys.argv[2]), int(sys.argv[3])
    def _wait(oid, timeout, wanted):
        end = time.time() + timeout
        while True:
            st = _status(folder, pid)
            if isinstance(st, dict) and (st.get("status") == "refused" or st.get("id") == oid and st.get("status") in wanted):
                return st
            if not os.path.exists("/proc/%d" % pid):
                return {"status": "gone"}
            if time.time() >= end:
                return {"status": "timeout", "last": st}
            time.sleep(0.02)

    if op == "order":  # ORDER [ID CHECKIN_S FIRE_S]: write it; then wait for its answer, and for it to fire
        _unlink(folder, "status-%d.json" % pid)
        _write_order(folder, pid, sys.argv[4])
        if len(sys.argv) == 5:
            print(json.dumps({"ok": True}))
        else:
            oid, checkin, fire = sys.argv[5], float(sys.argv[6]), float(sys.argv[7])
            st = _wait(oid, checkin, ("armed", "fired", "ended"))
            if st.get("status") == "armed":
                st = _wait(oid, fire, ("fired", "ended"))
                if st.get("status") == "timeout":
                    st["status"] = "unfired"
            print(json.dumps(st))
    elif op == "wait":
        print(json.dumps(_wait(sys.argv[4], float(sys.argv[5]), sys.argv[6].split(","))))
    elif op == "clear":
        _take_back(folder, pid, status=True)
        print(json.dumps({"ok": True}))
    elif op == "end":
        start, oid, grace = sys.argv[4], sys.argv[5], float(sys.argv[6])
        _take_back(folder, pid)
        end = time.time() + grace
        while time.time() < end:
            st = _status(folder, pid)
            if _start_time(pid) != start or isinstance(st, dict) and st.get("id") == oid and st.get("status") == "ended":
                _take_back(folder, pid, status=True)
                print(json.dumps({"killed": False}))
                sys.exit(0)
            if st is None:  # no answer left: another end of this fault (its lease's watchdog, at the same deadline) took it back
                print(json.dumps({"killed": False, "ended_by": "another end of the fault"}))
                sys.exit(0)
            time.sleep(0.05)
        fd = None
        if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                fd = None
        if _start_time(pid) != start:
            print(json.dumps({"killed": False}))
            sys.exit(0)
        if fd is not None:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        _take_back(folder, pid, status=True)
        print(json.dumps({"killed": True, "why": "the process missed the end of its in-process fault"}))
    else:
        sys.exit("unknown op")


if __name__ == "__main__":
    main()
