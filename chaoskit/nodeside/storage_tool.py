"""storage.corrupt's and storage.full's tool: aside, truncate, flip, remove and put back a checkpoint; fill a file
system and empty it again. ``ASIDE``, ``FILL``, ``FLIPS`` and ``REFUSED`` come in front of it.

``python3 -I -c STORAGE_TOOL OP ...`` on the node. Every operation opens the checkpoint folder ``ROOT`` from ``/``
without following a link anyone but root could have made (exit 5 otherwise), then acts as the folder's owner (the
job's user) and goes down from it through directory fds by name: no ``..``, no link followed (exit 2: the scenario's
``path`` leaves the folder). Files it makes are ``O_CREAT|O_EXCL|O_NOFOLLOW`` or ``mkdir``; modes and times are set on
its own fds. What a revert needs comes on its command line (``*_ID`` are ``device:inode`` recorded at inject) and is
checked again: anything replaced meanwhile is refused (exit 3) and left alone.

``find ROOT PATH PATTERN``, ``corrupt|restore|check ROOT ROOT_ID FILE PARENT_ID ASIDE ORIG_ID ORIG_UID MODE``
(``FILE`` relative to ``ROOT``, ``ASIDE`` a name in its folder), ``statfs ROOT PATH``,
``fill ROOT ROOT_ID PATH FOLDER_ID NAME LIMIT``, ``unfill|filled ROOT ROOT_ID PATH FOLDER_ID NAME``.
"""

import errno, fnmatch, json, os, secrets, stat, sys


