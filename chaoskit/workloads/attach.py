"""``launch: attach``: a training job somebody else started, found on the nodes and never touched.

Its workers are the processes of each job node whose command line matches
``workload.process`` and whose environment carries torchrun's ``RANK`` (read by
the node's agent, with ``LOCAL_RANK`` and ``TORCHELASTIC_RESTART_COUNT``). chaoskit
does not start it, stop it or wait for it to end: the run's faults are reverted and
the job is left as it is. Its progress is seen through the scenario's log probes.

With ``slurm_job: ID`` (on a cluster whose handle has a ``scheduler``) the job is one
that Slurm runs: its nodes are the ones Slurm allocated it (``scontrol show job``, asked
again at every look, since a requeued job moves), the run's Slurm probe follows its
states, and a job Slurm does not know stops the run before anything is injected.

On a shared node other jobs may match ``workload.process`` too (another user's ``train.py``
with its own ``RANK=1``). A job is told apart by what only it has: torchrun's run id
(``TORCHELASTIC_RUN_ID``), the uid it runs as and, under Slurm, its ``SLURM_JOB_ID``. A job is
chosen only when it is plausibly the operator's and consistently there (:func:`why_not`):

- its uid is one the operator acts as on the node (the node agent's, the login user's) unless
  ``workload.user`` or ``run_id`` names it; with ``slurm_job``, it is the uid Slurm's own record gives
  the job (``squeue``'s ``UserId``, read with its allocation): anyone may put ``SLURM_JOB_ID=ID`` in a
  process's environment, so a process of another uid that says so is a look-alike, never the job's;
- it has workers on every node the scenario names (or Slurm allocated it): a one-node look-alike is
  never taken for a multi-node job;
- each torchrun worker has its torchrun agent (its parent, same uid, ``torchrun`` or
  ``torch.distributed.run`` on its command line); a worker with no run id only under ``slurm_job``;
- two looks at least :data:`CONFIRM_S` apart saw it so, with the same agents (a job whose workers are
  being replaced while chaoskit looks is chosen once they are back; another job seen alone meanwhile
  is not).

When more than one job passes, the run stops before anything is injected and lists them
(``workload.run_id`` or ``workload.user`` picks one); when none does before steady state's timeout, it
stops (exit 3) saying what was seen and why each was not taken. Once the job is chosen, its scope
(:class:`~chaoskit.cluster.transports.api.JobScope`) is set on every node's transport, whose
agent then enforces it: nothing outside it is listed, signalled, throttled or killed. Until
then nothing of any job is in scope.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any, Callable

from chaoskit.backends.api import ClusterHandle
from chaoskit.cluster.slurm import JOB_DONE_STATES, node_list
from chaoskit.cluster.transports.api import JobScope, ProcInfo
from chaoskit.core.errors import InfraError
from chaoskit.core.patterns import bounded_search, compile_pattern
from chaoskit.workloads.api import Job

__all__ = ["AttachedJob", "Worker", "jobs_matching", "job_picked", "why_not", "operator_uids", "policy_refuses", "user_uid",
           "describe_job", "describe_job_dict", "slurm_uid", "AGENT_MARKS", "CONFIRM_S"]

LineSink = Callable[[str, str, float], None]
POLL_S = 0.5
CONFIRM_S = 1.0
"""A job is chosen once two looks at least this far apart saw it whole, with the same torchrun agents."""
AGENT_MARKS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
"""What a torchrun agent's command line holds (the console script, or ``python -m`` of its module)."""


class Worker(dict):
    """One worker as found: ``node``, ``pid``, ``rank``, ``local_rank``, ``restart_count``."""


