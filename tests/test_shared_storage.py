"""storage.corrupt and storage.full on a checkpoint folder that another, hostile local user controls.

A real unprivileged user (``ckhostile2``, made with ``useradd`` and removed at the end) either owns the
job's checkpoint folder (the job's own user) or can write a root-owned one (a shared, group- or
world-writable folder). As that user, with real processes, the tests plant symbolic links at every name
the faults write or can be predicted to write (the names in the watchdog's command line are visible
before the harm, so links are also planted right after the lease is armed), swap the aside folder and
its copy between inject and restore, and swap the folders on the way. Every link points at files in a
folder of the test's own that root owns (never a real system file). Asserted: nothing outside the
checkpoint folder is written, removed or has its mode changed; a swapped aside copy is refused with a
clear error and not copied back; the faults still work when nobody interferes.

Needs root (``useradd``, acting as another user, mounting the small file system ``storage.full`` needs):
skipped outside CI without it, failed in CI.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from chaoskit.cluster.selectors import TargetSpec, resolve_nodes
from chaoskit.core.errors import InfraError, ScenarioError
from chaoskit.faults.storage import FILL_PREFIX, CorruptFault, CorruptSpec, FullFault, FullSpec, parse_revert
from chaoskit.lab.checkpoint_fs import mount_checkpoint_fs, unmount
from chaoskit.lab.process import ProcessLab
from chaoskit.runner import RunContext
from chaoskit.safety.journal import Journal
from chaoskit.safety.lease import LeaseManager
from tests.netns_fixtures import require

USER = "ckhostile2"
SECRET = b"root's own file: nobody may write, chmod or remove it\n"


def _root_problem() -> str | None:
    if os.geteuid() != 0:
        return "acting as another local user needs root"
    missing = [t for t in ("useradd", "userdel", "mount") if shutil.which(t) is None]
    return f"missing: {', '.join(missing)}" if missing else None


@pytest.fixture(scope="module")
def hostile():
    """The other local user: (uid, gid)."""
    problem = _root_problem()
    require(problem is None, problem or "")
    subprocess.run(["userdel", "--force", USER], capture_output=True)  # a leftover of an interrupted run
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", USER], check=True, capture_output=True)
    try:
        pw = pwd.getpwnam(USER)
        yield pw.pw_uid, pw.pw_gid
    finally:
        subprocess.run(["userdel", "--force", USER], capture_output=True)
        try:
            grp.getgrnam(USER)
            subprocess.run(["groupdel", USER], capture_output=True)
        except KeyError:
            pass


def as_hostile(who: tuple[int, int], script: str, *args: str) -> None:
    """Run a shell script as the hostile user (a real process with their uid, gid and no other group)."""
    uid, gid = who
    res = subprocess.run(["sh", "-ec", script, "sh", *args], user=uid, group=gid, extra_groups=[],
                         capture_output=True, text=True, timeout=30, cwd="/")
    assert res.returncode == 0, f"the hostile user's script failed: {res.stderr}"


class Site:
    """A folder of the test's own under /tmp (reachable by the other user): ``victim/`` (root's files, where
    every planted link points), ``job/checkpoints`` (the job's checkpoint folder)."""

    def __init__(self, who: tuple[int, int], shape: str) -> None:
        self.who, self.shape = who, shape
        self.base = Path(tempfile.mkdtemp(prefix="ck-shared-storage-", dir="/tmp"))
        self.base.chmod(0o755)
        self.victim = self.base / "victim"
        (self.victim / "dir").mkdir(parents=True)
        self.victim.chmod(0o755)
        (self.victim / "dir").chmod(0o755)
        for path in (self.victim / "secret", self.victim / "dir" / "original", self.victim / "dir" / "ckpt-00000099.pt"):
            path.write_bytes(SECRET)
            path.chmod(0o600)
        self.job = self.base / "job"
        self.ckpts = self.job / "checkpoints"
        self.ckpts.mkdir(parents=True)
        self.job.chmod(0o755)
        self.own()
        self.before = self.snapshot()

    def own(self) -> None:
        """owned: the other user is the job's user and owns its folders; shared: root's folder they can write."""
        if self.shape == "owned":
            os.chown(self.job, *self.who)
            os.chown(self.ckpts, *self.who)
            self.ckpts.chmod(0o755)
        else:
            self.ckpts.chmod(0o777)

    def checkpoints(self) -> Path:
        """Three checkpoints, step 75 the newest; the job's user owns them (root when the folder is shared)."""
        for n, step in enumerate((25, 50, 75)):
            path = self.ckpts / f"ckpt-{step:08d}.pt"
            path.write_bytes(os.urandom(4096 + step))
            path.chmod(0o644)
            if self.shape == "owned":
                os.chown(path, *self.who)
            os.utime(path, (time.time() - 100 + n, time.time() - 100 + n))
        return self.ckpts / "ckpt-00000075.pt"

    def snapshot(self) -> dict[str, tuple]:
        """Everything in the test's folder outside the checkpoint folder (the job's folder itself excepted)."""
        out = {}
        for dirpath, dirnames, filenames in os.walk(self.base):
            here = Path(dirpath)
            if here == self.job:
                dirnames[:] = []
                continue
            for name in dirnames + filenames:
                path = here / name
                if path == self.job:
                    continue  # the job's user's, changed by them
                st = path.lstat()
                data = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else None
                out[str(path.relative_to(self.base))] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, data)
        return out

    def untouched(self) -> None:
        assert self.snapshot() == self.before, "a file outside the checkpoint folder was written, removed or chmodded"
        assert (self.victim / "secret").read_bytes() == SECRET

    def close(self) -> None:
        unmount(self.ckpts)
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(params=["owned", "shared"])
def site(request, hostile):
    s = Site(hostile, request.param)
    yield s
    s.close()


