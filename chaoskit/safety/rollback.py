"""Undo what a crashed run left armed, from its journal alone.

The journal records every lasting fault as ``armed`` (with its exact revert argv
and node) before it is injected, and ``reverted`` once it was undone. A run that
died in between leaves ``armed`` records without a match; :func:`rollback_journal`
runs each one's revert on its node (or on the controller for faults whose revert
runs there, such as power), verifies it where the fault kind knows how, and
appends a ``reverted`` record so a second rollback does nothing. Leases of the
run are released so their watchdogs stand down.

Reverts are idempotent, so rolling back a fault whose watchdog already reverted
it is harmless. Nodes that are not in the inventory are never touched.

Only chaoskit's own journal is trusted: the one in the run's 0700 folder of chaoskit's
state (``<state>/runs/<run id>/journal.jsonl``), never the copy in the run folder, which
other people may read and whoever owns that folder may rewrite. A journal that anyone but
this user could have written is refused whole; a record of a kind chaoskit does not know
is not run; a kind whose revert the inventory knows (a power-on command) rebuilds it from
there (:meth:`~chaoskit.faults.api.Fault.journaled_revert`), and runs it only when it is the very command armed
at the fault (its SHA-256, kept in the private journal alone: an inventory changed since is refused).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaoskit.cluster.inventory import Inventory
from chaoskit.cluster.transports.api import Transport
from chaoskit.cluster.transports.local import LocalTransport
from chaoskit.core import procs
from chaoskit.core.errors import InfraError
from chaoskit.core.secrets import redact_argv
from chaoskit.core.state import lstat_no_link, state_dir
from chaoskit.faults.api import Fault
from chaoskit.faults.registry import fault_kinds
from chaoskit.nodeside.nodefs import touch_file
from chaoskit.safety.journal import Journal, argv_digest, read_journal, unreverted
from chaoskit.safety.lease import default_lease_root

__all__ = ["RollbackOutcome", "CrashedRun", "find_crashed_runs", "journal_problem", "rollback_journal"]

REVERT_TIMEOUT_S = 30.0
RUNNER_KINDS = frozenset({"workload.checkpoint_fs"})
"""What the runner itself arms besides fault kinds (a checkpoint file system it mounted)."""


@dataclass
class RollbackOutcome:
    fault_id: str
    kind: str
    node: str
    command: list[str]
    ok: bool
    problem: str | None = None


@dataclass
class CrashedRun:
    run_id: str
    pid: int
    run_dir: Path
    marker: Path
    info: dict[str, Any]

    @property
    def journal(self) -> Path:
        """The journal rollback trusts: beside the marker in chaoskit's state, not the run folder's copy."""
        return self.marker.parent / self.run_id / "journal.jsonl"


def find_crashed_runs(state: Path | None = None) -> list[CrashedRun]:
    """Runs whose active marker (``<state>/runs/<run id>.json``) names a process that is gone."""
    if state is None:
        state = state_dir()
    out = []
    for marker in sorted((Path(state) / "runs").glob("*.json")):
        try:
            info = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue
        pid = int(info.get("pid", 0))
        if pid and _alive(pid):
            continue
        out.append(CrashedRun(marker.stem, pid, Path(info.get("run_dir", "")), marker, info))
    return out


def rollback_journal(
    journal_path: Path, inventory: Inventory, *, run_id: str | None = None, timeout: float = REVERT_TIMEOUT_S,
    copy: Path | None = None,
) -> list[RollbackOutcome]:
    """Revert every fault the (trusted) journal shows armed and not reverted; return one outcome per fault.

    ``copy``: the run folder's journal, where the ``reverted`` records are appended too (for people)."""
    journal_path = Path(journal_path)
    if not journal_path.exists():
        return []
    problem = journal_problem(journal_path)
    if problem:
        raise InfraError(f"not rolling back from {journal_path}: {problem}",
                         hint="chaoskit trusts only the journal it keeps in its own state folder")
    pending = unreverted(read_journal(journal_path))
    if not pending:
        return []
    run_id = run_id or journal_path.parent.name
    kinds = fault_kinds()
    journal = Journal(journal_path, copy=copy)
    outcomes = []
    try:
        for entry in pending:
            fid, kind, node = entry["fault_id"], entry.get("kind", "?"), entry.get("node", "?")
            revert = [str(a) for a in entry.get("revert") or []]
            cls = kinds.get(kind)
            outcome = RollbackOutcome(fid, kind, node, redact_argv(revert), False)
            outcomes.append(outcome)
            if node not in inventory:
                outcome.problem = f"node {node!r} is not in the inventory; not touched"
                continue
            if cls is None and kind not in RUNNER_KINDS:
                outcome.problem = f"{kind!r} is not a fault kind chaoskit knows; its revert was not run"
                continue
            if cls is not None:
                try:
                    revert = cls.journaled_revert(revert, inventory[node])
                except (ValueError, InfraError) as exc:  # not its shape; or the node's state folder unknown
                    outcome.problem = str(exc)
                    continue
                armed = entry.get("revert_sha256")
                if cls.revert_from_inventory and armed is not None and argv_digest(revert) != armed:
                    outcome.problem = (f"the inventory's revert for {kind} on {node} ({' '.join(redact_argv(revert))}) is "
                                       "not the command armed at the fault: the inventory changed since; not run "
                                       "(undo it by hand)")
                    continue
            if not revert:
                outcome.problem = "the journal has no revert command for it"
                continue
            on_controller = entry.get("on") == "controller" or (cls is not None and cls.revert_runs_on == "controller")
            transport = LocalTransport(node) if on_controller else inventory[node].conn
            try:
                res = transport.run(revert, timeout)
                outcome.problem = _check(cls, transport, revert, inventory[node], res, on_controller)
            except (InfraError, ValueError) as exc:
                outcome.problem = str(exc)
            outcome.ok = outcome.problem is None
            if outcome.ok:
                _release_lease(transport, run_id, fid)
                journal.record("reverted", fault_id=fid, kind=kind, node=node, verified=True, problem=None, by="rollback")
    finally:
        journal.close()
    return outcomes


