"""What the root labs (:mod:`.netns`, :mod:`.slurm`) share: a folder of their own with a ``lab.json`` in it, built
whole or not at all, and the host tools they run.

- :func:`claim` takes a folder for a new lab: refused when a lab is up there or it holds anything else.
- :func:`build_whole` writes ``lab.json`` as ``building``, builds, writes it as ``up``; on any failure (an
  interrupt included) it takes down what was built, so that nothing is left.
- :func:`save` replaces ``lab.json`` atomically; :func:`load` reads it back as the lab's fields.
- :func:`run_tool` runs one host command with a deadline; its failures are :class:`~chaoskit.core.errors.InfraError`.
- :func:`kill_marked` SIGKILLs the processes a lab left whose command line names it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any, Callable

from chaoskit.core import procs
from chaoskit.core.errors import InfraError

__all__ = ["LAB_FILE", "claim", "build_whole", "save", "load", "run_tool", "kill_marked"]

LAB_FILE = "lab.json"


def claim(directory: Path, what: str, mode: int) -> None:
    """Make ``directory`` the new lab's (``mode``: its permissions); ``what`` names the lab in errors."""
    if (directory / LAB_FILE).exists():
        raise InfraError(f"a {what} is already up in {directory}", hint="chaoskit lab down")
    if directory.exists() and any(directory.iterdir()):
        raise InfraError(f"{directory} is not empty; a {what} needs a directory of its own")
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(mode)


def build_whole(save_state: Callable[[str], None], build: Callable[[], None], down: Callable[[], None]) -> None:
    """``save_state("building")``, ``build()``, ``save_state("up")``; when the build raises anything (an interrupt
    included), ``down()`` before it goes on."""
    save_state("building")
    try:
        build()
    except BaseException:
        down()
        raise
    save_state("up")


def save(directory: Path, fields: dict[str, Any], state: str) -> None:
    """Replace ``directory``'s ``lab.json`` with the lab's ``fields`` and its ``state`` (never half written)."""
    data = {**fields, "directory": str(directory), "state": state}
    tmp = directory / (LAB_FILE + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(directory / LAB_FILE)


def load(directory: Path) -> dict[str, Any] | None:
    """The fields :func:`save` wrote in ``directory`` (its ``directory`` a :class:`Path`, without the state), or
    ``None`` when no lab is there."""
    path = directory / LAB_FILE
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    data.pop("state", None)
    data["directory"] = Path(data["directory"])
    return data


def run_tool(argv: list[str], *, check: bool = True, env: dict[str, str] | None = None, timeout: float = 30.0,
             hint: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run one host command (no stdin) within ``timeout``; :class:`InfraError` when it is not installed (with
    ``hint``), misses the deadline, or (``check``) exits non-zero, with its exit status and output."""
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env)
    except FileNotFoundError:
        raise InfraError(f"{argv[0]}: command not found", hint=hint) from None
    except subprocess.TimeoutExpired:
        raise InfraError(f"{' '.join(argv)}: no answer within {timeout:g}s") from None
    if check and res.returncode != 0:
        raise InfraError(f"{' '.join(argv)} failed (exit {res.returncode}): {(res.stderr or res.stdout).strip()}")
    return res


def kill_marked(*markers: str) -> None:
    """SIGKILL every process of this machine (but this one and its parent) whose command line contains each of
    ``markers`` (a daemon whose pid file is gone, a watchdog naming the lab's folder)."""
    needles = [m.encode() for m in markers]
    skip = {os.getpid(), os.getppid()}
    for pid in procs.pids():
        if pid in skip:
            continue
        cmdline = procs.cmdline(pid)
        if cmdline is not None and all(n in cmdline for n in needles):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
