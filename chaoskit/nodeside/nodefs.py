"""chaoskit's files on a node: one private state folder, and files made there without following links.

Standard library only, Python 3.6+. It runs on the node in three ways, never installed there: the agent
(:mod:`chaoskit.nodeside.agent`), the lease watchdog (:mod:`chaoskit.nodeside.watchdog`) and
every fault's helper script carry its source in front of their own (:func:`bundle`), and they run with
``python3 -I``, so nothing is imported from the node's ``sys.path``, its current folder or ``PYTHON*``.

Contract, for a node where other local users may be hostile:

- **The state folder** is ``/run/chaoskit`` when the effective user is root, else
  ``~/.local/state/chaoskit`` of the effective user (its home from the password database, not ``$HOME``),
  or the folder the inventory names (``workdir``). It is made mode 0700 when missing and, made or found,
  must pass :func:`check_dir`: a real directory (``lstat``: not a symbolic link) owned by the effective
  uid and writable by nobody else; every folder above it owned by root or that uid and writable by others
  only when sticky (``/tmp``), every link on the way owned by root or that uid. Anything else is refused
  with :class:`StateDirError`, whose message names the path and what is wrong; nothing is written there.
- **Files** are made inside it only: :func:`create_file` (``O_CREAT|O_EXCL|O_NOFOLLOW``), :func:`write_file`
  (a random temp name made the same way in the same folder, then an atomic rename over the target),
  :func:`touch_file` (``O_NOFOLLOW``), :func:`read_file` (``O_NOFOLLOW``, regular files only, bounded),
  :func:`make_dirs` (each level ``mkdir`` 0700, then checked), :func:`remove_tree` (never follows a link).
  :func:`inside` tells a path of the state folder from one that is not.
"""

import os
import shutil
import stat

__all__ = [
    "StateDirError", "ROOT_STATE_DIR", "REVERT_FILE", "default_state_dir", "state_dir", "check_dir", "ensure_dir", "inside",
    "make_dirs", "create_file", "write_file", "touch_file", "read_file", "remove_tree", "random_name", "bundle",
]

ROOT_STATE_DIR = "/run/chaoskit"
"""Root's state folder: /run is root's own tmpfs, so nothing there outlives a reboot or is anyone else's."""
REVERT_FILE = "revert.json"
"""In a lease folder: the revert its watchdog runs, a JSON list of argv (never on a command line, which every user
of the node can read, and a revert may carry a secret)."""


class StateDirError(OSError):
    """A state folder (or a file in it) chaoskit will not use; the message names the path and why."""


def default_state_dir():
    """Where the effective user's state folder is: :data:`ROOT_STATE_DIR` for root, else in its home."""
    euid = os.geteuid()
    if euid == 0:
        return ROOT_STATE_DIR
    try:
        import pwd

        home = pwd.getpwuid(euid).pw_dir
    except (ImportError, KeyError):
        raise StateDirError("uid %d has no entry in the password database, so chaoskit has no home folder for its "
                            "state on this node; name one with the inventory's workdir" % euid)
    return os.path.join(home, ".local", "state", "chaoskit")


def state_dir(wanted=None):
    """The verified state folder: ``wanted`` (an absolute path) or :func:`default_state_dir`, made if missing."""
    return ensure_dir(wanted or default_state_dir())


def ensure_dir(path):
    """Make ``path`` (mode 0700, with any missing folders above it) unless it exists; return it once
    :func:`check_dir` accepts it. Raises :class:`StateDirError`."""
    if not isinstance(path, str) or not os.path.isabs(path):
        raise StateDirError("chaoskit's state folder must be an absolute path, not %r" % (path,))
    path = os.path.normpath(path)
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if existing != path:  # nothing is made inside a folder someone else could change
        _fs_check_above(path, existing, os.geteuid(), include=True)
    parent = os.path.dirname(path)
    if not os.path.lexists(parent):
        try:
            os.makedirs(parent, 0o700)
        except OSError as exc:
            raise StateDirError("cannot make %s for chaoskit's state folder %s: %s" % (parent, path, exc.strerror))
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StateDirError("cannot make chaoskit's state folder %s: %s" % (path, exc.strerror))
    check_dir(path)
    return path


def check_dir(path):
    """Refuse (:class:`StateDirError`) a state folder someone else could change: see the module's contract."""
    euid = os.geteuid()
    path = os.path.normpath(path)
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise StateDirError("chaoskit's state folder %s: %s" % (path, exc.strerror))
    problem = _fs_own_problem(st, euid)
    if problem is not None:
        raise StateDirError("refusing chaoskit's state folder %s: it %s" % (path, problem))
    for chain in (path, os.path.realpath(path)):
        _fs_check_above(path, chain, euid)
    return path


def inside(base, path):
    """``path`` normalised, when it lies strictly inside the folder ``base``; else :class:`StateDirError`."""
    if not isinstance(path, str) or not os.path.isabs(path) or ".." in path.split("/"):
        raise StateDirError("%r is not a path inside chaoskit's state folder %s" % (path, base))
    norm = os.path.normpath(path)
    if not norm.startswith(base.rstrip("/") + "/"):
        raise StateDirError("%s is not inside chaoskit's state folder %s" % (path, base))
    return norm