@pytest.fixture
def lab():
    lab = ProcessLab.create(1)
    yield lab
    lab.kill_all()


def _ctx(lab, tmp_path, folder, after_arm=None) -> RunContext:
    ctx = RunContext(lab.inventory(), Journal(tmp_path / "j.jsonl"), LeaseManager(tmp_path / "leases", "r1", ttl=10.0),
                     checkpoint_dir=str(folder))
    if after_arm is not None:
        arm = ctx.arm

        def arm_then(transport, fault_id, kind, revert, *args, **kwargs):
            arm(transport, fault_id, kind, revert, *args, **kwargs)
            after_arm(parse_revert(kind, revert)[1])  # what anyone on the node can read in the watchdog's command line

        ctx.arm = arm_then
    return ctx


def _corrupt(mode: str) -> CorruptFault:
    return CorruptFault(CorruptSpec(kind="storage.corrupt", target=TargetSpec(nodes=["n0"]), mode=mode,
                                    pattern="ckpt-*.pt", duration=60), "f0")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


PREDICTABLE = (".chaoskit-tmp", ".chaoskit-restore", ".tmp")
"""Suffixes to the checkpoint's name that chaoskit wrote (or could be guessed to write) beside it."""


@pytest.mark.parametrize("mode", ["truncate", "flip", "remove"])
def test_links_planted_at_every_predictable_name_are_never_followed(lab, tmp_path, site, mode):
    newest = site.checkpoints()
    original = _sha(newest)
    as_hostile(site.who, 'for s in .chaoskit-tmp .chaoskit-restore .tmp; do ln -s "$2" "$1$s"; done; '
                         'ln -s "$2" "$(dirname "$1")/state.json"; ln -s "$3" "$(dirname "$1")/.chaoskit-aside-"',
               str(newest), str(site.victim / "secret"), str(site.victim / "dir"))
    site.before = site.snapshot()
    ctx = _ctx(lab, tmp_path, site.ckpts)
    fault = _corrupt(mode)
    [inj] = fault.inject(ctx, resolve_nodes(ctx.inventory, fault.spec.target))
    aside = Path(inj.detail["aside"])
    if site.shape == "owned":  # done as the job's user, not as root
        assert aside.stat().st_uid == site.who[0]
        if mode != "remove":
            assert newest.stat().st_uid == site.who[0]
    assert stat.S_IMODE(aside.stat().st_mode) == 0o700
    if mode != "remove":
        assert stat.S_IMODE(newest.stat().st_mode) == 0o644 and _sha(newest) != original
    site.untouched()
    fault.revert(ctx, inj)
    assert fault.verify(ctx, inj) is None and inj.detail["restore"]["restored"] is True
    ctx.leases.release(inj.fault_id)
    assert _sha(newest) == original and not aside.exists()
    for suffix in PREDICTABLE:
        assert Path(f"{newest}{suffix}").is_symlink()  # still the other user's links, nothing written through them
    site.untouched()
    ctx.leases.close()


