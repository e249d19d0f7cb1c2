"""A Slurm cluster's own commands (``scontrol``, ``sbatch``, ``squeue``, ``sinfo``, ``scancel``), run on the controller.

:class:`SlurmAccess` is all a fault, a probe or a job needs to act through Slurm:
which ``slurm.conf`` (``SLURM_CONF``; ``None``: the machine's own) and where the
binaries are. Every command runs without a shell, with a deadline.

What a job's owner writes cannot be read as Slurm's own word. ``scontrol -o show job``
prints the job name, ``--comment``, ``--chdir``, ``--output`` as they were given,
spaces, ``Key=`` text and newlines included, so a job named ``x NodeList=n9`` (or
with a newline and ``JobId=77 ...`` in its comment) reads as another allocation or
as a job of its own: no parser can undo that. ``scontrol --json`` exists from 23.02
on only (Debian 12's 22.05 has none), and ``squeue --json``'s layout changes with
each data_parser version. Jobs are therefore read with ``squeue -O`` asking only
for fields Slurm itself sets (:data:`JOB_FIELDS`: the id, state, allocation, batch
host, restart count, exit status, uid, partition and, last, the state reason),
each ended by ``|`` and checked against its form; a line that does not fit is
dropped. A field the job's owner sets (``StdOut``) is read on its own, one job and
one field per query, so that its whole output is its value (:meth:`SlurmAccess.job_field`).
Nodes are an administrator's records (a job cannot write them) and are read with
``scontrol -o show node``; their free-text fields (``Reason``, ``Comment``, ``Extra``)
stand at the end of the line, and :func:`parse_show` ends one only at another free-text key
(a reason at the ``[user@time]`` stamp Slurm gives it), so a ``State=`` inside a reason is
the reason's.
"""

from __future__ import annotations

import argparse
import os
import pwd
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from chaoskit.core.errors import InfraError
from chaoskit.core.trusted import CheckedFile, UntrustedFile, open_program

__all__ = ["SlurmAccess", "parse_show", "parse_jobs", "job_ids", "node_reason", "node_list", "JOB_DONE_STATES", "JOB_FIELDS",
           "NODE_FREE_TEXT", "USER_JOB_FIELDS", "SubmitUser", "SubmitRefused", "submit_user"]

JOB_DONE_STATES = frozenset({
    "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED",
})
"""Job states after which a job does not run again by itself (NODE_FAIL is not one: a ``--requeue`` job comes back)."""

_KEY = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9_:/]*)=")