class AttachedJob(Job):
    """The runner's :class:`~chaoskit.workloads.api.Job` for a job chaoskit did not start: found, never touched."""

    started = False

    def __init__(self, cluster: ClusterHandle, workload: Any, run_dir: Path, run_id: str,
                 events_path: Path | None = None, on_line: LineSink | None = None, *, base: Path | None = None) -> None:
        """``run_dir``, ``run_id``, ``events_path``, ``on_line`` and ``base``: unused (the job's progress comes
        through the scenario's log probes)."""
        self.cluster, self.workload = cluster, workload
        self.pattern = compile_pattern(workload.process)
        self.slurm_job: str | None = getattr(workload, "slurm_job", None)
        self.slurm: dict[str, str] = {}
        """The Slurm job's fields as last read (``slurm_job`` only)."""
        self.run_id: str | None = getattr(workload, "run_id", None)
        self.user: str | None = getattr(workload, "user", None)
        self.scope: JobScope | None = None
        """The job's scope once chosen (its run id, uid, Slurm job); set on every node's transport."""
        self.others: list[dict[str, Any]] = []
        """Jobs on the nodes that match ``process`` but are not the drilled one (run id, uid, nodes)."""
        self.found_at: float | None = None
        self.workers: list[Worker] = []
        self._matches = 0
        self._checked = 0.0
        self._uids: dict[str, int | None] = {}
        self._seen: list[dict[str, Any]] = []
        """The jobs matching ``process`` at the last look before one was chosen (each with its ``why_not``)."""
        self._first: tuple[Any, float] | None = None
        """The plausible job of the previous looks (its identity: scope, agents) and when it was first seen so."""
        self._own: dict[str, set[int]] = {}
        """node -> the uids the operator acts as there (:func:`operator_uids`)."""
        self.looks = 0
        """Looks at the nodes before the job was chosen."""
        self._policy_uids: dict[str, dict[str, int | None]] = {}
        """user -> node -> uid, for the site policy's jobs.users."""
        self._lock = threading.Lock()
        self.watch: Any = None
        """The run's process watcher (:meth:`use_watch`): where a node's ``watch`` stream is live, its table is
        read again only after the stream said something (``changes``); else every look reads it."""
        self._tables_seen: dict[str, tuple[int, list[ProcInfo], bool]] = {}
        """node -> (the watcher's change count, the table read then, whether it was settled) of the last read."""
        self.reads = 0
        """Process tables read from the nodes (the job's scope; for the cost of discovery)."""
        cluster.scope_job(JobScope(pending=True))  # nothing of any job is in scope until the job is chosen

    def commands(self) -> dict[str, list[str]]:
        """Nothing is started on any node."""
        return {}

    def found_where(self) -> str:
        return f"Slurm job {self.slurm_job}" if self.slurm_job is not None else super().found_where()

    def describe(self) -> str:
        """What ``--dry-run`` says instead of commands."""
        if self.slurm_job is not None:
            return (f"attached, never started or stopped: Slurm job {self.slurm_job}'s processes matching "
                    f"'{self.workload.process}' with torchrun's RANK in their environment, running as the job's user and on "
                    "the nodes Slurm allocated it (Slurm's own record, not a process's SLURM_JOB_ID)")
        nodes = self.cluster.job_nodes
        where = ", ".join(nodes) if len(nodes) <= 4 else f"{nodes[0]} .. {nodes[-1]} ({len(nodes)} nodes)"
        return (f"attached, never started or stopped: the processes matching '{self.workload.process}' with torchrun's "
                f"RANK in their environment on {where}")

    def start(self, nodes: list[str] | None = None) -> None:
        """Look for the job once now; it may also start later (``running`` keeps looking).

        :class:`InfraError` when ``slurm_job`` names a job Slurm does not know, or one whose user Slurm does not
        say (nothing was touched)."""
        if self.slurm_job is not None:
            assert self.cluster.scheduler is not None
            fields = self.cluster.scheduler.job(self.slurm_job)
            if fields is None:
                raise InfraError(f"workload.slurm_job: Slurm knows no job {self.slurm_job}; nothing was injected",
                                 hint="squeue shows the queued and running jobs (a finished one is forgotten after MinJobAge)")
            if slurm_uid(fields) is None:
                raise InfraError(f"workload.slurm_job: Slurm gives no user for job {self.slurm_job} "
                                 f"(UserId {fields.get('UserId')!r}), so none of its processes can be told from a "
                                 "look-alike; nothing was injected")
            self.slurm = fields
            rule = self._jobs_rule()
            problem = rule.refuses_slurm(fields) if rule is not None else None
            if problem:
                raise InfraError(f"workload.slurm_job: Slurm job {self.slurm_job} may not be drilled here: {problem}; "
                                 "nothing was injected")
            self.cluster.scheduler_jobs.add(self.slurm_job)
        self.scan()

    def plan_part(self) -> dict[str, Any]:
        return {"attach": self.describe()}

    def scan(self) -> list[Worker]:
        """The job's workers on its nodes now (and whether any process of it is there at all).

        Until the job is chosen, the nodes' whole scope is read and the matching workers grouped by job;
        exactly one job (after ``run_id``/``user``) is chosen, more than one is an :class:`InfraError`
        listing them (nothing was injected)."""
        nodes = self._allocation() if self.slurm_job is not None else self.cluster.job_nodes
        if self.scope is None:
            self._choose(nodes)
        workers: list[Worker] = []
        matches = 0
        if self.scope is not None:
            for name, procs in self._tables(nodes, node_wide=False).items():
                conn = self.cluster.inventory[name].conn
                if hasattr(conn, "job"):  # its agents stay the job's while they restart their workers
                    conn.job = (conn.job or self.scope).with_agents(procs)
                for p in procs:
                    if p.state == "Z" or not bounded_search(self.pattern, p.cmdline, "workload.process"):
                        continue
                    matches += 1
                    if p.rank is None:
                        continue
                    workers.append(Worker(
                        node=name, pid=p.pid, rank=p.rank, local_rank=_int(p.env.get("LOCAL_RANK")),
                        restart_count=_int(p.env.get("TORCHELASTIC_RESTART_COUNT")),
                    ))
        with self._lock:
            self.workers, self._matches, self._checked = workers, matches, time.monotonic()
            if workers and self.found_at is None:
                self.found_at = time.time()
        return workers

    def use_watch(self, watcher: Any) -> None:
        """Take the nodes' news from ``watcher`` (a :class:`~chaoskit.observe.probes.ProcessWatcher` of the same
        nodes, with ``changes(node)``): a look costs nothing on a node whose stream has said nothing since."""
        self.watch = watcher

    def scope_chosen(self) -> bool:
        """Once chosen: until then steps from the log files say nothing of whose processes a fault would hit."""
        return self.scope is not None

    def _tables(self, nodes: list[str], node_wide: bool) -> dict[str, list[ProcInfo]]:
        out = {}
        for name in nodes:
            # Read before the table, so a change that lands during the read makes the next look read again.
            news = self.watch.changes(name) if self.watch is not None and not node_wide else None
            seen = self._tables_seen.get(name)
            if news is not None and seen is not None and seen[0] == news and seen[2]:
                out[name] = seen[1]
                continue
            conn = self.cluster.inventory[name].conn
            try:
                procs = conn.processes(node_wide=node_wide)
            except InfraError:
                self._tables_seen.pop(name, None)
                continue
            self.reads += 1
            out[name] = procs
            if news is not None:
                self._tables_seen[name] = (news, procs, self._settled(procs))
            else:
                self._tables_seen.pop(name, None)
        return out

    def _settled(self, procs: list[ProcInfo]) -> bool:
        """Whether a node's table can be kept until its stream says otherwise: every matching process is a worker
        (the stream reports those), or none matches. A torchrun agent outliving its workers ends without news."""
        matching = [p for p in procs if p.state != "Z" and bounded_search(self.pattern, p.cmdline, "workload.process")]
        return all(p.rank is not None for p in matching)

    def _choose(self, nodes: list[str]) -> None:
        """Pick the drilled job among those whose workers match on ``nodes``, and scope every node to it: the
        one plausible job (:func:`why_not`), seen so by two looks :data:`CONFIRM_S` apart with the same agents."""
        jobs = jobs_matching(self._tables(nodes, node_wide=True), self.pattern, self.slurm_job)
        self.looks += 1
        now = time.monotonic()
        slurm = (self.slurm_job, slurm_uid(self.slurm)) if self.slurm_job is not None else None
        for j in jobs:
            j["why_not"] = [] if not self._picked(j) else why_not(j, nodes, self._named(), self._own_uids, slurm)
            if self._picked(j) and not j["why_not"]:
                j["why_not"] = self._policy_refuses(j)
        self._seen = jobs
        plausible = [j for j in jobs if self._picked(j) and not j["why_not"]]
        if len(plausible) > 1:
            listed = "; ".join(self._describe(j) for j in plausible)
            raise InfraError(
                f"workload.process '{self.workload.process}' matches the workers of {len(plausible)} jobs on the nodes: "
                f"{listed}; chaoskit drills exactly one, so nothing was injected",
                hint="pick one with workload.run_id: RUN_ID (torchrun's --rdzv-id) or workload.user: USER",
            )
        if not plausible:
            self._first = None
            return  # only other jobs so far: ours may start later (diagnosis() names what was seen)
        chosen = plausible[0]
        key = (chosen["scope"], chosen["identity"])
        if self._first is None or self._first[0] != key:
            self._first = (key, now)
            return  # seen once: chosen only if the next looks see the same
        if now - self._first[1] < CONFIRM_S:
            return
        self.scope = chosen["scope"]
        self.others = [self._describe_dict(j) for j in jobs if j is not chosen]
        self.cluster.scope_job(self.scope)

    def _jobs_rule(self) -> Any:
        policy = getattr(self.cluster.inventory, "policy", None)
        return getattr(policy, "jobs", None)

    def _policy_refuses(self, job: dict[str, Any]) -> list[str]:
        return policy_refuses(job, self._jobs_rule(), self.cluster.inventory, self._policy_uids)

    def _named(self) -> bool:
        """Whether the operator named the job (then its uid need not be theirs)."""
        return self.run_id is not None or self.user is not None or self.slurm_job is not None

    def _own_uids(self, node: str) -> set[int]:
        if node not in self._own:
            self._own[node] = operator_uids(self.cluster.inventory[node].conn)
        return self._own[node]

    def _picked(self, job: dict[str, Any]) -> bool:
        return job_picked(job, self.run_id, self.user, lambda node, user: user_uid(self.cluster.inventory, node, user, self._uids))

    def _describe_dict(self, job: dict[str, Any]) -> dict[str, Any]:
        return describe_job_dict(job)

    def _describe(self, job: dict[str, Any]) -> str:
        return describe_job(job)

    def scope_note(self) -> str:
        """What ``--dry-run`` says of the job's scope."""
        picks = " and ".join(x for x in (f"run id {self.run_id}" if self.run_id else "",
                                         f"user {self.user}" if self.user else "") if x)
        return ("only the drilled job's processes are ever acted on (its torchrun run id, uid"
                + (", Slurm job" if self.slurm_job is not None else "") + ", enforced by each node's agent)"
                + (f": the job with {picks}" if picks else "")
                + f"; when the workers of more than one job match '{self.workload.process}' the run stops before "
                "anything is injected")

    def _allocation(self) -> list[str]:
        """The Slurm job's nodes now, those of them this inventory lists; none while it waits for an allocation
        (another job's processes on idle nodes are never taken for its workers). The handle's job nodes follow."""
        assert self.cluster.scheduler is not None and self.slurm_job is not None
        try:
            fields = self.cluster.scheduler.job(self.slurm_job)
        except InfraError:
            if not self.slurm:
                return []
            fields = self.slurm  # slurmctld busy: keep the last answer
        if fields is None:
            self.slurm = {**self.slurm, "JobState": "GONE"}
            return []
        self.slurm = fields
        if fields.get("JobState") not in ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"):
            return []
        nodes = [n for n in node_list(fields.get("NodeList")) if n in self.cluster.inventory]
        if nodes:
            self.cluster.job_nodes = nodes
        return nodes

    def running(self) -> bool:
        """True until the job was found and then no process of it is left on any node (checked every 0.5 s);
        a Slurm job: until Slurm says it ended (a requeued job's processes are gone for a while)."""
        if time.monotonic() - self._checked >= POLL_S:
            self.scan()
        if self.slurm_job is not None:
            return self.slurm.get("JobState") not in (*JOB_DONE_STATES, "GONE")
        return self.found_at is None or self._matches > 0

    def diagnosis(self) -> str | None:
        """Why the run may not see the job advance, in one line."""
        nodes = ", ".join(self.cluster.job_nodes)
        if self.slurm_job is not None:
            state, reason = self.slurm.get("JobState", "?"), self.slurm.get("Reason", "?")
            nodes = f"Slurm job {self.slurm_job} ({state}, reason {reason}, nodes {self.slurm.get('NodeList') or 'none'})"
        if self.found_at is None:
            seen = self._seen
            if seen and self.scope is None:
                want = " and ".join(x for x in (f"run id {self.run_id}" if self.run_id else "",
                                                 f"user {self.user}" if self.user else "") if x)
                if not any(self._picked(j) for j in seen):
                    return (f"no job with {want} among those matching '{self.workload.process}' on {nodes}: "
                            + "; ".join(self._describe(j) for j in seen))
                return (f"no job matching '{self.workload.process}' on {nodes} was consistently there and plausibly "
                        f"the drilled one after {self.looks} look(s), so none was chosen: "
                        + "; ".join(self._describe(j) + (f", not taken: {', '.join(j['why_not'])}" if j.get("why_not")
                                                         else ", not yet seen twice alike") for j in seen))
            return (f"no process matching '{self.workload.process}' with torchrun's RANK in its environment on {nodes} "
                    "(attach never starts a job: start it, or fix workload.process)")
        ranks = sorted({w["rank"] for w in self.workers})
        return (f"the job's workers are there (ranks {ranks}) but no step was seen: probes.log must map its step lines "
                "to `step` events, and probes.log_files name the files it writes them to")

    def info(self) -> dict[str, Any]:
        slurm = ({"slurm_job": self.slurm_job, "slurm_state": self.slurm.get("JobState"),
                  "slurm_nodes": node_list(self.slurm.get("NodeList"))} if self.slurm_job is not None else {})
        scope = ({"scope": {"run_id": self.scope.run_id, "uid": self.scope.uid, "slurm_job": self.scope.slurm_job},
                  "other_jobs": self.others} if self.scope is not None else {})
        return {"attached": True, "process": self.workload.process, "found_at": self.found_at, **slurm, **scope,
                "workers": [dict(w) for w in sorted(self.workers, key=lambda w: (w["rank"], w["node"]))]}

    def result_part(self) -> dict[str, Any]:
        return {"attached": self.info()}

    def returncodes(self) -> dict[str, int | None]:
        return {}

    def wait(self, timeout: float) -> bool:
        return False

    def stop(self, grace: float = 0.0) -> None:
        """Nothing: the job is not chaoskit's; it is left running."""


