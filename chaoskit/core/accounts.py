"""Whom a job chaoskit starts runs as: never root unless the operator says so.

chaoskit runs as root where a fault needs it (signals to any process, ``tc``, namespaces, mounts), but the
training job it starts needs none of that, and what the job exposes (torchrun's rendezvous store, which
unpickles what a client writes; Ray's GCS) is code execution for whoever reaches it. So a lab's job runs as an
unprivileged account chaoskit makes for that purpose (:data:`LAB_ACCOUNT`), or as the invoking user when
chaoskit is not root. Root is used only where the site policy names it (``job_user: root``), and the plan and
the report then say so.
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from chaoskit.core.errors import InfraError

__all__ = ["Account", "LAB_ACCOUNT", "lab_account", "account_named", "setpriv_argv", "unreachable_by",
           "python_paths"]

LAB_ACCOUNT = "chaoskit-lab"
"""The system account a lab's job and services run as when chaoskit is root: no login shell, no home, no
groups of its own beyond its primary one."""


@dataclass(frozen=True)
class Account:
    """An unprivileged user a job runs as (the same fields as :class:`chaoskit.cluster.slurm.SubmitUser`)."""

    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[int, ...] = ()

    def env(self) -> dict[str, str]:
        """The account's own identity variables (none of root's): what a process started as it is told."""
        return {"USER": self.name, "LOGNAME": self.name, "HOME": self.home}

    def popen_ids(self) -> dict[str, object]:
        """``subprocess.Popen`` keywords that start a process as this account (its groups only)."""
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}


def account_named(name: str) -> Account:
    """The account ``name`` from the password database; :class:`InfraError` when there is none."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise InfraError(f"no user named {name!r} on this machine", hint="create it, or name another") from None
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir or "/")


def lab_account() -> Account | None:
    """The account a lab's job runs as: ``None`` when chaoskit is not root (the job is the invoking user's),
    else :data:`LAB_ACCOUNT`, made here (``useradd --system``) the first time."""
    if os.geteuid() != 0:
        return None
    try:
        return account_named(LAB_ACCOUNT)
    except InfraError:
        pass
    res = subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                          "--shell", "/usr/sbin/nologin", "--user-group", LAB_ACCOUNT],
                         capture_output=True, text=True, timeout=30)
    if res.returncode not in (0, 9):  # 9: made meanwhile by another run
        raise InfraError(f"could not create the lab's job account {LAB_ACCOUNT!r}: {res.stderr.strip() or res.returncode}",
                         hint="create it yourself: useradd --system --user-group " + LAB_ACCOUNT)
    return account_named(LAB_ACCOUNT)


def setpriv_argv(account: Account) -> list[str]:
    """The prefix that drops a command run as root to ``account`` (util-linux's ``setpriv``), for commands that
    must be started by root first (``ip netns exec``): its ids, its groups only, no way back to privileges."""
    groups = ",".join(str(g) for g in account.groups)
    return ["setpriv", f"--reuid={account.uid}", f"--regid={account.gid}",
            f"--groups={groups}" if groups else "--clear-groups", "--no-new-privs", "--"]


def python_paths(python: str | None = None) -> list[Path]:
    """What a job's Python needs to read: the interpreter itself and, for this one, its standard library, its
    site-packages and chaoskit's own package."""
    if python is not None and python != sys.executable:
        return [Path(python)]
    paths = sysconfig.get_paths()
    return [Path(sys.executable), Path(paths["stdlib"]), Path(paths["purelib"]), Path(__file__).resolve().parent.parent]


def unreachable_by(account: Account, paths: list[Path]) -> str | None:
    """Why ``account`` (no groups beyond its own) cannot read or run ``paths`` (a folder on the way it may not
    search, the file itself not readable), or ``None``. Links are followed, as exec and import follow them."""
    for path in paths:
        target = Path(os.path.realpath(path))
        chain = [*reversed(target.parents), target]
        for i, part in enumerate(chain):
            try:
                st = os.stat(part)
            except OSError as exc:
                return f"{part}: {exc.strerror}"
            if st.st_uid == account.uid:
                bits = (stat.S_IXUSR, stat.S_IRUSR)
            elif st.st_gid == account.gid or st.st_gid in account.groups:
                bits = (stat.S_IXGRP, stat.S_IRGRP)
            else:
                bits = (stat.S_IXOTH, stat.S_IROTH)
            last = i == len(chain) - 1
            need = bits[1] if last and not stat.S_ISDIR(st.st_mode) else bits[0]
            if not st.st_mode & need:
                return f"{part} (mode {stat.S_IMODE(st.st_mode):04o}, {_owner(st.st_uid)}'s) is closed to {account.name}"
    return None


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