@dataclass(frozen=True)
class SubmitUser:
    """Whom ``launch: sbatch`` submits an author's batch script as, when chaoskit runs as root."""

    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[int, ...]

    def env(self) -> dict[str, str]:
        """The submission's own environment, the user's (sbatch passes it on to the job): none of root's."""
        return {"USER": self.name, "LOGNAME": self.name, "HOME": self.home,
                "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "LANG": os.environ.get("LANG", "C.UTF-8")}


class SubmitRefused(Exception):
    """Why a batch script may not be submitted as asked; ``field``: the ``workload`` field to point at."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


def submit_user(user: str | None, script: str | os.PathLike[str]) -> SubmitUser | None:
    """Whom ``launch: sbatch`` submits ``script`` as: the author's batch script runs as its own user, never as
    root. ``None``: chaoskit does not run as root, and submits as itself (Slurm runs the job as that user).
    As root: ``user`` (a name or a uid, ``workload.user``), else the script's owner; root itself, or a user this
    machine does not know, is :class:`SubmitRefused`. A script that is not there is the caller's to say."""
    euid = os.geteuid()
    wanted = None
    if user is not None:
        try:
            wanted = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
        except KeyError:
            raise SubmitRefused("user", f"no user {user} on this machine to submit the batch script as") from None
    if euid != 0:
        if wanted is not None and wanted.pw_uid != euid:
            raise SubmitRefused("user", f"chaoskit runs as uid {euid} and submits the batch script as itself; only "
                                        f"root submits it as another user ({user})")
        return None
    if wanted is None:
        try:
            owner = os.stat(script).st_uid
        except FileNotFoundError:
            return None
        if owner == 0:
            raise SubmitRefused("user", "launch: sbatch never submits a batch script as root, and this one is root's: "
                                        "set workload.user to the user the job runs as")
        try:
            wanted = pwd.getpwuid(owner)
        except KeyError:
            raise SubmitRefused("script", f"the batch script's owner (uid {owner}) is no user on this machine: set "
                                          "workload.user to the user the job runs as") from None
    if wanted.pw_uid == 0:
        raise SubmitRefused("user", "launch: sbatch never submits a batch script as root: name the user the job runs as")
    groups = tuple(os.getgrouplist(wanted.pw_name, wanted.pw_gid))
    return SubmitUser(wanted.pw_name, wanted.pw_uid, wanted.pw_gid, wanted.pw_dir, groups)

NODE_FREE_TEXT = frozenset({"Reason", "Comment", "Extra"})
"""Fields of ``scontrol show node`` that hold text as someone typed it (spaces, ``Key=``): an administrator's
reason, comment, extra data. Slurm prints them after every other field."""

_NAMES = r"[A-Za-z0-9_.\-\[\],]*"
JOB_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("JobID", "JobId", r"\d+"),
    ("State", "JobState", r"[A-Z_]+"),
    ("NodeList", "NodeList", _NAMES),
    ("BatchHost", "BatchHost", _NAMES + r"|n/a"),
    ("RestartCnt", "Restarts", r"\d+"),
    ("exit_code", "ExitCode", r"\d+|N/A|"),
    ("UserID", "UserId", r"\d+"),
    ("Partition", "Partition", r"[A-Za-z0-9_.\-,]*"),
    ("ArrayJobID", "ArrayJobId", r"\d+"),
    ("ArrayTaskID", "ArrayTaskId", r"[0-9\-\[\],%:]+|N/A"),
    ("Reason", "Reason", r"[^\n]*"),
)
"""What chaoskit reads of a job: ``squeue -O`` field, the ``scontrol`` key it is known by here, and the form
Slurm gives it. Only fields Slurm sets; the reason (a state code, or slurmctld's own text) comes last."""

_JOB_FORMAT = ",".join(f"{name}:|" for name, _, _ in JOB_FIELDS)
_JOB_LINE = re.compile("".join(f"(?P<f{i}>{form})\\|" for i, (_, _, form) in enumerate(JOB_FIELDS[:-1]))
                       + f"(?P<f{len(JOB_FIELDS) - 1}>.*)\\|")
_OUTPUTS = re.compile(r" StdErr=(.*) StdIn=.* StdOut=(.*?)(?: Power=.*)?$")
_JOB_ID = re.compile(r"\d+(_\d+)?")
_STAMP = re.compile(r" \[[^\[\]@\s]+@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\]")
_REASON_STAMP = re.compile(r"(.*) \[([^\[\]@\s]+)@(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\]", re.DOTALL)

USER_JOB_FIELDS = frozenset({"STDOUT", "STDERR", "STDIN", "WorkDir", "Name", "Comment", "Command", "AdminComment",
                             "SystemComment", "Container"})
"""Job fields whose text the job's owner (or a plugin) chose; :meth:`SlurmAccess.job_field` reads one at a time."""


def parse_show(line: str, free_text: frozenset[str] = NODE_FREE_TEXT) -> dict[str, str]:
    """One line of ``scontrol -o show node`` as a dict (values may hold spaces: ``OS=Linux 6.1 #1 SMP``).

    A key of ``free_text`` takes everything up to the next key of ``free_text`` (or the end; a ``Reason`` ends at
    the ``[user@time]`` Slurm stamps it with): a reason that says ``State=IDLE`` does not set the node's state.
    A key seen twice keeps its first value (Slurm prints each once).
    Not for ``show job`` lines, whose owner-set fields stand among Slurm's: :meth:`SlurmAccess.jobs` reads jobs."""
    out: dict[str, str] = {}
    kept: list[re.Match[str]] = []
    hard_end, soft_from = -1, None  # inside a stamped reason: no key; inside other free text: only another free key
    for m in _KEY.finditer(line):
        key = m.group(1)
        if m.start() < hard_end or (soft_from is not None and (key not in free_text or key == soft_from)):
            continue
        kept.append(m)
        hard_end, soft_from = -1, None
        if key in free_text:
            stamp = _STAMP.search(line, m.end()) if key == "Reason" else None
            if stamp:
                hard_end = stamp.end()
            else:
                soft_from = key
    for m, nxt in zip(kept, kept[1:] + [None]):
        out.setdefault(m.group(1), line[m.end(): nxt.start() if nxt else len(line)].strip())
    return out


