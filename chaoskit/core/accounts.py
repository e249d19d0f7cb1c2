"""Whom a job chaoskit starts runs as: never root unless the operator says so.

chaoskit runs as root where a fault needs it (signals to any process, ``tc``, namespaces, mounts), but the
training job it starts needs none of that, and what the job exposes (torchrun's rendezvous store, which
unpickles what a client writes; Ray's GCS) is code execution for whoever reaches it. So a lab's job runs as an
unprivileged account chaoskit makes for that purpose, one of its own per lab (:func:`claim_lab_account`: another
lab's job cannot reach its folders), or as the invoking user when chaoskit is not root. Root is used only where the site policy names it (``job_user: root``), and the plan and
the report then say so.
"""

from __future__ import annotations

import fcntl
import grp
import os
import pwd
import stat
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from chaoskit.core import procs
from chaoskit.core.errors import InfraError

__all__ = ["Account", "AccountClaim", "LAB_ACCOUNT", "LAB_ACCOUNTS", "JOB_GROUP", "CLAIMS_DIR", "lab_account",
           "lab_account_names", "claim_lab_account", "unheld_account_processes", "processes_of", "job_group",
           "account_named", "setpriv_argv", "unreachable_by", "python_paths", "nearest_existing"]

LAB_ACCOUNT = "chaoskit-lab"
"""The first of the system accounts a lab's job and services run as when chaoskit is root: no login shell, no
home, no groups beyond its primary one and :data:`JOB_GROUP`. The others are ``chaoskit-lab-1`` ... (see
:data:`LAB_ACCOUNTS`)."""

LAB_ACCOUNTS = 8
"""How many lab accounts there may be: each lab (or each run on a lab whose job chaoskit starts) holds one of its
own while it lives (:func:`claim_lab_account`), so that one lab's job cannot reach another's folders (its
in-process channel ``RUN.job/inproc``, its checkpoints, a Ray lab's state), which are its account's alone."""

CLAIMS_DIR = Path("/run/chaoskit-accounts")
"""Root's own folder (0700) of the accounts' claims: ``<name>``, a file a holder keeps an ``flock`` on for as long
as its lab or run lives (the kernel lets it go when the holder dies: no claim outlives its process)."""

JOB_GROUP = "chaoskit-jobs"
"""The group every lab account is in beside its own: a folder of root's in this group with mode 0710 lets a lab's
job pass through it (to its folder beside the run folder) without opening it to every other user. ``--out``'s
parents need that, or search for others (0711)."""


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
    groups = tuple(g for g in os.getgrouplist(entry.pw_name, entry.pw_gid) if g != entry.pw_gid)
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir or "/", groups)


def job_group() -> int | None:
    """The gid of :data:`JOB_GROUP`, made here (``groupadd --system``) the first time; ``None`` when not root."""
    if os.geteuid() != 0:
        return None
    try:
        return grp.getgrnam(JOB_GROUP).gr_gid
    except KeyError:
        pass
    _tool(["groupadd", "--system", JOB_GROUP], f"the lab accounts' group {JOB_GROUP!r}")
    return grp.getgrnam(JOB_GROUP).gr_gid


def _tool(argv: list[str], what: str) -> None:
    """Run a user-database tool; exit 9 (the name was made meanwhile by another run) is success."""
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if res.returncode not in (0, 9):
        raise InfraError(f"could not create {what}: {res.stderr.strip() or res.returncode}",
                         hint="create it yourself: " + " ".join(argv))


def lab_account() -> Account | None:
    """The first lab account (:data:`LAB_ACCOUNT`), made here (``useradd --system``) the first time; ``None`` when
    chaoskit is not root (the job is the invoking user's). A lab takes one with :func:`claim_lab_account`."""
    if os.geteuid() != 0:
        return None
    return _made(LAB_ACCOUNT)


def lab_account_names() -> list[str]:
    """``chaoskit-lab``, ``chaoskit-lab-1`` ... ``chaoskit-lab-7``: the lab accounts, in the order they are taken."""
    return [LAB_ACCOUNT, *(f"{LAB_ACCOUNT}-{i}" for i in range(1, LAB_ACCOUNTS))]