def jobs_matching(tables: dict[str, list[ProcInfo]], pattern: Any, slurm_job: str | None = None
                  ) -> list[dict[str, Any]]:
    """The jobs whose workers (a ``RANK`` in their environment) match ``pattern`` in the nodes' process
    ``tables``, told apart by run id, uid and Slurm job: ``{"scope": JobScope, "nodes": [...], "workers": N,
    "agents": {node: [(pid, start)]}, "orphans": [nodes], "identity": frozenset}``, in the order first seen.
    ``agents``: each worker's torchrun agent (its parent, of its uid, :data:`AGENT_MARKS` on its command line);
    ``orphans``: the nodes where a worker with a run id has none; ``identity``: the agents (or, for workers no
    torchrun started, the workers) as ``(node, pid, start time)``. With ``slurm_job``, only that Slurm job's."""
    jobs: dict[JobScope, dict[str, Any]] = {}
    for node, procs in tables.items():
        by_pid = {p.pid: p for p in procs}
        for p in procs:
            if p.state == "Z" or p.rank is None or not bounded_search(pattern, p.cmdline, "workload.process"):
                continue
            if slurm_job is not None and p.slurm_job != slurm_job:
                continue
            job = jobs.setdefault(JobScope.of(p), {"scope": JobScope.of(p), "nodes": [], "workers": 0, "agents": {},
                                                   "orphans": [], "identity": set()})
            job["workers"] += 1
            if node not in job["nodes"]:
                job["nodes"].append(node)
            if p.run_id is None:
                job["identity"].add((node, p.pid, p.start_time))
                continue
            agent = by_pid.get(p.ppid)
            if agent is not None and agent.state != "Z" and agent.uid == p.uid and _is_agent(agent.cmdline):
                job["agents"].setdefault(node, [])
                if (agent.pid, agent.start_time) not in job["agents"][node]:
                    job["agents"][node].append((agent.pid, agent.start_time))
                job["identity"].add((node, agent.pid, agent.start_time))
            elif node not in job["orphans"]:
                job["orphans"].append(node)
    for job in jobs.values():
        job["identity"] = frozenset(job["identity"])
    return list(jobs.values())