def make_dirs(base, path):
    """Make the folders from ``base`` (a checked state folder) down to ``path`` inside it, each 0700 and
    checked to be a real folder of ours; return ``path``."""
    path = inside(base, path)
    current = base.rstrip("/")
    euid = os.geteuid()
    for part in path[len(current) + 1:].split("/"):
        current = current + "/" + part
        try:
            os.mkdir(current, 0o700)
        except FileExistsError:
            pass
        problem = _fs_own_problem(os.lstat(current), euid)
        if problem is not None:
            raise StateDirError("refusing %s: it %s" % (current, problem))
    return path


def create_file(path, data="", mode=0o600):
    """Create ``path``, which must not exist (not even as a link), holding ``data``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
        _fs_write_all(fd, data)
    finally:
        os.close(fd)


def write_file(path, data, mode=0o600):
    """Replace ``path`` atomically with ``data``: a new file under a random name beside it, renamed over it
    (a rename replaces a link planted at ``path`` itself, never what it points to)."""
    tmp = os.path.join(os.path.dirname(path), ".%s.%s.tmp" % (os.path.basename(path)[:64], random_name()))
    create_file(tmp, data, mode)
    try:
        os.replace(tmp, path)
    except OSError:
        _fs_unlink(tmp)
        raise


def touch_file(path):
    """Create ``path`` (empty) or update its modification time; refuses a link and anything but a regular file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StateDirError("refusing %s: it is not a regular file" % path)
        if os.utime in os.supports_fd:
            os.utime(fd)
        else:
            os.utime(path)
    finally:
        os.close(fd)


def read_file(path, limit=1 << 20):
    """The first ``limit`` bytes of the regular file ``path`` as text, or ``None`` when it does not exist;
    a link there is refused (``OSError``), never followed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StateDirError("refusing to read %s: it is not a regular file" % path)
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(fd)


def remove_tree(path):
    """Remove ``path`` and what is under it; a link anywhere (``path`` itself included) is removed, never followed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        _fs_unlink(path)
        return
    if not getattr(shutil.rmtree, "avoids_symlink_attacks", True):
        raise StateDirError("refusing to remove %s: this Python's rmtree could follow links" % path)
    shutil.rmtree(path, ignore_errors=True)


def random_name():
    """16 random hex digits: a name nobody can guess in advance."""
    return os.urandom(8).hex()


def bundle(source, *modules, **constants):
    """On the controller: this module's source, then each of ``modules``' (other stdlib-only node-side modules,
    such as :mod:`chaoskit.nodeside.jobscope`), then ``NAME = value`` for each of ``constants`` (Python literals),
    then ``source``: one self-contained program to run on a node with ``python3 -I``."""
    parts = []
    for path in [__file__] + [m.__file__ for m in modules]:
        with open(path, encoding="utf-8") as fh:
            parts.append(fh.read())
    lines = ["%s = %r" % (name, value) for name, value in sorted(constants.items())]
    return "\n".join(parts) + "\n" + "".join(line + "\n" for line in lines) + "\n" + source


def _fs_own_problem(st, euid):
    """What is wrong with a folder that must be ours, or ``None``."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != euid:
        return "is owned by %s, not by %s (the user chaoskit runs as)" % (_fs_user(st.st_uid), _fs_user(euid))
    if st.st_mode & 0o022:
        return "is writable by others than its owner (mode %04o)" % stat.S_IMODE(st.st_mode)
    return None


def _fs_check_above(path, chain, euid, include=False):
    """Every folder above ``chain`` (and ``chain`` itself with ``include``) may be changed only by root or ``euid``."""
    above = chain if include else os.path.dirname(chain)
    while True:
        try:
            st = os.lstat(above)
        except OSError as exc:
            raise StateDirError("chaoskit's state folder %s: %s: %s" % (path, above, exc.strerror))
        problem = _fs_above_problem(st, euid)
        if problem is not None:
            raise StateDirError("refusing chaoskit's state folder %s: %s, a folder above it, %s" % (path, above, problem))
        if above == "/":
            return
        above = os.path.dirname(above)


def _fs_above_problem(st, euid):
    """What is wrong with a folder (or link) above a state folder, or ``None``."""
    if st.st_uid not in (0, euid):
        return "is owned by %s (neither root nor %s)" % (_fs_user(st.st_uid), _fs_user(euid))
    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return "is writable by others and not sticky (mode %04o)" % stat.S_IMODE(st.st_mode)
    return None


def _fs_user(uid):
    try:
        import pwd

        return "uid %d (%s)" % (uid, pwd.getpwuid(uid).pw_name)
    except (ImportError, KeyError):
        return "uid %d" % uid


def _fs_write_all(fd, data):
    view = memoryview(data.encode("utf-8") if isinstance(data, str) else data)
    while view:
        view = view[os.write(fd, view):]


def _fs_unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