def parse_jobs(text: str) -> list[dict[str, str]]:
    """``squeue -h -O`` output of :data:`JOB_FIELDS` as one dict per job, keyed as ``scontrol`` names the fields.

    A line that does not have every field in Slurm's form is not a job (it cannot come from a job's own text:
    none is asked for). ``ExitCode`` reads as ``scontrol`` prints it (``3:0``: exit status 3, no signal);
    an empty ``NodeList`` or a ``BatchHost`` of ``n/a`` (a pending job) is ``(null)``; an array task also has
    ``ArrayJob`` (``123_4``: the id it is named by)."""
    out = []
    for line in text.split("\n"):
        m = _JOB_LINE.fullmatch(line)
        if m is None:
            continue
        fields = {key: m.group(f"f{i}") for i, (_, key, _) in enumerate(JOB_FIELDS)}
        code = fields["ExitCode"]
        fields["ExitCode"] = f"{int(code) >> 8}:{int(code) & 0x7F}" if code.isdigit() else "0:0"
        for key in ("NodeList", "BatchHost"):
            if fields[key] in ("", "n/a"):
                fields[key] = "(null)"
        if fields["ArrayTaskId"].isdigit():
            fields["ArrayJob"] = f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}"
        out.append(fields)
    return out


def job_ids(fields: dict[str, str]) -> set[str]:
    """The ids a job of :func:`parse_jobs` answers to: its own, and ``ARRAY_TASK`` for an array task."""
    return {fields["JobId"], *([fields["ArrayJob"]] if "ArrayJob" in fields else [])}


def node_reason(fields: dict[str, str]) -> tuple[str, str | None]:
    """A node's ``Reason`` without the ``[user@time]`` Slurm adds when it shows it: ``(text, user)``."""
    reason = fields.get("Reason", "")
    m = _REASON_STAMP.fullmatch(reason)
    return (m.group(1), m.group(2)) if m else (reason, None)