def test_an_aside_folder_planted_from_the_watchdogs_command_line_is_refused(lab, tmp_path, site):
    newest = site.checkpoints()
    original = _sha(newest)

    def plant(args):
        aside = site.ckpts / args[4]
        as_hostile(site.who, 'ln -s "$2" "$1"', str(aside), str(site.victim / "dir"))

    ctx = _ctx(lab, tmp_path, site.ckpts, after_arm=plant)
    fault = _corrupt("truncate")
    with pytest.raises(InfraError, match="is there already and chaoskit did not make it; nothing was injected"):
        fault.inject(ctx, resolve_nodes(ctx.inventory, fault.spec.target))
    assert _sha(newest) == original
    site.untouched()
    ctx.leases.close()


def _swap_symlink(site, aside: Path) -> None:
    as_hostile(site.who, 'mv "$1" "$1.old"; ln -s "$2" "$1"', str(aside), str(site.victim / "dir"))


def _swap_folder(site, aside: Path) -> None:
    """A folder of the other user's in its place: ``original`` a link to root's file, a state.json naming it."""
    as_hostile(site.who, 'mv "$1" "$1.old"; mkdir -m 700 "$1"; ln -s "$2" "$1/original"; '
                         'printf \'{"target": "%s", "mode": "truncate", "after": null}\' "$2" > "$1/state.json"',
               str(aside), str(site.victim / "secret"))


def _swap_copy(site, aside: Path) -> None:
    """Only the job's own user can enter the aside folder: its copy replaced by another file (another inode)."""
    as_hostile(site.who, 'cp "$1/original" "$1/copy"; mv "$1/copy" "$1/original"', str(aside))


@pytest.mark.parametrize("site, swap", [("owned", _swap_symlink), ("shared", _swap_symlink), ("owned", _swap_folder),
                                        ("shared", _swap_folder), ("owned", _swap_copy)],
                         ids=["owned-symlink", "shared-symlink", "owned-folder", "shared-folder", "owned-copy"],
                         indirect=["site"])
def test_a_swapped_aside_is_refused_and_not_copied_back(lab, tmp_path, site, swap, monkeypatch):
    """(In a shared folder the aside folder is root's, 0700: the other user cannot enter it to swap its copy.)"""
    # verify polls what is left for up to VERIFY_S (5 s) in case a revert is still landing; here what is left lasts,
    # and 5 waits of 5 s were CI time spent on nothing this test checks
    monkeypatch.setattr("chaoskit.faults.storage.VERIFY_S", 0.5)
    newest = site.checkpoints()
    ctx = _ctx(lab, tmp_path, site.ckpts)
    fault = _corrupt("truncate")
    [inj] = fault.inject(ctx, resolve_nodes(ctx.inventory, fault.spec.target))
    harmed = _sha(newest)
    aside = Path(inj.detail["aside"])
    swap(site, aside)
    with pytest.raises(InfraError, match=r"refusing: .*(is not the aside folder chaoskit made|is not the checkpoint "
                                         r"chaoskit moved aside).*it was replaced; nothing was put back"):
        fault.revert(ctx, inj)
    problem = fault.verify(ctx, inj)
    assert problem is not None and "it was replaced" in problem
    assert _sha(newest) == harmed  # nothing was copied back over it
    site.untouched()
    ctx.leases.release(inj.fault_id)
    ctx.leases.close()