def why_not(job: dict[str, Any], nodes: list[str], named: bool, own_uids: Callable[[str], set[int]],
            slurm: tuple[str, int | None] | None = None) -> list[str]:
    """Why ``job`` (of :func:`jobs_matching`) is not plausibly the drilled job on ``nodes`` (the scenario's job
    nodes, or the Slurm allocation); empty when it is. ``named``: the operator named it (``workload.user``,
    ``run_id`` or ``slurm_job``), so its uid need not be one of ``own_uids(node)``, those the operator acts as.
    ``slurm``: the Slurm job named (``slurm_job``) and the uid Slurm runs it as (``None``: not known): a process
    is that job's only when it runs as that uid, whatever ``SLURM_JOB_ID`` its environment carries."""
    scope: JobScope = job["scope"]
    reasons = []
    if slurm is not None:
        slurm_job, owner = slurm
        if owner is None:
            reasons.append(f"Slurm's record of job {slurm_job}'s user was not read")
        elif scope.uid != owner:
            reasons.append(f"uid {scope.uid if scope.uid is not None else '?'} is not Slurm job {slurm_job}'s user "
                           f"(uid {owner}, per Slurm): its SLURM_JOB_ID={scope.slurm_job} is only its environment's word")
    missing = [n for n in nodes if n not in job["nodes"]]
    if missing:
        reasons.append(f"no worker on {', '.join(missing)} (the job runs on {', '.join(nodes)})")
    if job["orphans"]:
        reasons.append(f"worker(s) on {', '.join(job['orphans'])} without their torchrun agent")
    if scope.run_id is None and scope.slurm_job is None:
        reasons.append("no torchrun run id (TORCHELASTIC_RUN_ID) and no Slurm job")
    if not named and not reasons:
        strangers = [n for n in job["nodes"] if scope.uid is None or scope.uid not in own_uids(n)]
        if strangers:
            reasons.append(f"uid {scope.uid if scope.uid is not None else '?'} is not one chaoskit acts as on "
                           f"{', '.join(strangers)} (name the job with workload.user or workload.run_id)")
    return reasons


