"""``chaoskit doctor``: can chaoskit drill these nodes, and can it run this scenario's faults there?

For every node of an inventory, in parallel (bounded): reachable, host key
known, privileges (root or ``sudo -n``), chaoskit's agent started, the tools
faults use (``ip``, ``tc``, ``nft``, ``kill``, Python), ``sch_netem``, the
node's clock offset to this machine, and the GPUs ``nvidia-smi -L`` lists
against the inventory's ``gpus:``. With a scenario, each fault is checked
against the nodes its selector picks: what it needs there (:meth:`Fault.needs`)
must be present. With an attach scenario, the jobs whose workers match
``workload.process`` are listed (more than one, unless ``run_id``/``user`` picks
one, is what a run refuses), and for the attach selector and every fault's
``process`` regex, how many processes match outside the drilled job's scope
(those a run never touches). Nothing is changed on any node.

The clock offset is measured NTP-style: several round trips to the node's
agent, and the one with the smallest round trip gives the offset (node clock
minus the midpoint of the round trip here) with an uncertainty of half that
round trip.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaoskit.cluster.clock import measure_clock
from chaoskit.cluster.inventory import Inventory, Node
from chaoskit.cluster.inventory_file import load_inventory
from chaoskit.cluster.kernel import netem_available
from chaoskit.cluster.policy import origin
from chaoskit.cluster.selectors import select_nodes
from chaoskit.cluster.transports.api import ProcInfo, Transport
from chaoskit.cluster.fanout import fan_out
from chaoskit.cluster.transports.agent_transport import AgentTransport
from chaoskit.cluster.transports.ssh import HostKeyError, SSHTransport, SudoError
from chaoskit.core.errors import InfraError
from chaoskit.core.launches import LAUNCHES
from chaoskit.core.patterns import bounded_search, compile_pattern
from chaoskit.faults.registry import get_fault
from chaoskit.scenario import load_scenario
from chaoskit.workloads.attach import (describe_job, describe_job_dict, job_picked, jobs_matching, operator_uids,
                                      policy_refuses, slurm_uid, user_uid, why_not)

__all__ = ["NodeHealth", "Diagnosis", "diagnose", "clock_offset", "job_scope", "TOOLS"]

TOOLS = ("ip", "tc", "nft", "kill")
"""Commands faults run on a node, looked up on its PATH (plus the sbin folders)."""
CLOCK_SAMPLES = 5
COMMAND_TIMEOUT_S = 10.0
_SBIN = "PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin"


@dataclass
class NodeHealth:
    """What ``doctor`` found on one node; ``problems`` lists what stops a drill there."""

    node: str
    address: str
    reachable: bool = False
    host_key: str = "not checked"
    privilege: str | None = None
    """``root``, ``sudo -n``, or ``None`` when commands cannot run with the rights faults need."""
    agent: bool = False
    tools: dict[str, bool] = field(default_factory=dict)
    python: str | None = None
    netem: bool | None = None
    clock_offset_s: float | None = None
    clock_uncertainty_s: float | None = None
    gpus_expected: int = 0
    gpus_seen: int | None = None
    """GPUs ``nvidia-smi -L`` lists; ``None`` where the node has no nvidia-smi."""
    problems: list[str] = field(default_factory=list)

    def has(self, need: str) -> bool:
        """Whether this node has ``need``: a tool name, ``python3`` or ``netem``."""
        if need == "netem":
            return bool(self.netem)
        if need == "python3":
            return self.python is not None
        return self.tools.get(need, False)


@dataclass
class Diagnosis:
    inventory: str
    nodes: list[NodeHealth]
    scenario: str | None = None
    faults: list[dict[str, Any]] = field(default_factory=list)
    """With a scenario: one entry per fault (kind, nodes, ``missing``: what a node lacks)."""
    scope: dict[str, Any] | None = None
    policy: str | None = None
    """Which site policy applied to the inventory, and from where (:func:`~chaoskit.cluster.policy.origin`)."""
    """With an attach scenario: the jobs matching ``workload.process`` (``jobs``), the one drilled
    (``chosen``), what stops a run (``problem``), and per regex the processes matching outside the
    drilled job's scope (``outside``: ``[{"what", "regex", "inside", "outside"}]``)."""

    @property
    def ok(self) -> bool:
        return (all(not n.problems for n in self.nodes) and all(not f["missing"] for f in self.faults)
                and not (self.scope or {}).get("problem"))

    def as_dict(self) -> dict[str, Any]:
        return {"inventory": self.inventory, "scenario": self.scenario, "ok": self.ok,
                "nodes": [asdict(n) for n in self.nodes], "faults": self.faults, "scope": self.scope,
                "policy": self.policy}


