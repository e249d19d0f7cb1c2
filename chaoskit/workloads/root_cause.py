"""Why a job's workers died, read from their output: torchrun's "Root Cause" block and the last exception.

A job that ends before steady state is a newcomer's first sight of chaoskit; "see logs" sends them to
a few hundred lines of torchrun restarting a worker. :class:`RootCause` reads every line of the job's
output as it passes (cheaply: a few string tests per line, a state machine per node) and keeps:

- torchrun's summary of the failed attempt, printed by the agent when it gives up
  (``torch/distributed/elastic/multiprocessing/errors/__init__.py``, ``_MSG_FORMAT_TEMPLATE``:
  ``Root Cause (first observed failure):`` then ``rank : N (local_rank: M)``, ``exitcode : X (pid: P)``);
- the first exception printed: the first unindented line after a ``Traceback (most recent call last):``
  (``ImportError: ... requires accelerate>=1.1.0``), or the interpreter's own ``can't open file`` when the
  script is missing. The root cause is the earliest failure (torch elastic's rule): a worker's exception comes
  before what the agents raise once its world is gone (``RendezvousConnectionError`` when the store's host
  exited, ``ChildFailedError``), which would otherwise be the last lines of the output.

:meth:`RootCause.summary` puts them in one line for the error a run ends with.
"""

from __future__ import annotations

import re

from chaoskit.core.lines import strip_ansi

__all__ = ["RootCause"]

_TEE = re.compile(r"^\[(?:[A-Za-z_][\w-]*?)(\d+)\]:")
"""torchrun --tee / --role prefixes every worker line with ``[rankN]:`` or ``[<role>N]:`` (``[defaultN]:``)."""
_FIELD = re.compile(r"^\s+(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?::.*)?$")
"""What Python prints last of a traceback: the exception's (qualified) name, then ``: message``."""
_CANT_OPEN = re.compile(r"can't open file .*")
MAX_TEXT = 300


class RootCause:
    """Feed it the job's lines (:meth:`feed`); :meth:`summary` says why it failed, or ``None``."""

    def __init__(self) -> None:
        self._in_tb: dict[str, bool] = {}
        self._open: dict[str, dict[str, str]] = {}
        """Root Cause blocks being read, per node."""
        self.block: dict[str, str] = {}
        """The fields of the first Root Cause block torchrun printed (rank, exitcode, host, traceback)."""
        self.block_node: str | None = None
        self.exception: tuple[str, str] | None = None
        """(node, line) of the first exception printed (the earliest failure)."""
        self.exceptions: dict[str, str] = {}
        """The first exception printed on each node."""

    def feed(self, node: str, line: str) -> None:
        line = strip_ansi(line.rstrip("\r\n"))
        m = _TEE.match(line)
        key = f"{node}/{m.group(1)}" if m else node
        if m:
            line = line[m.end():]
        if "Root Cause (first observed failure):" in line:
            self._open[node] = {}
            return
        block = self._open.get(node)
        if block is not None:
            if line.startswith("====="):
                del self._open[node]
                if not self.block:
                    self.block, self.block_node = block, node
                return
            f = _FIELD.match(line)
            if f and f.group(1) not in block:
                block[f.group(1)] = f.group(2).strip()
            return
        if line.startswith("Traceback (most recent call last):"):
            self._in_tb[key] = True
            return
        if self._in_tb.get(key):
            if not line or line[0].isspace():
                return
            self._in_tb[key] = False
            if _EXCEPTION.match(line) and not line.split(":", 1)[0].endswith("ChildFailedError"):  # torchrun's own
                self._exception(node, line.strip())
            return
        c = _CANT_OPEN.search(line)
        if c:
            self._exception(node, c.group(0).strip())

    def _exception(self, node: str, text: str) -> None:
        if self.exception is None:
            self.exception = (node, text)
        self.exceptions.setdefault(node, text)

    def summary(self) -> str | None:
        """One line: the rank and exit code torchrun named, and the exception; ``None`` when nothing was seen."""
        parts: list[str] = []
        if self.block:
            who = f"rank {self.block['rank'].split(' ')[0]}" if self.block.get("rank") else "a worker"
            where = f" on {self.block_node}" if self.block_node else ""
            code = self.block.get("exitcode", "").split(" ")[0]
            parts.append(f"torchrun's root cause: {who}{where} exited {code or '?'}")
            tb = self.block.get("traceback", "")
            if tb and not tb.startswith(("To enable traceback", "Traceback")) and not self.exceptions:
                parts.append(tb)
        exception = ((self.block_node, self.exceptions[self.block_node]) if self.block_node in self.exceptions
                     else self.exception)
        if exception is not None:
            node, text = exception
            parts.append(f"{text} (in {node}'s output)")
        if not parts:
            return None
        text = "; ".join(parts)
        return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."
