"""Bounds on every input file and value, so no malformed file can crash, hang or bloat chaoskit.

Each number is far above what a real input needs and far below what would cost
a second or a hundred megabytes to refuse. Every limit is reported as one
positioned line (``file:line:col: ... (the limit is N)``), exit 2.
"""

from __future__ import annotations

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "MAX_DURATION_S",
    "MAX_RATE_BITS",
    "MAX_COUNT",
    "MAX_PID",
    "MAX_LINE_BYTES",
    "MAX_NUMBER_DIGITS",
    "REGEX_TIMEOUT_S",
]

MAX_FILE_BYTES = 1024 * 1024
"""Scenario, inventory and compose files: 1 MiB. The shipped scenarios are under 2 KiB and an
inventory of 2,000 nodes is about 400 KiB; at most this much (plus one byte, to tell) is ever read."""

MAX_DEPTH = 64
"""Nesting of YAML collections. The deepest path any format has is about 6 levels
(``faults.0.target.labels.rack``); 64 keeps every later walk (pydantic, JSON) far from
Python's recursion limit."""

MAX_NODES = 100_000
"""YAML values in one file, counting every alias as the values it stands for: 50 per node of a
2,000-node inventory. An alias bomb (a billion values in a few lines) is refused as soon as
the count passes this, after at most this much work, in bounded memory."""

MAX_DURATION_S = 30 * 24 * 3600.0
"""Durations: 30 days. No drill, timeout or SLO is longer; larger values (``1e400``, ``.inf``)
would overflow the tools they reach (``timeout``, ``tc``, torch's collective timeout)."""

MAX_RATE_BITS = 10e12
"""A ``network.degrade`` rate: 10 tbit/s, above the fastest NIC; ``tc`` takes 64-bit rates."""

MAX_COUNT = 1_000_000_000
"""Steps, restarts, ranks and other counts: one billion (a 10-day job at 1,000 steps/s)."""

MAX_PID = 4_194_304
"""Linux's ``PID_MAX_LIMIT`` (2**22): no process id is larger."""

MAX_REPEAT = 1000
"""``chaoskit run --repeat``: 1,000 samples, far past where a median's 95% interval stops narrowing
usefully (it shrinks as 1/sqrt(n)); a typo such as ``--repeat 50000`` is refused, not run for weeks."""

MAX_LINE_BYTES = 64 * 1024
"""One line of a job's output or of a followed log file: 64 KiB. A longer line is cut there (the
node's agent and the controller's readers alike) and the rest of it skipped, so a job that prints
10 MB with no newline costs at most this much memory and never stops being read."""

MAX_NUMBER_DIGITS = 18
"""A value captured from a log line is a number only with at most 18 digits (it fits in 64 bits);
a longer digit group stays text (``int()`` of 4,300+ digits raises, and would stop the reader)."""

REGEX_TIMEOUT_S = 0.5
"""The most one scenario regex may take on one line (the ``regex`` package's ``timeout``): a pattern
that backtracks for longer is an error, not a hang."""
