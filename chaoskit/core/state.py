"""Where chaoskit keeps state between commands: locks, leases, labs, active runs and their journals.

``$CHAOSKIT_STATE_DIR``, else ``/var/lib/chaoskit`` for root and ``~/.local/state/chaoskit``
for anyone else. The folder is made 0700 and must stay the effective user's own: what
``chaoskit rollback`` runs comes from the journals kept here (:func:`private_dir`), never from
the copies in a run folder that other people can read.

Labs and locks are per user (issue 51): a user who is not root never takes a state folder, a lab's record or a run
lock that another user owns (``$CHAOSKIT_STATE_DIR`` naming a shared ``/var/lib/chaoskit``, a record root wrote
there under ``sudo -E``). :func:`state_dir` says so in one line and uses the user's own folder; :func:`not_ours` is
the same test for a lab record or a lock found in it. Sharing them is on purpose only: ``CHAOSKIT_SHARED_STATE=1``
(:data:`SHARED_ENV`) honours another user's lab records and locks in the user's state folder; root's state
(``sudo chaoskit ...``) is the one every admin shares.
"""

from __future__ import annotations

import os
import pwd
import stat
import sys
from pathlib import Path

from chaoskit.core.errors import InfraError

__all__ = ["state_dir", "private_dir", "private_problem", "lstat_no_link", "not_ours", "SHARED_ENV"]

SHARED_ENV = "CHAOSKIT_SHARED_STATE"
"""``1``: another user's lab records and locks in this user's state folder are honoured (shared on purpose)."""

_SAID: set[str] = set()


def _say_once(line: str) -> None:
    """One line on stderr, once per process: state_dir() is asked for on every lock, lease and lab record."""
    if line not in _SAID:
        _SAID.add(line)
        sys.stderr.write(f"chaoskit: {line}\n")


def state_dir() -> Path:
    """The state folder (see the module): for a user who is not root, one of the user's own."""
    env = os.environ.get("CHAOSKIT_STATE_DIR")
    if env:
        root = Path(env)
    elif os.geteuid() == 0:
        root = Path("/var/lib/chaoskit")
    else:
        root = Path.home() / ".local" / "state" / "chaoskit"
    theirs = _owner_problem(root, follow=True) if os.geteuid() != 0 else None
    if theirs is not None:
        own = Path.home() / ".local" / "state" / "chaoskit"
        if own == root or _owner_problem(own, follow=True) is not None:
            raise InfraError(f"{theirs}: chaoskit keeps no state in another user's folder",
                             hint="set CHAOSKIT_STATE_DIR to a folder of your own")
        _say_once(f"{theirs}, not yours: its labs and locks are not yours; using your own {own}")
        root = own
    if not root.exists():
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    else:
        st = os.lstat(root)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.chmod(root, 0o700)  # ours, made before state was kept private (leases hold revert commands)
    return root


def not_ours(path: Path, what: str) -> str | None:
    """Why ``path`` (``what``: "the process lab record", "the lock of cluster X"), found in the state folder, is not
    this user's: one line, said once on stderr too; ``None`` when it is ours, is not there, chaoskit is root, or
    another user's are shared on purpose (:data:`SHARED_ENV`)."""
    if os.geteuid() == 0 or os.environ.get(SHARED_ENV) == "1":
        return None
    problem = _owner_problem(path)
    if problem is None:
        return None
    line = f"{what} {problem}, not yours: ignored ({SHARED_ENV}=1 shares it on purpose)"
    _say_once(line)
    return line


def _owner_problem(path: Path, follow: bool = False) -> str | None:
    """``path`` belongs to another user (or, not ``follow``-ed, is a link): "PATH belongs to uid N (name)";
    ``None``: ours or absent."""
    try:
        st = os.stat(path, follow_symlinks=follow)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if st.st_uid == os.geteuid():
        return None
    try:
        name = f" ({pwd.getpwuid(st.st_uid).pw_name})"
    except KeyError:
        name = ""
    return f"{path} belongs to uid {st.st_uid}{name}"


def private_dir(*parts: str) -> Path:
    """``<state>/<parts...>``, made 0700 (each part) and checked to be the effective user's own:
    not a link, owned by this uid, writable by nobody else. Raise :class:`InfraError` otherwise."""
    folder = state_dir()
    for part in parts:
        if not part or part in (".", "..") or "/" in part:
            raise ValueError(f"not a plain folder name: {part!r}")
        folder = folder / part
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            st = os.lstat(folder)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077:
                os.chmod(folder, 0o700)  # ours, from before state was kept private: tighten it
        problem = private_problem(folder)
        if problem:
            raise InfraError(problem, hint="remove it, or set CHAOSKIT_STATE_DIR to a folder of your own")
    return folder


def private_problem(path: Path, *, folder: bool = True) -> str | None:
    """Why ``path`` is not this user's own (a link, someone else's, writable by others; a folder
    also readable by others), or ``None``."""
    st = lstat_no_link(path, link="{path} is a symbolic link; chaoskit keeps its state only in folders of its own")
    if isinstance(st, str):
        return st
    if st.st_uid != os.geteuid():
        return f"{path} belongs to uid {st.st_uid}, not to this user ({os.geteuid()})"
    if (folder and not stat.S_ISDIR(st.st_mode)) or (not folder and not stat.S_ISREG(st.st_mode)):
        return f"{path} is not a {'folder' if folder else 'regular file'}"
    if st.st_mode & (0o077 if folder else 0o022):
        return f"{path} has mode {stat.S_IMODE(st.st_mode):04o}; only its owner may {'use' if folder else 'write'} it"
    return None


def lstat_no_link(path: Path, *, unreadable: str = "{path}: {error}",
                  link: str = "{path} is a symbolic link") -> "os.stat_result | str":
    """The status of ``path`` itself (``os.lstat``: a link is never followed), or why there is none to judge:
    ``unreadable`` when it cannot be read (``{error}``: the system's reason), ``link`` when it is a symbolic link
    (both with ``{path}``). What chaoskit trusts by its owner and mode starts here, so that a link cannot lend it
    its target's."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return unreadable.format(path=path, error=exc.strerror)
    if stat.S_ISLNK(st.st_mode):
        return link.format(path=path)
    return st
