"""Where chaoskit keeps state between commands: locks, leases, labs, active runs.

``$CHAOSKIT_STATE_DIR`` or ``~/.local/state/chaoskit``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["state_dir"]


def state_dir() -> Path:
    root = Path(os.environ.get("CHAOSKIT_STATE_DIR") or Path.home() / ".local" / "state" / "chaoskit")
    root.mkdir(parents=True, exist_ok=True)
    return root
