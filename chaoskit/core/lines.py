"""Lines of a job's output, read in bounded memory.

A job may print anything: a line of 10 MB with no newline must neither grow a buffer
without bound nor be rescanned from its start on every read. :class:`LineCutter` splits
a byte stream into lines of at most :data:`~chaoskit.core.limits.MAX_LINE_BYTES`; a longer
line is given cut to that length as soon as it is that long, and the rest of it is skipped
up to its newline. :func:`bounded_lines` does the same for a blocking stream (a pipe).
"""

from __future__ import annotations

import re
from typing import BinaryIO, Iterator

from chaoskit.core.limits import MAX_LINE_BYTES

__all__ = ["LineCutter", "bounded_lines", "terminal_lines", "strip_ansi"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
"""ECMA-48 control sequences: CSI (colours: ``ESC[31m``), OSC (a terminal title, a link), and two-byte escapes."""


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour and control sequences (torchtitan colours its step line)."""
    return _ANSI.sub("", text) if "\x1b" in text else text


class LineCutter:
    """Feed bytes, get complete lines (without their newline), each at most ``limit`` bytes."""

    def __init__(self, limit: int = MAX_LINE_BYTES, carriage_return: bool = False) -> None:
        """``carriage_return``: a ``\\r`` ends a line too, as it does on a terminal (a progress bar rewrites its line
        with ``\\r`` and sends no newline until it is done)."""
        self.limit = limit
        self.carriage_return = carriage_return
        self.partial = b""
        """The current line so far (at most ``limit`` bytes)."""
        self.skipping = False
        """The current line was already given, cut: what is left of it is dropped."""

    def feed(self, chunk: bytes) -> list[bytes]:
        if self.carriage_return:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines, start = [], 0
        while True:
            nl = chunk.find(b"\n", start)
            piece = chunk[start:] if nl < 0 else chunk[start:nl]
            if self.skipping:
                pass
            elif len(self.partial) + len(piece) > self.limit:
                lines.append(self.partial + piece[: self.limit - len(self.partial)])
                self.partial, self.skipping = b"", True
            elif nl < 0:
                self.partial += piece
            else:
                lines.append(self.partial + piece)
                self.partial = b""
            if nl < 0:
                return lines
            self.skipping = False
            start = nl + 1

    def rest(self) -> bytes:
        """What is left at the end of the stream: the last line when it had no newline."""
        out, self.partial = self.partial, b""
        return out


def bounded_lines(stream: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[bytes, bytes | None]]:
    """``(raw, line)`` for every piece of a blocking binary stream until EOF: ``raw`` as read (at most
    ``limit`` bytes at a time, for a copy of the output), ``line`` the line without its newline, cut to
    ``limit``; the pieces of a cut line after its first come with ``line`` ``None``."""
    skipping = False
    for raw in iter(lambda: stream.readline(limit), b""):
        ended = raw.endswith(b"\n")
        yield raw, (None if skipping else raw[:-1] if ended else raw)
        skipping = not ended


def terminal_lines(stream: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[bytes, list[bytes]]]:
    """``(raw, lines)`` for every read of a blocking binary stream until EOF: ``raw`` as read (for a copy of the
    output), ``lines`` the lines it completed, each cut to ``limit``, a ``\\r`` ending a line as a ``\\n`` does (a
    progress bar's every redraw is a line, as a terminal shows it; :func:`bounded_lines` would give the bar as
    one line once it is done). The last line comes with the last read even without its newline."""
    cutter = LineCutter(limit, carriage_return=True)
    read = getattr(stream, "read1", stream.read)
    while True:
        raw = read(limit)
        if not raw:
            rest = cutter.rest()
            if rest:
                yield b"", [rest]
            return
        yield raw, cutter.feed(raw)
