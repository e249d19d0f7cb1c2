"""After a crash: revert what a dead run left armed, then remove the cluster it made for itself.

``chaoskit rollback`` calls :func:`recover` for each run whose process is gone
(:func:`chaoskit.safety.rollback.find_crashed_runs`). The run's marker names its
cluster backend and what the backend recorded; the backend gives the inventory
to revert through and knows how to tear its own cluster down.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from chaoskit.backends.registry import backend
from chaoskit.cluster.inventory import Inventory
from chaoskit.safety.journal import read_journal
from chaoskit.safety.rollback import CrashedRun, RollbackOutcome, rollback_journal

__all__ = ["Recovered", "recover", "rollback_inventory"]


@dataclass
class Recovered:
    run: CrashedRun
    faults: list[RollbackOutcome]
    lab: str | None
    """What was done to the run's own cluster, if anything."""

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.faults)


def rollback_inventory(run: CrashedRun) -> Inventory:
    """The inventory to revert a crashed run's faults through."""
    nodes = sorted({e["node"] for e in read_journal(run.journal) if e.get("node")}) if run.journal.exists() else []
    return backend(run.info.get("kind", "process")).rollback_inventory(run.info, nodes)


def recover(run: CrashedRun) -> Recovered:
    """Revert the run's armed faults; once all are reverted, tear down its own cluster and drop its marker."""
    copy = run.run_dir / "journal.jsonl" if str(run.run_dir) not in ("", ".") else None
    outcomes = (rollback_journal(run.journal, rollback_inventory(run), run_id=run.run_id, copy=copy)
                if run.journal.exists() else [])
    done = Recovered(run, outcomes, None)
    if done.ok:
        done.lab = backend(run.info.get("kind", "process")).crash_teardown({**run.info, "run_id": run.run_id})
        run.marker.unlink(missing_ok=True)
        if run.run_id not in ("", ".", ".."):
            shutil.rmtree(run.journal.parent, ignore_errors=True)
    return done