def journal_problem(path: Path) -> str | None:
    """Why the journal at ``path`` cannot be trusted, or ``None``: it must be a regular file of this user's
    that nobody else can write, in a folder of this user's that nobody else can write."""
    euid = os.geteuid()
    for where, is_dir in ((path.parent, True), (path, False)):
        st = lstat_no_link(where)
        if isinstance(st, str):
            return st
        if (stat.S_ISDIR(st.st_mode) if is_dir else stat.S_ISREG(st.st_mode)) is False:
            return f"{where} is not a {'folder' if is_dir else 'regular file'}"
        if st.st_uid != euid:
            return f"{where} belongs to uid {st.st_uid}, not to this user ({euid})"
        if st.st_mode & 0o022:
            return f"{where} can be written by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _check(cls: type[Fault] | None, transport: Transport, revert: list[str], node: Any, res: Any,
           on_controller: bool) -> str | None:
    if on_controller and res.returncode != 0:
        return f"revert exited {res.returncode}: {res.stderr.strip() or res.stdout.strip()}"
    if cls is None:
        return None  # a kind no longer installed: its (idempotent) revert ran
    return cls.check_reverted(transport, revert, node=node)


def _release_lease(transport: Any, run_id: str, fault_id: str) -> None:
    """Tell the fault's watchdog (if still waiting) to stand down."""
    try:
        lease_dir = getattr(transport, "lease_dir", None)
        if lease_dir is not None:
            transport.touch(f"{lease_dir(f'{run_id}/{fault_id}')}/released")
            return
        directory = default_lease_root() / run_id / fault_id
        if directory.is_dir() and not directory.is_symlink():
            touch_file(str(directory / "released"))
    except (InfraError, OSError, ValueError):
        pass  # the watchdog reverting again later is harmless


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return procs.state(pid) != "Z"  # unreadable (another user's, hidden): alive, as kill(0) said