def test_a_checkpoint_swapped_for_a_link_is_left_alone_at_restore(lab, tmp_path, site):
    newest = site.checkpoints()
    ctx = _ctx(lab, tmp_path, site.ckpts)
    fault = _corrupt("remove")
    [inj] = fault.inject(ctx, resolve_nodes(ctx.inventory, fault.spec.target))
    as_hostile(site.who, 'ln -s "$2" "$1"', str(newest), str(site.victim / "secret"))
    fault.revert(ctx, inj)
    assert inj.detail["restore"]["restored"] is False and "kept the job's" in inj.detail["restore"]["why"]
    assert newest.is_symlink()
    ctx.leases.release(inj.fault_id)
    site.untouched()
    ctx.leases.close()


def test_a_checkpoint_folder_swapped_for_a_link_is_refused(lab, tmp_path, hostile):
    """The job's user owns the folder above the checkpoint folder: before inject, and between inject and restore."""
    site = Site(hostile, "owned")
    try:
        site.checkpoints()
        as_hostile(site.who, 'mv "$1" "$1.real"; ln -s "$2" "$1"', str(site.ckpts), str(site.victim / "dir"))
        site.before = site.snapshot()
        ctx = _ctx(lab, tmp_path, site.ckpts)
        fault = _corrupt("remove")
        with pytest.raises(InfraError, match="has a symbolic link .* that a user other than root can change"):
            fault.inject(ctx, resolve_nodes(ctx.inventory, fault.spec.target))
        site.untouched()
        as_hostile(site.who, 'rm "$1"; mv "$1.real" "$1"', str(site.ckpts))
        [inj] = fault.inject(ctx, resolve_nodes(ctx.inventory, fault.spec.target))
        as_hostile(site.who, 'mv "$1" "$1.real"; ln -s "$2" "$1"', str(site.ckpts), str(site.victim / "dir"))
        with pytest.raises(InfraError, match="has a symbolic link"):
            fault.revert(ctx, inj)
        site.untouched()
        as_hostile(site.who, 'rm "$1"; mkdir "$1"', str(site.ckpts))  # another folder of the same name
        with pytest.raises(InfraError, match="is not the folder it was at inject .* it was replaced; nothing was touched"):
            fault.revert(ctx, inj)
        as_hostile(site.who, 'rmdir "$1"; mv "$1.real" "$1"', str(site.ckpts))
        fault.revert(ctx, inj)
        assert inj.detail["restore"]["restored"] is True and (site.ckpts / "ckpt-00000075.pt").exists()
        ctx.leases.release(inj.fault_id)
        site.untouched()
        ctx.leases.close()
    finally:
        site.close()


def test_a_path_through_a_link_inside_the_folder_is_refused(lab, tmp_path, site):
    site.checkpoints()
    as_hostile(site.who, 'ln -s "$2" "$1/sub"', str(site.ckpts), str(site.victim / "dir"))
    site.before = site.snapshot()
    ctx = _ctx(lab, tmp_path, site.ckpts)
    fault = CorruptFault(CorruptSpec(kind="storage.corrupt", target=TargetSpec(nodes=["n0"]), mode="remove", path="sub",
                                     pattern="ckpt-*.pt", duration=60), "f0")
    with pytest.raises(ScenarioError, match=r"faults\.0\.path: .* is a symbolic link"):
        fault.inject(ctx, resolve_nodes(ctx.inventory, fault.spec.target))
    site.untouched()
    ctx.leases.close()


def _mounted_site(site) -> None:
    mount_checkpoint_fs(site.ckpts, 8 << 20)
    site.own()  # the mount's root is root's 0755: give it the shape again
    (site.ckpts / "ckpt-00000025.pt").write_bytes(b"x" * 100_000)  # a save of the job's: 8MiB no longer fit


