"""One run per cluster at a time: an advisory lock file held for the whole run."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from chaoskit.core.errors import InfraError

__all__ = ["ClusterLock"]


class ClusterLock:
    def __init__(self, root: Path, cluster: str) -> None:
        self.path = Path(root) / "locks" / f"{cluster}.lock"
        self._fd: int | None = None

    def acquire(self) -> "ClusterLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another run"
            os.close(fd)
            raise InfraError(
                f"cluster {self.path.stem!r} is locked by {holder}",
                hint="wait for that run to finish; one run per cluster at a time",
            ) from None
        try:
            same_file = os.fstat(fd).st_ino == os.stat(self.path).st_ino
        except FileNotFoundError:
            same_file = False
        if not same_file:  # the holder released (and removed) it between our open and flock: start over
            os.close(fd)
            return self.acquire()
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        """Remove the lock file and let go: nothing is left behind for labs that come and go."""
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "ClusterLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
