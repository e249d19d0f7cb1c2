"""Where chaoskit keeps state between commands: locks, leases, labs, active runs and their journals.

``$CHAOSKIT_STATE_DIR``, else ``/var/lib/chaoskit`` for root and ``~/.local/state/chaoskit``
for anyone else. The folder is made 0700 and must stay the effective user's own: what
``chaoskit rollback`` runs comes from the journals kept here (:func:`private_dir`), never from
the copies in a run folder that other people can read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from chaoskit.core.errors import InfraError

__all__ = ["state_dir", "private_dir", "private_problem", "lstat_no_link"]


def state_dir() -> Path:
    env = os.environ.get("CHAOSKIT_STATE_DIR")
    if env:
        root = Path(env)
    elif os.geteuid() == 0:
        root = Path("/var/lib/chaoskit")
    else:
        root = Path.home() / ".local" / "state" / "chaoskit"
    if not root.exists():
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    else:
        st = os.lstat(root)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.chmod(root, 0o700)  # ours, made before state was kept private (leases hold revert commands)
    return root


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