def _full() -> FullFault:
    return FullFault(FullSpec(kind="storage.full", target=TargetSpec(nodes=["n0"]), size="8MiB", duration=30), "f0")


def test_a_link_at_the_fill_files_name_is_refused(lab, tmp_path, site):
    _mounted_site(site)

    def plant(args):
        as_hostile(site.who, 'ln -s "$2" "$1"', str(site.ckpts / args[4]), str(site.victim / "secret"))

    ctx = _ctx(lab, tmp_path, site.ckpts, after_arm=plant)
    fault = _full()
    with pytest.raises(InfraError, match="is there already and chaoskit did not make it; nothing was injected"):
        fault.inject(ctx, resolve_nodes(ctx.inventory, fault.spec.target))
    site.untouched()
    ctx.leases.close()


def test_a_fill_file_swapped_for_a_link_is_left_alone(lab, tmp_path, site):
    _mounted_site(site)
    ctx = _ctx(lab, tmp_path, site.ckpts)
    fault = _full()
    [inj] = fault.inject(ctx, resolve_nodes(ctx.inventory, fault.spec.target))
    fill = Path(inj.detail["file"])
    assert fill.name.startswith(FILL_PREFIX) and inj.detail["full"] is True
    if site.shape == "owned":
        assert fill.stat().st_uid == site.who[0]  # written as the job's user: it counts against their quota
    as_hostile(site.who, 'rm -f "$1"; ln -s "$2" "$1"', str(fill), str(site.victim / "secret"))
    with pytest.raises(InfraError, match="is not the fill file chaoskit wrote .*a symbolic link.*left alone"):
        fault.revert(ctx, inj)
    assert fill.is_symlink()
    site.untouched()
    as_hostile(site.who, 'rm "$1"', str(fill))
    fault.revert(ctx, inj)
    assert fault.verify(ctx, inj) is None
    ctx.leases.release(inj.fault_id)
    ctx.leases.close()


def test_the_fill_file_is_written_and_removed_as_usual(lab, tmp_path, site):
    _mounted_site(site)
    ctx = _ctx(lab, tmp_path, site.ckpts)
    fault = _full()
    [inj] = fault.inject(ctx, resolve_nodes(ctx.inventory, fault.spec.target))
    fill = Path(inj.detail["file"])
    assert os.statvfs(site.ckpts).f_bavail == 0 and stat.S_IMODE(fill.stat().st_mode) == 0o600
    fault.revert(ctx, inj)
    assert fault.verify(ctx, inj) is None and not fill.exists()
    ctx.leases.release(inj.fault_id)
    site.untouched()
    ctx.leases.close()


def test_a_revert_not_made_by_chaoskit_is_refused_before_it_runs(lab, tmp_path, site):
    newest = site.checkpoints()
    ctx = _ctx(lab, tmp_path, site.ckpts)
    fault = _corrupt("remove")
    [inj] = fault.inject(ctx, resolve_nodes(ctx.inventory, fault.spec.target))
    good = list(inj.detail["revert"])
    for bad in ([*good[:7], "../../victim/secret", *good[8:]],
                [*good[:9], ".chaoskit-aside-../../x", *good[10:]],
                [*good[:5], "victim", *good[6:]],
                [sys.executable, "-c", "print(1)"]):
        inj.detail["revert"] = bad
        with pytest.raises(ValueError, match="not a storage.corrupt revert chaoskit makes"):
            fault.revert(ctx, inj)
    inj.detail["revert"] = [*good[:5], str(site.victim / "dir"), *good[6:]]  # well-formed, but another folder
    with pytest.raises(InfraError, match="is not the folder it was at inject .* nothing was touched"):
        fault.revert(ctx, inj)
    inj.detail["revert"] = good
    fault.revert(ctx, inj)
    assert newest.exists()
    ctx.leases.release(inj.fault_id)
    site.untouched()
    ctx.leases.close()