def diagnose(inventory_path: str | Path, scenario_path: str | Path | None = None, max_workers: int = 32) -> Diagnosis:
    """Check every node of the inventory (and, with a scenario, every fault's needs on its nodes)."""
    loaded = load_scenario(scenario_path) if scenario_path is not None else None
    inventory = load_inventory(inventory_path)
    scope = None
    try:
        found = fan_out({n.name: (lambda n=n: check_node(n)) for n in inventory.nodes}, max_workers=max_workers)
        if loaded is not None and LAUNCHES[loaded.model.workload.launch].found:
            reached = [n for n in inventory.nodes if not isinstance(found[n.name], BaseException) and found[n.name].reachable]
            scope = job_scope(loaded.model, inventory, reached)
    finally:
        inventory.close()
    health = []
    for node in inventory.nodes:
        res = found[node.name]
        if isinstance(res, BaseException):  # a bug in a check must not hide the other nodes
            res = NodeHealth(node.name, node.address, problems=[f"{type(res).__name__}: {res}"])
        health.append(res)
    diagnosis = Diagnosis(str(inventory_path), health, str(scenario_path) if scenario_path else None)
    if loaded is not None:
        diagnosis.faults = _fault_needs(loaded.model, inventory, {h.node: h for h in health})
    diagnosis.scope = scope
    diagnosis.policy = origin(inventory.policy)
    return diagnosis


def _slurm_job_uid(inventory: Inventory, job_id: str) -> int | None:
    """The uid Slurm's own record gives ``job_id`` (the first node with a scheduler asks it), or ``None``."""
    for node in inventory.nodes:
        if node.scheduler is not None:
            try:
                fields = node.scheduler.job(job_id)
            except InfraError:
                return None
            return slurm_uid(fields) if fields else None
    return None


def job_scope(sc: Any, inventory: Inventory, nodes: list[Node]) -> dict[str, Any]:
    """An attach scenario's job on ``nodes`` (reachable ones): which jobs match, which one a run would drill,
    and how many processes each regex matches outside that job's scope (read only: ``procs``)."""
    w = sc.workload
    pattern = compile_pattern(w.process)
    tables: dict[str, list[ProcInfo]] = {}
    for node in nodes:
        try:
            tables[node.name] = node.conn.processes(node_wide=True)
        except InfraError:
            continue
    jobs = jobs_matching(tables, pattern, w.slurm_job)
    uids: dict[str, int | None] = {}
    own: dict[str, set[int]] = {}

    def own_uids(node: str) -> set[int]:
        if node not in own:
            own[node] = operator_uids(inventory[node].conn)
        return own[node]

    named = w.run_id is not None or w.user is not None or w.slurm_job is not None
    # one look (a run looks twice): the scenario's job nodes, or those the jobs are on under Slurm
    job_nodes = ([n.name for n in inventory.nodes][: getattr(sc.cluster, "nodes", None)] if w.slurm_job is None
                 else sorted({n for j in jobs for n in j["nodes"]}))
    selected = [j for j in jobs if job_picked(j, w.run_id, w.user, lambda n, u: user_uid(inventory, n, u, uids))]
    rule = getattr(inventory.policy, "jobs", None)
    policy_uids: dict[str, dict[str, int | None]] = {}
    slurm_user = _slurm_job_uid(inventory, w.slurm_job) if w.slurm_job is not None else None
    for j in jobs:
        j["why_not"] = why_not(j, job_nodes, named, own_uids) if j in selected else ["not the one workload names"]
        if w.slurm_job is not None and not j["why_not"] and j["scope"].uid != slurm_user:
            # as a run judges it (attach): Slurm's own record of the job's user, never a process's SLURM_JOB_ID alone
            j["why_not"] = [f"uid {j['scope'].uid} is not Slurm job {w.slurm_job}'s user "
                            f"({'uid ' + str(slurm_user) if slurm_user is not None else 'Slurm names none'}, per Slurm)"]
        if j in selected and not j["why_not"]:
            j["why_not"] = policy_refuses(j, rule, inventory, policy_uids)
    picked = [j for j in selected if not j["why_not"]]
    out: dict[str, Any] = {"jobs": [{**describe_job_dict(j), "not_taken": j["why_not"]} for j in jobs],
                           "chosen": None, "problem": None, "outside": []}
    if len(picked) > 1:
        out["problem"] = (f"workload.process '{w.process}' matches the workers of {len(picked)} jobs: "
                          + "; ".join(describe_job(j) for j in picked)
                          + "; a run refuses (pick one with workload.run_id or workload.user)")
    elif picked:
        out["chosen"] = describe_job_dict(picked[0])
    elif selected:
        out["problem"] = (f"no job matching '{w.process}' is plausibly the drilled one, so a run would stop before "
                          "injecting: " + "; ".join(f"{describe_job(j)}, not taken: {', '.join(j['why_not'])}"
                                                   for j in selected))
    elif jobs:
        out["problem"] = ("no job matching '" + w.process + "' has "
                          + " and ".join(x for x in (f"run id {w.run_id}" if w.run_id else "",
                                                     f"user {w.user}" if w.user else "") if x)
                          + ": " + "; ".join(describe_job(j) for j in jobs))
    chosen = picked[0]["scope"] if len(picked) == 1 else None
    regexes = [("workload.process", w.process)] + [(f"faults.{i}.target.process", f.target.process)
                                                   for i, f in enumerate(sc.faults) if f.target.process]
    for what, regex in regexes:
        rx = compile_pattern(regex)
        inside = outside = 0
        for procs in tables.values():
            ours = {p.pid for p in chosen.select(procs)} if chosen is not None else set()
            for p in procs:
                if p.state != "Z" and bounded_search(rx, p.cmdline, what):
                    if p.pid in ours:
                        inside += 1
                    else:
                        outside += 1
        out["outside"].append({"what": what, "regex": regex, "inside": inside, "outside": outside})
    return out