def policy_refuses(job: dict[str, Any], rule: Any, inventory: Any, cache: dict[str, dict[str, int | None]]) -> list[str]:
    """Why the site policy's ``jobs.users`` (``rule``: a :class:`~chaoskit.cluster.policy.JobsRule` or ``None``) does
    not allow ``job``: its uid must be one of theirs on its node. ``cache``: user -> node -> uid."""
    if rule is None or rule.users is None:
        return []
    uid, node = job["scope"].uid, job["nodes"][0]
    allowed = {int(u) if u.isdigit() else user_uid(inventory, node, u, cache.setdefault(u, {})) for u in rule.users}
    if uid is None or uid not in allowed:
        return [f"uid {uid if uid is not None else '?'} is not one of the site policy's jobs.users ({', '.join(rule.users)})"]
    return []


def operator_uids(conn: Any) -> set[int]:
    """The uids the operator acts as on a node: its agent's (``id -u`` there) and, over SSH, the login user's."""
    uids: set[int] = set()
    asks = [["id", "-u"]]
    user = getattr(conn, "user", None)
    if isinstance(user, str) and user:
        asks.append(["id", "-u", "--", user])
    for argv in asks:
        try:
            res = conn.run(argv, 10.0)
        except InfraError:
            continue
        out = res.stdout.strip()
        if res.returncode == 0 and out.isdigit():
            uids.add(int(out))
    return uids