@dataclass
class AccountClaim:
    """A lab account held by this process (an ``flock`` on its claim file) until :meth:`release`."""

    account: Account
    fd: int | None

    def release(self) -> None:
        """Let the account go (idempotent): the next lab or run may take it once no process runs as it."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


def claim_lab_account(name: str | None = None) -> AccountClaim | None:
    """A lab account of this lab's or run's own: the first of :func:`lab_account_names` that no other lab or run
    holds (its claim's ``flock``) and that no process runs as (a lab whose nodes run as it, a Ray lab's, or what
    a job left running), made when missing (idempotent). ``name``: that account (a lab's own, for a run on it),
    its processes being the lab's. ``None`` when chaoskit is not root; :class:`InfraError` when every one is taken."""
    if os.geteuid() != 0:
        return None
    folder = _claims_dir()
    busy: list[str] = []
    for candidate in [name] if name is not None else lab_account_names():
        fd = os.open(candidate, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            busy.append(f"{candidate} (held by another lab or run)")
            continue
        try:
            account = _made(candidate)
            running = processes_of(account.uid) if name is None else []
        except BaseException:
            os.close(fd)
            raise
        if running:
            os.close(fd)
            busy.append(f"{candidate} (processes {', '.join(map(str, running[:5]))} run as it)")
            continue
        os.close(folder)
        return AccountClaim(account, fd)
    os.close(folder)
    raise InfraError(f"no lab account is free: {'; '.join(busy)}",
                     hint="end a lab ('chaoskit lab down') or a run; 'chaoskit audit' names processes left running as one")


def unheld_account_processes() -> dict[str, list[int]]:
    """The lab accounts that no lab or run holds and that processes still run as, with their pids: a job's
    leftovers, or a Ray lab's nodes (which keep its account once ``lab up`` has ended). ``{}`` when not root."""
    if os.geteuid() != 0 or not os.path.isdir(CLAIMS_DIR):
        return {}
    folder = _claims_dir()
    out: dict[str, list[int]] = {}
    try:
        for name in lab_account_names():
            try:
                uid = pwd.getpwnam(name).pw_uid
            except KeyError:
                continue
            pids = processes_of(uid)
            if not pids:
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
            except FileNotFoundError:
                out[name] = pids
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                out[name] = pids  # nobody holds it
            except BlockingIOError:
                pass
            finally:
                os.close(fd)
    finally:
        os.close(folder)
    return out


def _claims_dir() -> int:
    """A descriptor of :data:`CLAIMS_DIR`, made 0700; refused when it is not root's own folder (a link, another
    owner, open to others)."""
    try:
        os.mkdir(CLAIMS_DIR, 0o700)
    except FileExistsError:
        pass
    fd = os.open(CLAIMS_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if st.st_uid != 0 or st.st_mode & 0o077:
        os.close(fd)
        raise InfraError(f"{CLAIMS_DIR} is not root's own folder (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})",
                         hint="remove it; chaoskit makes it again, 0700")
    return fd


def processes_of(uid: int) -> list[int]:
    """The pids of the processes that run as ``uid`` on this machine (the owners of ``/proc/PID``)."""
    return sorted(pid for pid in procs.pids() if procs.owner(pid) == uid)


def _made(name: str) -> Account:
    """The lab account ``name``, made (``useradd --system``, in :data:`JOB_GROUP`) or put in that group when it is
    not yet: idempotent, and safe against another run doing the same."""
    gid = job_group()
    try:
        account = account_named(name)
    except InfraError:
        _tool(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
               "--user-group", "--groups", JOB_GROUP, name], f"the lab's job account {name!r}")
        account = account_named(name)
    if gid is not None and gid not in account.groups:  # an account made before the group existed
        _tool(["usermod", "--append", "--groups", JOB_GROUP, name], f"{name}'s membership of {JOB_GROUP}")
        account = account_named(name)
    return account


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


def nearest_existing(folder: Path) -> Path:
    """``folder``, or where it does not exist yet the nearest folder above it that does: what an account must
    reach for a folder chaoskit will make there (a run folder's missing parents are made 0755 on the way)."""
    while not os.path.lexists(folder) and folder.parent != folder:
        folder = folder.parent
    return folder


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