def main():
    D = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    W = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    def die(code, msg):
        sys.stderr.write(msg + "\n")
        sys.exit(code)
    def ident(st):
        return "%d:%d" % (st.st_dev, st.st_ino)
    def checked(value, what):
        if not value or len(value) > 4096 or any(ord(c) < 32 or c == "\x7f" for c in value):
            die(6, "refusing: %s %r is not a valid path" % (what, value))
        return value
    def name_ok(name, prefix):
        if not name.startswith(prefix) or "/" in name or len(name) > 255 or not name[len(prefix):].isalnum():
            die(6, "refusing: %r is not a name chaoskit makes (%s<token>)" % (name, prefix))
        return name
    def id_ok(value):
        dev, _, ino = value.partition(":")
        if not (dev.isdigit() and ino.isdigit()):
            die(6, "refusing: %r is not a device:inode" % value)
        return value
    def lstat_at(fd, name):
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
    def step_at(fd, name, partial, missing):
        # The next name of a walk, not followed: its lstat; None when it is not there and the walk may stop
        # short (partial), else exit 1 with MISSING.
        st = lstat_at(fd, name)
        if st is None and not partial:
            die(1, missing)
        return st
    def into(fd, name):
        # The folder NAME of FD, opened by name without following a link; FD is closed.
        nfd = os.open(name, D, dir_fd=fd)
        os.close(fd)
        return nfd
    def open_root(root, partial=False):
        # The checkpoint folder, walked from / without following a link anyone but root could have made.
        # partial: the nearest folder there is on the way when it does not exist (yet), and whether it is the folder.
        checked(root, "the checkpoint folder")
        if not root.startswith("/"):
            die(5, "refusing: the checkpoint folder %r is not an absolute path" % root)
        fd, parts, hops = os.open("/", D), [p for p in root.split("/") if p not in ("", ".")], 0
        while parts:
            name = parts.pop(0)
            st = step_at(fd, name, partial, "the checkpoint folder %s does not exist" % root)
            if st is None:
                return fd, False
            if stat.S_ISLNK(st.st_mode):
                here = os.fstat(fd)
                hops += 1
                if st.st_uid != 0 or here.st_uid != 0 or here.st_mode & 0o022 or hops > 40:
                    die(5, "refusing: the checkpoint folder %s has a symbolic link (%s -> %s) that a user other than root "
                           "can change; give its real path" % (root, name, os.readlink(name, dir_fd=fd)))
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", D)
                parts = [p for p in target.split("/") if p not in ("", ".")] + parts
                continue
            if not stat.S_ISDIR(st.st_mode):
                die(1, "the checkpoint folder %s is not a folder" % root)
            fd = into(fd, name)  # ".." included: never a link
        return (fd, True) if partial else fd
    def become(rootfd):
        # Act as the owner of the checkpoint folder (the job's user), not as root.
        st = os.fstat(rootfd)
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
    def parts_of(root, rel):
        checked(rel, "path")
        if rel.startswith("/"):
            top, norm = os.path.normpath(root).rstrip("/"), os.path.normpath(rel)
            if norm == top:
                rel = "."
            elif norm.startswith(top + "/"):
                rel = norm[len(top) + 1:]
            else:
                die(2, "%s is outside the job's checkpoint folder %s" % (rel, root))
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if ".." in parts:
            die(2, "%s leaves the job's checkpoint folder %s ('..')" % (rel, root))
        return parts
    def descend(fd, parts, root, rel, partial=False):
        # Down from the root by names: no "..", no link. Returns (fd, how many parts were there).
        for i, name in enumerate(parts):
            where = os.path.join(root, *parts[:i + 1])
            st = step_at(fd, name, partial, "%s does not exist" % where)
            if st is None:
                return fd, i
            if stat.S_ISLNK(st.st_mode):
                die(2, "%s: %s is a symbolic link (to %s); storage faults follow no links, so it counts as outside the "
                       "job's checkpoint folder %s" % (rel, where, os.readlink(name, dir_fd=fd), root))
            if not stat.S_ISDIR(st.st_mode):
                die(2, "%s: %s is not a folder" % (rel, where))
            fd = into(fd, name)
        return fd, len(parts)
    def enter(root, root_id, rel, folder_id):
        # The folder REL of ROOT as chaoskit saw it at inject: the same inodes, as the folder's owner.
        rootfd = open_root(root)
        if root_id is not None and ident(os.fstat(rootfd)) != id_ok(root_id):
            die(3, "refusing: the checkpoint folder %s is not the folder it was at inject (inode %s now, %s then): it was "
                   "replaced; nothing was touched" % (root, ident(os.fstat(rootfd)), root_id))
        become(rootfd)
        fd, _ = descend(rootfd, parts_of(root, rel), root, rel)
        if folder_id is not None and ident(os.fstat(fd)) != id_ok(folder_id):
            die(3, "refusing: %s is not the folder it was at inject (inode %s now, %s then): it was replaced; nothing "
                   "was touched" % (os.path.join(root, rel), ident(os.fstat(fd)), folder_id))
        return fd
    def copy(src, dst, count):
        left, off = count, 0
        while left > 0:
            block = os.pread(src, min(left, 1 << 20), off)
            if not block:
                break
            view = memoryview(block)
            while view:
                n = os.write(dst, view)
                view = view[n:]
            off += len(block)
            left -= len(block)
    def remove_tree(parent, name, depth=0):
        # Remove NAME in the folder PARENT through fds: nothing below it is followed.
        st = lstat_at(parent, name)
        if st is None:
            return
        if not stat.S_ISDIR(st.st_mode) or depth > 32:
            os.unlink(name, dir_fd=parent)
            return
        fd = os.open(name, D, dir_fd=parent)
        try:
            for entry in os.listdir(fd):
                remove_tree(fd, entry, depth + 1)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent)
    def aside_of(parent, aside, orig_id, orig_uid, where):
        # The aside folder and its original, or (None, None) when there is none; refused when not what chaoskit made.
        st = lstat_at(parent, aside)
        if st is None:
            return None, None
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            die(3, "refusing: %s is not the aside folder chaoskit made (%s, owner %d, mode %o): it was replaced; nothing "
                   "was put back" % (where, "a symbolic link" if stat.S_ISLNK(st.st_mode) else "type %o" % stat.S_IFMT(st.st_mode),
                                     st.st_uid, stat.S_IMODE(st.st_mode)))
        fd = os.open(aside, D, dir_fd=parent)
        orig = lstat_at(fd, "original")
        if orig is not None and (not stat.S_ISREG(orig.st_mode) or ident(orig) != orig_id or orig.st_uid != orig_uid):
            die(3, "refusing: %s/original is not the checkpoint chaoskit moved aside (inode %s, owner %d; it moved inode "
                   "%s, owner %d): it was replaced; nothing was put back" % (where, ident(orig), orig.st_uid, orig_id, orig_uid))
        return fd, orig
    op = sys.argv[1]
    if op in ("corrupt", "restore", "check"):
        root, root_id, rel, parent_id, aside, orig_id, orig_uid, mode = sys.argv[2:10]
        name_ok(aside, ASIDE)
        orig_id, orig_uid = id_ok(orig_id), int(orig_uid)
        if mode not in ("truncate", "flip", "remove"):
            die(6, "refusing: mode %r" % mode)
        parts = parts_of(root, rel)
        if not parts:
            die(6, "refusing: %r names no file" % rel)
        parent = enter(root, root_id, "/".join(parts[:-1]) or ".", parent_id)
        name, target = parts[-1], os.path.join(root, *parts)
        where = os.path.join(os.path.dirname(target), aside)
    if op == "find":
        root, rel, pattern = sys.argv[2], sys.argv[3], sys.argv[4]
        rootfd = open_root(root)
        root_id = ident(os.fstat(rootfd))
        become(rootfd)
        parts = parts_of(root, rel)
        fd, _ = descend(rootfd, parts, root, rel)
        best = None
        for dirpath, dirnames, filenames, dirfd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in filenames:
                if name.startswith(".") or not fnmatch.fnmatchcase(name, pattern):
                    continue
                st = lstat_at(dirfd, name)
                if st is None or not stat.S_ISREG(st.st_mode):
                    continue
                sub = os.path.normpath(os.path.join(*(parts + [dirpath, name])))
                key = (st.st_mtime_ns, sub)
                if best is None or key > best[0]:
                    best = (key, sub, st, ident(os.fstat(dirfd)))
        out = {"root": root, "root_id": root_id, "folder": os.path.join(root, *parts)}
        if best is not None:
            _, sub, st, parent_id = best
            out.update(checkpoint=os.path.join(root, sub), rel=sub, id=ident(st), uid=st.st_uid, bytes=st.st_size,
                       parent_id=parent_id)
        print(json.dumps(out))
    elif op == "corrupt":
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), dir_fd=parent)
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode) or ident(st) != orig_id:
            die(3, "refusing: %s is no longer the checkpoint that was found (inode %s now, %s then); nothing was injected"
                   % (target, ident(st), orig_id))
        try:
            os.mkdir(aside, 0o700, dir_fd=parent)  # fails if anything is there already; never follows a link
        except FileExistsError:
            die(3, "refusing: %s is there already and chaoskit did not make it; nothing was injected" % where)
        afd = os.open(aside, D, dir_fd=parent)
        now = None
        if mode != "remove":
            out = os.open("corrupted", W, 0o600, dir_fd=afd)
            try:
                if mode == "truncate":
                    copy(src, out, st.st_size // 2)
                else:
                    copy(src, out, st.st_size)
                    count = min(FLIPS, st.st_size)
                    for off in sorted({(st.st_size - 1) * i // max(1, count - 1) for i in range(count)}) if st.st_size else []:
                        b = os.pread(src, 1, off)
                        os.pwrite(out, bytes([b[0] ^ 0xFF]), off)
                if os.geteuid() == 0:
                    os.fchown(out, st.st_uid, st.st_gid)
                os.fchmod(out, stat.S_IMODE(st.st_mode) & 0o777)
                os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
                os.fsync(out)
                now = os.fstat(out).st_size
            finally:
                os.close(out)
        os.rename(name, "original", src_dir_fd=parent, dst_dir_fd=afd)
        moved = lstat_at(afd, "original")
        if moved is None or ident(moved) != orig_id:  # swapped between the look and the rename: give it back
            if moved is not None:
                os.rename("original", name, src_dir_fd=afd, dst_dir_fd=parent)
            remove_tree(parent, aside)
            die(3, "refusing: %s was replaced while it was being moved aside; nothing was injected" % target)
        if mode != "remove":
            tmp = ".chaoskit-tmp-" + secrets.token_hex(8)
            os.link("corrupted", tmp, src_dir_fd=afd, dst_dir_fd=parent, follow_symlinks=False)  # fails if tmp exists
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        os.fsync(afd)
        os.fsync(parent)
        print(json.dumps({"checkpoint": target, "bytes": st.st_size, "now": now, "aside": where}))
    elif op == "restore":
        afd, orig = aside_of(parent, aside, orig_id, orig_uid, where)
        if afd is None:
            print(json.dumps({"restored": False, "why": "nothing kept aside", "checkpoint": target}))
            sys.exit(0)
        now = lstat_at(parent, name)
        corrupted = lstat_at(afd, "corrupted")
        if orig is None:
            why = ("the original was never moved aside" if now is not None and ident(now) == orig_id
                   else "the original was no longer in the aside folder; nothing to put back")
            restored = False
        elif now is None or (mode != "remove" and corrupted is not None and ident(now) == ident(corrupted)):
            os.rename("original", name, src_dir_fd=afd, dst_dir_fd=parent)
            os.fsync(parent)
            why, restored = ("put back (the corrupted file had been removed meanwhile)" if now is None and mode != "remove" else "put back"), True
        else:
            why, restored = "the job wrote a new %s meanwhile; kept the job's" % name, False
        os.close(afd)
        remove_tree(parent, aside)
        os.fsync(parent)
        print(json.dumps({"restored": restored, "why": why, "checkpoint": target}))
    elif op == "check":
        afd, orig = aside_of(parent, aside, orig_id, orig_uid, where)
        print("the original is still kept aside in %s" % where if afd is not None else "")
    elif op == "statfs":
        root, rel = sys.argv[2], sys.argv[3]
        parts = parts_of(root, rel)
        rootfd, there = open_root(root, partial=True)  # before the job starts, its folder may not exist yet
        out = {"folder": os.path.join(root, *parts), "rel": "/".join(parts) or "."}
        fd, depth = rootfd, -1
        if there:
            out["root_id"] = ident(os.fstat(rootfd))
            become(rootfd)
            fd, depth = descend(rootfd, parts, root, rel, partial=True)
        st = os.fstatvfs(fd)
        out.update(free=st.f_bavail * st.f_frsize, total=st.f_blocks * st.f_frsize)
        if depth == len(parts):
            out["folder_id"] = ident(os.fstat(fd))
        print(json.dumps(out))
    elif op == "fill":
        root, root_id, rel, folder_id, name, limit = sys.argv[2:8]
        name_ok(name, FILL)
        limit = int(limit)
        fd = enter(root, root_id, rel, folder_id)
        folder = os.path.join(root, *parts_of(root, rel))
        st = os.fstatvfs(fd)
        free = st.f_bavail * st.f_frsize
        if free > limit:
            die(REFUSED, "the file system of %s has %d bytes free, more than the limit of %d" % (folder, free, limit))
        try:
            out = os.open(name, W, 0o600, dir_fd=fd)  # fails if anything is there already; never follows a link
        except FileExistsError:
            die(3, "refusing: %s is there already and chaoskit did not make it; nothing was injected"
                   % os.path.join(folder, name))
        written, block, full = 0, b"\0" * (1 << 20), False
        try:
            while written < limit:
                try:
                    n = os.write(out, block[: min(len(block), limit - written)])
                except OSError as exc:
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    full = True
                    break
                written += n
            try:
                os.fsync(out)
            except OSError:
                pass
        finally:
            os.close(out)
        left = os.fstatvfs(fd)
        print(json.dumps({"file": os.path.join(folder, name), "bytes": written, "free_before": free,
                          "free_after": left.f_bavail * left.f_frsize, "full": full}))
    elif op in ("unfill", "filled"):
        root, root_id, rel, folder_id, name = sys.argv[2:7]
        name_ok(name, FILL)
        fd = enter(root, root_id, rel, folder_id)
        path = os.path.join(root, *(parts_of(root, rel) + [name]))
        st = lstat_at(fd, name)
        if st is not None and (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid()):
            die(3, "refusing: %s is not the fill file chaoskit wrote (%s, owner %d): it was replaced; left alone"
                   % (path, "a symbolic link" if stat.S_ISLNK(st.st_mode) else "type %o" % stat.S_IFMT(st.st_mode), st.st_uid))
        if op == "filled":
            print("the fill file %s is still there" % path if st is not None else "")
        elif st is not None:
            os.unlink(name, dir_fd=fd)
            os.fsync(fd)
    else:
        die(6, "unknown operation %r" % op)


if __name__ == "__main__":
    main()
