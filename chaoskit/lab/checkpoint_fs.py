"""A small file system of the job's own for its checkpoints (``workload.checkpoint_fs``), on this machine.

A tmpfs of exactly the asked size mounted on the job's checkpoint folder, so that
``storage.full`` fills that and nothing else. Mounting needs root. The runner arms
:func:`unmount_argv` as a lease before anything else happens, so the mount goes
away even if chaoskit is killed; :func:`unmount` is what the runner's teardown calls.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from chaoskit.cluster.kernel import local_mounts
from chaoskit.core.errors import InfraError

__all__ = ["TmpfsCheckpoints", "mount_checkpoint_fs", "unmount_argv", "unmount", "mounted", "FSTYPE", "SOURCE"]

FSTYPE = "tmpfs"
SOURCE = "chaoskit-ckpt"
"""The mount's source name: ``findmnt``/``/proc/mounts`` show which mounts are chaoskit's."""
TIMEOUT_S = 15.0


class TmpfsCheckpoints:
    """What a lab on this machine gives ``ClusterHandle.checkpoint_fs``."""

    @staticmethod
    def unmount_argv(folder: Path) -> list[str]:
        return unmount_argv(folder)

    @staticmethod
    def mount(folder: Path, size: int, owner: tuple[int, int] | None = None) -> None:
        mount_checkpoint_fs(folder, size, owner)


def mount_checkpoint_fs(folder: Path, size: int, owner: tuple[int, int] | None = None) -> list[str]:
    """Mount a tmpfs of ``size`` bytes on ``folder`` (made if missing), its root ``owner``'s (uid, gid; mode 0700)
    when the job runs as another user; return the argv that unmounts it."""
    folder = Path(folder)
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        raise InfraError("workload.checkpoint_fs: mounting the job's checkpoint file system needs root",
                         hint="run as root, or drop checkpoint_fs (and storage.full) from the scenario")
    folder.mkdir(parents=True, exist_ok=True)
    if any(folder.iterdir()):
        raise InfraError(f"workload.checkpoint_fs: {folder} already holds files; the job's file system would hide them")
    mode = f"mode=0700,uid={int(owner[0])},gid={int(owner[1])}" if owner is not None else "mode=0755"
    res = subprocess.run(["mount", "-t", FSTYPE, "-o", f"size={int(size)},{mode}", SOURCE, str(folder)],
                         capture_output=True, text=True, timeout=TIMEOUT_S)
    if res.returncode != 0:
        raise InfraError(f"workload.checkpoint_fs: mount -t tmpfs on {folder} failed: {res.stderr.strip() or res.returncode}")
    return unmount_argv(folder)


def unmount_argv(folder: Path) -> list[str]:
    """Idempotent (nothing mounted there: nothing to do, exit 0) and lazy: a process still holding a file
    there cannot keep the mount (and the lease's revert) from going."""
    return ["sh", "-c", '! mountpoint -q "$0" || umount --lazy "$0"', str(folder)]


def unmount(folder: Path) -> None:
    """Unmount ``folder`` when chaoskit's tmpfs is mounted there; harmless when it is not."""
    if not mounted(folder):
        return
    res = subprocess.run(unmount_argv(folder), capture_output=True, text=True, timeout=TIMEOUT_S)
    if res.returncode != 0 and mounted(folder):
        raise InfraError(f"could not unmount the job's checkpoint file system at {folder}: {res.stderr.strip()}")


def mounted(folder: Path) -> bool:
    """Whether chaoskit's tmpfs is mounted on ``folder``."""
    target = os.path.realpath(folder)
    for parts in local_mounts():
        if len(parts) > 2 and parts[0] == SOURCE and parts[2] == FSTYPE and parts[1].replace("\\040", " ") == target:
            return True
    return False