def _is_agent(cmdline: str) -> bool:
    words = cmdline.split()
    return any(w == mark or w.endswith("/" + mark) for w in words[:4] for mark in AGENT_MARKS)


def job_picked(job: dict[str, Any], run_id: str | None, user: str | None,
               uid_of: Callable[[str, str], int | None]) -> bool:
    """Whether ``job`` (of :func:`jobs_matching`) is the one ``workload.run_id``/``workload.user`` name;
    ``uid_of(node, user)`` turns a user name into its uid on that node."""
    scope: JobScope = job["scope"]
    if run_id is not None and scope.run_id != run_id:
        return False
    if user is not None:
        want = int(user) if user.isdigit() else uid_of(job["nodes"][0], user)
        if want is None or scope.uid != want:
            return False
    return True


def slurm_uid(fields: dict[str, str]) -> int | None:
    """The uid Slurm runs a job as, from its fields (:meth:`~chaoskit.cluster.slurm.SlurmAccess.job`: ``UserId``
    is ``1001``, or ``name(1001)`` as ``scontrol`` prints it); ``None`` when they do not say."""
    value = fields.get("UserId") or ""
    m = re.fullmatch(r"([0-9]{1,10})|[^()\s]*\(([0-9]{1,10})\)", value)
    return None if m is None else int(m.group(1) or m.group(2))


def user_uid(inventory: Any, node: str, user: str, cache: dict[str, int | None]) -> int | None:
    """``user``'s uid on ``node`` (the node's own user database, not this machine's); ``cache`` per node."""
    if node not in cache:
        try:
            res = inventory[node].conn.run(["id", "-u", user], 10.0)
        except InfraError:
            return None
        out = res.stdout.strip()
        cache[node] = int(out) if res.returncode == 0 and out.isdigit() else None
    return cache[node]


def describe_job_dict(job: dict[str, Any]) -> dict[str, Any]:
    scope: JobScope = job["scope"]
    return {"run_id": scope.run_id, "uid": scope.uid, "slurm_job": scope.slurm_job, "nodes": job["nodes"],
            "workers": job["workers"]}


def describe_job(job: dict[str, Any]) -> str:
    """One job in a line: run id, uid, Slurm job, nodes, workers."""
    scope: JobScope = job["scope"]
    parts = [f"run id {scope.run_id or '(none)'}", f"uid {scope.uid if scope.uid is not None else '?'}"]
    if scope.slurm_job is not None:
        parts.append(f"Slurm job {scope.slurm_job}")
    return f"{', '.join(parts)} on {', '.join(job['nodes'])} ({job['workers']} worker(s))"


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None