@dataclass(frozen=True)
class SlurmAccess:
    """How to reach one Slurm cluster's controller from this machine."""

    conf: str | None = None
    """``SLURM_CONF`` for every command; ``None``: the machine's default configuration."""
    bin_dir: str | None = None
    """Where the client commands are; ``None``: ``PATH``."""
    timeout: float = 10.0

    def argv(self, tool: str, *args: str) -> list[str]:
        """The command line as it would run (and as a lease's watchdog runs it): ``env SLURM_CONF=... tool args``."""
        exe = os.path.join(self.bin_dir, tool) if self.bin_dir else tool
        return [*(["env", f"SLURM_CONF={self.conf}"] if self.conf else []), exe, *args]

    def resume_argv(self, node: str, reason: str, marked: bool = False) -> list[str]:
        """The command that resumes ``node`` only while it is drained with ``reason`` (:meth:`resume_if_drained_by`),
        as a lease's watchdog and ``chaoskit rollback`` run it; ``marked``: with a reason that contains ``reason``
        (a drill's marker, in the reason a site's health check wrote)."""
        return [*(["env", f"SLURM_CONF={self.conf}"] if self.conf else []), sys.executable, "-m", "chaoskit.cluster.slurm",
                "resume", *(["--bin-dir", self.bin_dir] if self.bin_dir else []), *(["--marked"] if marked else []),
                "--", node, reason]

    def env(self) -> dict[str, str]:
        """Variables a process started here needs to talk to this cluster (sbatch's job inherits them)."""
        return {"SLURM_CONF": self.conf} if self.conf else {}

    def run(self, tool: str, *args: str, check: bool = True, timeout: float | None = None,
            cwd: str | None = None, env: dict[str, str] | None = None,
            as_user: SubmitUser | None = None, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """``tool`` on the controller; ``as_user``: as that user (uid, gid, groups), with only their own
        environment and ``env`` (none of this process's), from ``/`` (the child changes folder before it drops
        root, so never into one of theirs). ``input``: its standard input (else none).

        From ``bin_dir``, the program is opened once, checked on what was opened (root alone can change it:
        :func:`~chaoskit.core.trusted.open_program`) and run as that file (``/proc/self/fd/N``): a link in
        ``bin_dir`` swapped after the check is never run. :class:`InfraError` when it fails the check."""
        ids: dict[str, Any] = {}
        base = os.environ
        if as_user is not None:
            ids = {"user": as_user.uid, "group": as_user.gid, "extra_groups": list(as_user.groups)}
            base, cwd = as_user.env(), "/"
        program: CheckedFile | None = None
        if self.bin_dir:
            try:
                program = open_program(os.path.join(self.bin_dir, tool))
            except FileNotFoundError:
                raise InfraError(f"{tool}: not found in {self.bin_dir}", hint="cluster.slurm.bin") from None
            except UntrustedFile as exc:
                raise InfraError(f"cluster.slurm.bin: {exc}; not run") from None
            ids.update(executable=program.exec_path(), pass_fds=(program.fd,))
        argv = [tool, *args]
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout or self.timeout, cwd=cwd,
                                 input=input, stdin=None if input is not None else subprocess.DEVNULL,
                                 env={**base, **self.env(), **(env or {})}, **ids)
        except FileNotFoundError:
            raise InfraError(f"{tool}: not found on the controller", hint="apt-get install slurm-client") from None
        except subprocess.TimeoutExpired:
            raise InfraError(f"{' '.join(self.argv(tool, *args))}: no answer within {timeout or self.timeout:g}s") from None
        finally:
            if program is not None:
                program.close()
        if check and res.returncode != 0:
            raise InfraError(f"{tool} {' '.join(args)} failed (exit {res.returncode}): {(res.stderr or res.stdout).strip()}")
        return res

    def jobs(self, ids: set[str] | None = None) -> list[dict[str, str]]:
        """Jobs slurmctld still knows (running, pending, and done ones younger than MinJobAge), every one or those
        of ``ids``, as :func:`parse_jobs` reads them."""
        if ids is not None and not ids:
            return []
        if ids and not all(_JOB_ID.fullmatch(i) for i in ids):
            raise InfraError(f"not Slurm job ids: {', '.join(sorted(ids))}")
        which = ["-j", ",".join(sorted(ids))] if ids else []
        res = self.run("squeue", "-h", "-t", "all", *which, "-O", _JOB_FORMAT, check=False)
        if res.returncode != 0:
            if ids and "Invalid job id" in res.stdout + res.stderr:
                return []  # none of them known any more
            raise InfraError(f"squeue failed: {(res.stderr or res.stdout).strip()}")
        return parse_jobs(res.stdout)

    def job(self, job_id: str) -> dict[str, str] | None:
        """One job's fields, or ``None`` when slurmctld no longer knows it."""
        if not _JOB_ID.fullmatch(job_id):
            raise InfraError(f"not a Slurm job id: {job_id!r}")
        return next((f for f in self.jobs({job_id}) if job_id in job_ids(f)), None)

    def job_field(self, job_id: str, field: str) -> str | None:
        """One field of one job that its owner may have written anything into (:data:`USER_JOB_FIELDS`, e.g.
        ``STDOUT``), asked for alone so that the whole answer is its value; ``None`` when Slurm does not know the job."""
        if not job_id.isdigit() or field not in USER_JOB_FIELDS:
            raise InfraError(f"cannot read field {field!r} of job {job_id!r}")
        res = self.run("squeue", "-h", "-t", "all", "-j", job_id, "-O", f"{field}:|", check=False)
        if res.returncode != 0 or not res.stdout.endswith("|\n"):
            return None
        return res.stdout[:-2]

    def own_job_outputs(self, job_id: str) -> dict[str, str]:
        """``StdOut`` and ``StdErr`` of a job this run submitted, as Slurm expanded them (``%j``...): read from
        ``scontrol show job``, whose last fields they are. Only for chaoskit's own job, whose owner wrote the script
        being drilled: these fields are whatever its ``--output``/``--error`` say."""
        if not job_id.isdigit():
            raise InfraError(f"not a Slurm job id: {job_id!r}")
        res = self.run("scontrol", "-o", "show", "job", job_id, check=False)
        line = next((x for x in res.stdout.split("\n") if x.startswith(f"JobId={job_id} ")), "")
        m = _OUTPUTS.search(line)
        return {"StdErr": m.group(1), "StdOut": m.group(2)} if m and res.returncode == 0 else {}

    def nodes(self) -> dict[str, dict[str, str]]:
        """Every node's fields by name (``State`` such as ``IDLE``, ``ALLOCATED``, ``DOWN+NOT_RESPONDING``, ``IDLE+DRAIN``)."""
        res = self.run("scontrol", "-o", "show", "node")
        return {f["NodeName"]: f for f in map(parse_show, res.stdout.splitlines()) if "NodeName" in f}

    def jobs_on(self, node: str) -> list[dict[str, str]]:
        """The jobs running on ``node`` (whoever's they are)."""
        res = self.run("squeue", "-h", "-t", "RUNNING,CONFIGURING", "-w", node, "-O", _JOB_FORMAT)
        return parse_jobs(res.stdout)

    def node_state(self, node: str) -> tuple[str, str, str | None]:
        """``node``'s state as Slurm prints it (``IDLE+DRAIN``), its reason and who set it; :class:`InfraError` when
        Slurm has no such node."""
        fields = self.nodes().get(node)
        if fields is None:
            raise InfraError(f"Slurm knows no node {node!r}")
        reason, by = node_reason(fields)
        return fields.get("State", ""), reason, by

    def resume_if_drained_by(self, node: str, reason: str, marked: bool = False) -> str:
        """Resume ``node`` only while it is drained with ``reason`` (the drain chaoskit made): a node an administrator
        drained meanwhile, with a reason of their own, stays drained. Says what it did; :class:`InfraError` when
        scontrol refuses."""
        state, now, by = self.node_state(node)
        if "DRAIN" not in state.split("+"):
            return f"node {node} is not drained ({state}): nothing to resume"
        if (reason not in now) if marked else (now != reason):
            return f"node {node} is drained by {by or 'someone'} for {now!r}, not by chaoskit: left drained"
        res = self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        if res.returncode != 0 and "not drained" not in (res.stderr + res.stdout).lower():
            raise InfraError(f"scontrol could not resume node {node}: {(res.stderr or res.stdout).strip()}")
        return f"node {node} resumed"

    def completing(self, job_id: str) -> bool:
        """Whether the job's processes are still being killed (``COMPLETING``) somewhere."""
        res = self.run("squeue", "-h", "-j", job_id, "-t", "COMPLETING", "-o", "%i", check=False)
        return bool(res.stdout.strip())

    def describe(self) -> dict[str, Any]:
        return {"conf": self.conf, "bin_dir": self.bin_dir}


