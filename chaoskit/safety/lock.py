"""One run per cluster at a time: an advisory lock file held for the whole run."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from chaoskit.core.errors import InfraError
from chaoskit.core.state import not_ours

__all__ = ["ClusterLock"]


class ClusterLock:
    """``<root>/locks/<cluster>.lock``. A lock file another user owns is not ours (issue 51: a user's run was held
    by another user's lock): it is said in one line and this user's own, ``<cluster>.uid<N>.lock``, is taken in its
    place, unless locks are shared on purpose (:data:`~chaoskit.core.state.SHARED_ENV`)."""

    def __init__(self, root: Path, cluster: str) -> None:
        self.cluster = cluster
        self.path = Path(root) / "locks" / f"{cluster}.lock"
        self._fd: int | None = None

    def acquire(self) -> "ClusterLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not_ours(self.path, f"the lock of cluster {self.cluster!r}") is not None:
            self.path = self.path.with_name(f"{self.cluster}.uid{os.geteuid()}.lock")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError:  # another user's, shared on purpose: a read is enough to hold it
            fd = os.open(self.path, os.O_RDONLY)
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
        if os.fstat(fd).st_uid == os.geteuid():
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()}".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        """Remove the lock file and let go: nothing is left behind for labs that come and go."""
        if self._fd is not None:
            try:
                self.path.unlink(missing_ok=True)
            except PermissionError:  # another user's, shared on purpose, in a folder we may not change: theirs to remove
                pass
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "ClusterLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
