"""What every callback does the same way: report the exception that stops a rank (stdlib only)."""

from __future__ import annotations

import sys
import threading
from typing import Any

from chaoskit.sdk import probe

__all__ = ["report_failures", "failure_text"]

_installed = False
_lock = threading.Lock()


def failure_text(exc: BaseException) -> str:
    """``ImportError: message``, the exception's first line, bounded."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message}"[:500] if message else type(exc).__name__


def report_failures(framework: str) -> None:
    """Emit ``detect`` (this rank noticed a failure) for an exception that ends the process, then let Python
    report it as before: frameworks have no hook for it (the Trainer) or one that misses the process's end."""
    global _installed
    if not probe.enabled():
        return
    with _lock:
        if _installed:
            return
        _installed = True
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        if not isinstance(exc, KeyboardInterrupt):
            probe.detect(failure_text(exc), source=framework, who=f"{framework} rank")
        previous(kind, exc, tb)

    sys.excepthook = hook