def node_list(value: str | None) -> list[str]:
    """``n[0-1],n3`` -> ``[n0, n1, n3]`` (the bracket forms Slurm prints for small lists)."""
    if not value or value in ("(null)", "None"):
        return []
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", value):
        m = re.fullmatch(r"(.*)\[([^\]]*)\]", part)
        if not m:
            out.append(part)
            continue
        prefix, ranges = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                out.append(f"{prefix}{i:0{width}d}")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m chaoskit.cluster.slurm resume NODE REASON``: what a ``slurm.drain`` lease's watchdog (and
    ``chaoskit rollback``) runs: :meth:`SlurmAccess.resume_if_drained_by`. ``SLURM_CONF`` as for Slurm's own commands."""
    parser = argparse.ArgumentParser(prog="python -m chaoskit.cluster.slurm")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_resume = sub.add_parser("resume", help="resume NODE if it is still drained with REASON")
    p_resume.add_argument("--bin-dir", default=None)
    p_resume.add_argument("--marked", action="store_true", help="REASON is a marker the node's reason must contain")
    p_resume.add_argument("node")
    p_resume.add_argument("reason")
    args = parser.parse_args(argv)
    try:
        print(SlurmAccess(conf=os.environ.get("SLURM_CONF"), bin_dir=args.bin_dir).resume_if_drained_by(args.node, args.reason, args.marked))
    except InfraError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
