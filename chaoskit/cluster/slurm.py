"""A Slurm cluster's own commands (``scontrol``, ``sbatch``, ``squeue``, ``sinfo``, ``scancel``), run on the controller.

:class:`SlurmAccess` is all a fault, a probe or a job needs to act through Slurm:
which ``slurm.conf`` (``SLURM_CONF``; ``None``: the machine's own) and where the
binaries are. Every command runs without a shell, with a deadline. States are read
with ``scontrol -o show``, one line per job or node: it carries what the probe needs
(``Restarts``, ``Reason``, ``BatchHost``, the node flags) in a form older Slurms print
too, where ``squeue --json`` exists from 21.08 on only and its layout changes with
the data_parser version.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from typing import Any

from chaoskit.core.errors import InfraError

__all__ = ["SlurmAccess", "parse_show", "node_list", "JOB_DONE_STATES"]

JOB_DONE_STATES = frozenset({
    "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED",
})
"""Job states after which a job does not run again by itself (NODE_FAIL is not one: a ``--requeue`` job comes back)."""

_KEY = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9_:/]*)=")


def parse_show(line: str) -> dict[str, str]:
    """One line of ``scontrol -o show job|node`` as a dict (values may hold spaces: ``Reason=Not responding``)."""
    out: dict[str, str] = {}
    matches = list(_KEY.finditer(line))
    for m, nxt in zip(matches, matches[1:] + [None]):
        out[m.group(1)] = line[m.end(): nxt.start() if nxt else len(line)].strip()
    return out


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

    def env(self) -> dict[str, str]:
        """Variables a process started here needs to talk to this cluster (sbatch's job inherits them)."""
        return {"SLURM_CONF": self.conf} if self.conf else {}

    def run(self, tool: str, *args: str, check: bool = True, timeout: float | None = None,
            cwd: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        argv = self.argv(tool, *args)
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout or self.timeout, cwd=cwd,
                                 stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
        except FileNotFoundError:
            raise InfraError(f"{tool}: not found on the controller", hint="apt-get install slurm-client") from None
        except subprocess.TimeoutExpired:
            raise InfraError(f"{' '.join(argv)}: no answer within {timeout or self.timeout:g}s") from None
        if check and res.returncode != 0:
            raise InfraError(f"{tool} {' '.join(args)} failed (exit {res.returncode}): {(res.stderr or res.stdout).strip()}")
        return res

    def jobs(self) -> list[dict[str, str]]:
        """Every job slurmctld still knows (running, pending, and done ones younger than MinJobAge)."""
        res = self.run("scontrol", "-o", "show", "job", check=False)
        if res.returncode != 0:
            if "No jobs" in res.stdout + res.stderr:
                return []
            raise InfraError(f"scontrol show job failed: {(res.stderr or res.stdout).strip()}")
        return [parse_show(line) for line in res.stdout.splitlines() if line.startswith("JobId=")]

    def job(self, job_id: str) -> dict[str, str] | None:
        """One job's fields, or ``None`` when slurmctld no longer knows it."""
        res = self.run("scontrol", "-o", "show", "job", job_id, check=False)
        lines = [line for line in res.stdout.splitlines() if line.startswith("JobId=")]
        return parse_show(lines[0]) if res.returncode == 0 and lines else None

    def nodes(self) -> dict[str, dict[str, str]]:
        """Every node's fields by name (``State`` such as ``IDLE``, ``ALLOCATED``, ``DOWN+NOT_RESPONDING``, ``IDLE+DRAIN``)."""
        res = self.run("scontrol", "-o", "show", "node")
        return {f["NodeName"]: f for f in map(parse_show, res.stdout.splitlines()) if "NodeName" in f}

    def jobs_on(self, node: str) -> list[str]:
        """Ids of the jobs running on ``node``."""
        res = self.run("squeue", "-h", "-t", "RUNNING,CONFIGURING", "-w", node, "-o", "%i")
        return [line.strip() for line in res.stdout.splitlines() if line.strip()]

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