def check_node(node: Node) -> NodeHealth:
    """Everything ``doctor`` asks of one node, through its own transport."""
    health = NodeHealth(node.name, node.address, gpus_expected=node.gpus)
    conn = node.conn
    if conn is None:
        health.problems.append("no transport reaches this node")
        return health
    try:
        conn.connect()
        health.reachable, health.host_key = True, "known"
    except HostKeyError as exc:
        health.host_key = exc.message
        health.problems.append(f"host key: {exc.message}")
        return health
    except SudoError as exc:  # reached and logged in: only the privilege is missing
        health.reachable, health.host_key = True, "known"
        health.problems.append(exc.message)
        return health
    except InfraError as exc:
        health.problems.append(f"unreachable: {exc.message}")
        return health
    health.agent = not isinstance(conn, AgentTransport) or conn.mode == "agent"
    if not health.agent:
        health.problems.append("chaoskit's agent did not start: every command costs a new SSH session")
    try:
        _privilege(conn, health)
        if health.privilege is None:
            return health
        _tools(conn, node, health)
        health.clock_offset_s, health.clock_uncertainty_s = clock_offset(conn)
        _gpus(conn, health)
    except InfraError as exc:
        health.problems.append(exc.message)
    return health


def clock_offset(conn: Transport, samples: int = CLOCK_SAMPLES) -> tuple[float, float]:
    """(node clock minus this machine's, half the round trip): :func:`~chaoskit.cluster.clock.measure_clock`."""
    clock = measure_clock(lambda: conn.ping(timeout=COMMAND_TIMEOUT_S), samples)
    return round(clock.offset_s, 6), round(clock.error_s, 6)


def _privilege(conn: Transport, health: NodeHealth) -> None:
    try:
        res = conn.run(["id", "-u"], COMMAND_TIMEOUT_S)
    except SudoError as exc:
        health.problems.append(exc.message)
        return
    sudo = isinstance(conn, SSHTransport) and conn.sudo
    if res.returncode == 0 and res.stdout.strip() == "0":
        health.privilege = "sudo -n" if sudo else "root"
    else:
        health.problems.append(f"commands run as uid {res.stdout.strip() or '?'}, not root; network and process "
                               "faults need root (log in as root, or set ssh.become: sudo with password-less sudo)")


def _tools(conn: Transport, node: Node, health: NodeHealth) -> None:
    script = f"{_SBIN}; for t in {' '.join(TOOLS)}; do command -v $t >/dev/null 2>&1 && echo $t; done"
    res = conn.run(["sh", "-c", script], COMMAND_TIMEOUT_S)
    present = set(res.stdout.split())
    health.tools = {t: t in present for t in TOOLS}
    python = node.ssh.python if node.ssh is not None else "python3"
    res = conn.run([python, "--version"], COMMAND_TIMEOUT_S)
    health.python = (res.stdout or res.stderr).strip() or None if res.returncode == 0 else None
    health.tools["python3"] = health.python is not None
    health.netem = netem_available(conn, python) if health.python else None


def _gpus(conn: Transport, health: NodeHealth) -> None:
    res = conn.run(["sh", "-c", f"{_SBIN}; command -v nvidia-smi >/dev/null 2>&1 || exit 3; nvidia-smi -L"],
                   COMMAND_TIMEOUT_S)
    if res.returncode == 3 and not res.stdout:
        health.gpus_seen = None
    else:
        health.gpus_seen = sum(1 for line in res.stdout.splitlines() if line.startswith("GPU "))
    seen = health.gpus_seen or 0
    if health.gpus_expected and seen < health.gpus_expected:
        what = "no nvidia-smi" if health.gpus_seen is None else f"nvidia-smi lists {seen}"
        health.problems.append(f"the inventory says {health.gpus_expected} GPUs, {what}")


def _fault_needs(sc: Any, inventory: Inventory, health: dict[str, NodeHealth]) -> list[dict[str, Any]]:
    out = []
    for i, spec in enumerate(sc.faults):
        fault = get_fault(spec.kind)(spec, f"f{i}")
        nodes = [n.name for n in select_nodes(inventory, spec.target)]
        missing = []
        if not nodes:
            missing.append(f"no node of the inventory matches {spec.target.describe()}")
        for name in nodes:
            unfit = fault.unfit(inventory[name])
            if unfit:
                missing.append(unfit)
            h = health[name]
            if h.problems:
                missing.append(f"{name}: {h.problems[0]}")
                continue
            missing += [f"{name}: no {need}" for need in fault.needs() if not h.has(need)]
        out.append({"fault": f"f{i}", "kind": spec.kind, "nodes": nodes, "needs": list(fault.needs()), "missing": missing})
    return out
