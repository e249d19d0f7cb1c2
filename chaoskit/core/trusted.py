"""Files of this machine that chaoskit runs or reads as root on an author's word: only those only root can change.

An inventory or scenario names a program (``cluster.slurm.bin``, a node's ``power:`` commands) or a file
(``cluster.slurm.conf``). Run as root, an author's own script would run with root's rights, so a program
or file is used only when it is a regular file that root owns, that neither its group nor others can
write, in a folder (and every folder above it) with the same properties: what the system's packages
install, or what the site's admin put there. Stdlib only.
"""

from __future__ import annotations

import os
import shutil
import stat

__all__ = ["untrusted_file", "untrusted_program"]


def untrusted_file(path: str) -> str | None:
    """Why ``path`` (links resolved) is not a file only root can change, or ``None``."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if st.st_uid != 0 or st.st_mode & 0o022:
        return (f"{path} ({real}) can be changed by someone other than root (uid {st.st_uid}, mode "
                f"{stat.S_IMODE(st.st_mode):04o}); chaoskit runs and reads as root only what root alone can change")
    folder = os.path.dirname(real)
    while True:
        fst = os.stat(folder)
        if fst.st_uid != 0 or (fst.st_mode & 0o022 and not fst.st_mode & stat.S_ISVTX):
            return (f"{path}: its folder {folder} can be changed by someone other than root (uid {fst.st_uid}, mode "
                    f"{stat.S_IMODE(fst.st_mode):04o}), who could replace it")
        if folder == "/":
            return None
        folder = os.path.dirname(folder)


def untrusted_program(program: str) -> str | None:
    """Why ``program`` (a path, or a name looked up in PATH) is not a program only root can change, or ``None``."""
    found = program if "/" in program else shutil.which(program)
    if found is None:
        return f"{program}: not found in PATH"
    return untrusted_file(found)
