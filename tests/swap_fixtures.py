"""An author who swaps a link the moment chaoskit has checked what it points to (issue 48).

:func:`swap_on_open` starts the attacker as its own process (``runuser -u USER``, the system's ``python3 -I``):
an inotify watch (``inotify_init1``/``inotify_add_watch`` from libc, through ctypes) on the file the link points to
now, and at the first ``IN_OPEN`` of it (chaoskit reading it to check it) the link is replaced, atomically
(``rename`` of a new link over it), by one to the author's file. Whatever chaoskit reads or runs after that by the
path's name is the author's; what it uses through the descriptor it checked is the checked file.
:func:`flipping_link` swaps a link back and forth as fast as it can, for a race with no event to wait on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Iterator

SWAPPER = textwrap.dedent("""\
    import ctypes, os, select, struct, sys
    watched, link, to = sys.argv[1:4]
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    IN_OPEN = 0x20
    if fd < 0 or libc.inotify_add_watch(fd, os.fsencode(watched), IN_OPEN) < 0:
        sys.exit("inotify: " + os.strerror(ctypes.get_errno()))
    print("ready", flush=True)
    if not select.select([fd], [], [], float(sys.argv[4]))[0]:
        sys.exit("never opened")
    os.read(fd, 4096)
    tmp = link + ".swap"
    os.symlink(to, tmp)
    os.rename(tmp, link)
    print("swapped", flush=True)
    """)

FLIPPER = textwrap.dedent("""\
    import os, sys
    link, a, b = sys.argv[1:4]
    print("ready", flush=True)
    n = 0
    while True:
        tmp = link + ".flip"
        os.symlink(b if n % 2 else a, tmp)
        os.rename(tmp, link)
        n += 1
    """)


@contextlib.contextmanager
def swap_on_open(watched: Path, link: Path, to: Path, user: str | None = None, timeout: float = 60) -> Iterator[dict]:
    """While inside: the first open of ``watched`` makes ``link`` point to ``to`` (as ``user``, else root). The
    yielded dict's ``swapped`` says, after the block, whether the swap happened."""
    argv = ["/usr/bin/python3", "-I", "-c", SWAPPER, str(watched), str(link), str(to), str(timeout)]
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    state = {"swapped": False}
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        assert first == "ready", (first, proc.stderr.read() if proc.poll() is not None else "")
        yield state
    finally:
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            _kill(proc)
            out, err = proc.communicate()
        state["swapped"] = "swapped" in out
        state["stderr"] = err


@contextlib.contextmanager
def flipping_link(link: Path, a: Path, b: Path, user: str | None = None) -> Iterator[None]:
    """While inside: ``link`` points to ``a`` and ``b`` in turn, replaced as fast as ``user`` (else root) can."""
    argv = ["/usr/bin/python3", "-I", "-c", FLIPPER, str(link), str(a), str(b)]
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield
    finally:
        _kill(proc)


def _kill(proc: subprocess.Popen) -> None:
    """End the attacker: its whole session (``runuser`` forks the program it runs, which a kill of runuser leaves)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
