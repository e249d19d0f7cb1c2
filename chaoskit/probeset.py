"""The probes one run reads, built from its scenario: the safety stop conditions, the job's log lines through the
stack's presets, the SDK's events, the files of ``probes.log_files``, Prometheus, the process watcher, the cluster's
own probes (a scheduler's, a Ray cluster's nodes), the nodes' kernel log and GPUs, and the silent-data watch.

The runner (:mod:`chaoskit.runner`) asks a :class:`ProbeSet` to start before the job and to stop after it; what is
particular to one probe (an OOM kill in a fault's own cgroup, a kernel log chaoskit could not read) is said here.
Each probe that does not apply is ``None`` from the start.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from chaoskit.backends.api import ClusterHandle, Probe
from chaoskit.cluster.transports.api import FileFollower
from chaoskit.core.errors import InfraError, SafetyAbort
from chaoskit.faults.api import Injection
from chaoskit.observe.events import EventBus
from chaoskit.observe.gpu import NvmlProbe, RemoteNvmlProbe
from chaoskit.observe.kmsg import KmsgProbe
from chaoskit.observe.probes import FileLogProbe, LogRegexProbe, ProcessWatcher, RemoteLogProbe, SdkLogProbe
from chaoskit.observe.prometheus import PrometheusProbe, StopWatcher
from chaoskit.observe.sdc import SilentWatch
from chaoskit.scenario.checks import uses_inproc_channel
from chaoskit.stacks.registry import stack_of
from chaoskit.workloads.api import JobFolders

__all__ = ["ProbeSet"]


class ProbeSet:
    """The probes of one run (``sc``: its scenario) on ``cluster``, publishing to ``bus``:
    :meth:`watch_stop_conditions` (preflight), :meth:`start` (before the job), :meth:`watch_silent_data` (once the
    job is built), :meth:`stop` (after the job), and what the result reads of them."""

    def __init__(self, sc: Any, cluster: ClusterHandle, bus: EventBus) -> None:
        self.sc, self.cluster, self.bus = sc, cluster, bus
        self.stop_watcher: StopWatcher | None = None
        self.prometheus: PrometheusProbe | None = None
        self.log: LogRegexProbe | None = None
        self.sdk: SdkLogProbe | None = None
        self.kmsg: KmsgProbe | None = None
        self.process_watcher: ProcessWatcher | None = None
        self.silent_watch: SilentWatch | None = None
        self.threads: list[Probe] = []
        """The probes started before the job, stopped after it (in this order)."""

    def watch_stop_conditions(self) -> int:
        """``safety.stop_when``: each query must give a number now (:class:`InfraError`, exit 3) and must not hold
        already (:class:`SafetyAbort`, exit 4); then a thread evaluates them until :meth:`stop`, and
        :attr:`stop_fired` says which fired. The number of conditions watched."""
        conditions = self.sc.safety.stop_when
        if not conditions:
            return 0
        watcher = StopWatcher(self.bus, conditions)
        unanswered, holding = watcher.preflight()
        if unanswered:
            raise InfraError(f"{unanswered[0]}; nothing was injected",
                             hint="a stop condition's query must return one number: check the URL and the query in Prometheus")
        if holding:
            raise SafetyAbort(holding[0])
        self.stop_watcher = watcher
        watcher.start()
        return len(conditions)

    @property
    def stop_fired(self) -> dict[str, Any] | None:
        """The stop condition that fired (its ``message``), or ``None``."""
        return self.stop_watcher.fired if self.stop_watcher is not None else None

    def start(self, folders: JobFolders, owner: Any) -> None:
        """Build and start the probes read while the job runs, before it starts: ``folders`` are the job's (its SDK
        events file, the folder a relative log file is in), ``owner`` the user it runs as (``None``: chaoskit)."""
        sc, inventory = self.sc, self.cluster.inventory
        rules, tee = sc.probes.log_rules(stack_of(sc.workload).presets)  # the stack's own lines: who noticed
        self.log = LogRegexProbe(self.bus, rules, tee_prefixes=tee)
        if folders.sdk_events is not None:
            self.sdk = SdkLogProbe(self.bus, folders.sdk_events)
            self.threads.append(self.sdk)
        for lf in sc.probes.log_files:
            conn = inventory[lf.node].conn
            roots = inventory.policy.log_roots if inventory.policy is not None else None
            if Path(lf.path).is_absolute() and isinstance(conn, FileFollower):  # on the node, read there by its agent
                self.threads.append(RemoteLogProbe(self.log, lf.node, conn, lf.path, roots=roots))
                continue
            # on this machine, as root: below the job's folder (no link followed), or inside the policy's log_roots;
            # only a file of the job's user (or chaoskit's), never one only root may read
            owners = (owner.uid, os.geteuid()) if owner is not None else (os.geteuid(),)
            self.threads.append(FileLogProbe(self.log, lf.node, Path(lf.path), owners=owners, roots=roots or [])
                                if Path(lf.path).is_absolute() else
                                FileLogProbe(self.log, lf.node, Path(lf.path), folder=folders.root, owners=owners))
        if sc.probes.prometheus:  # the site's monitoring as a detection source
            self.prometheus = PrometheusProbe(self.bus, sc.probes.prometheus)
            self.threads.append(self.prometheus)
        if sc.probes.process:
            self.process_watcher = ProcessWatcher(self.bus, {n.name: n.conn for n in inventory.nodes},
                                                  heartbeat_timeout=sc.probes.heartbeat_timeout)
            self.threads.append(self.process_watcher)
        self.threads.extend(self.cluster.probes(self.bus))
        # The nodes' own health: OOM kills in the kernel's log, Xid and ECC errors from NVML; each is None
        # (not started, silent) where it cannot read anything. The kernel-log probe takes the nodes' workers
        # from the process watcher where one runs (no second poll of every node).
        watcher = self.process_watcher
        self.kmsg = KmsgProbe.for_nodes(self.bus, inventory.nodes, workers=watcher.ranks if watcher is not None else None)
        for health in (self.kmsg, NvmlProbe.for_nodes(self.bus, inventory.nodes),
                       RemoteNvmlProbe.for_nodes(self.bus, inventory.nodes)):
            if health is not None:
                self.threads.append(health)
        for t in self.threads:
            t.start()

    @property
    def on_line(self) -> Callable[[str, str, float], None]:
        """Where each line of the job's output goes (``on_line(node, line, ts)``), once :meth:`start` ran."""
        return self.log.feed

    def watch_silent_data(self) -> None:
        """Where the run uses the in-process channel: watch the ranks' losses and checksums (silent data corruption)."""
        if uses_inproc_channel(self.sc):
            self.silent_watch = SilentWatch(self.bus)
            self.silent_watch.start()

    @property
    def disagree_at_end(self) -> bool | None:
        """Whether the ranks' checksums at exit differed (``None``: not watched, or fewer than two reported)."""
        return self.silent_watch.disagree_at_end if self.silent_watch is not None else None

    def injected(self, inj: Injection) -> None:
        """A fault is in: what a probe must know of it (an OOM kill in a cgroup the fault made is this run's)."""
        if self.kmsg is not None and inj.oom_cgroup is not None:
            self.kmsg.claim_cgroup(inj.oom_cgroup)

    def problems(self) -> list[str]:
        """What the probes could not read, for result.json's notes: each probe's errors and a node's kernel log
        chaoskit could not read (five at most)."""
        kernel_logs = [f"kernel log of {e}" for e in (self.kmsg.errors if self.kmsg is not None else [])
                       if "cannot read the kernel log" in e][:5]
        return ((self.log.errors if self.log is not None else []) + kernel_logs
                + (self.sdk.errors if self.sdk is not None else [])
                + [e for t in self.threads if isinstance(t, FileLogProbe) for e in t.errors])

    def watch_notes(self) -> list[str]:
        """What the stop conditions and Prometheus say of themselves, for result.json's notes."""
        return [n for w in (self.stop_watcher, self.prometheus) if w is not None for n in w.notes()]

    def stop(self) -> None:
        """Stop every probe started (after the job), the stop conditions' thread last."""
        for t in self.threads:
            t.stop()
        if self.stop_watcher is not None:
            self.stop_watcher.stop()
