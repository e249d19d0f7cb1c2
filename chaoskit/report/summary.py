"""The terminal summary of one run: a Rich table of phases against SLOs."""

from __future__ import annotations

from typing import Any

from chaoskit.blame import blame_line
from chaoskit.core.phases import PHASE_TABLE, SLO_PHASES
from chaoskit.core.result import Check, RunResult, SloEntry
from chaoskit.measure import phase_spans
from chaoskit.stacks.api import Stack
from chaoskit.stacks.registry import model_stack

__all__ = ["render_result", "render_repeat", "render_plan", "check_text"]


def _fmt(v: Any) -> str:
    return "[yellow]not observed[/yellow]" if v is None else f"{v:.3f}s"


def check_text(name: str, check: Check | dict[str, Any]) -> str:
    """One line for a failed check: what was expected, and what was seen."""
    check = Check.model_validate(check)
    if name == "training_finished":
        seen, expected, codes = check.final_step, check.expected_step, check.exit_codes
        stopped = f"it stopped at step {seen}" if seen is not None else "it reported no step"
        if codes is not None and not any(code == 0 for code in codes.values()):
            exits = ", ".join(f"{node} {code}" for node, code in codes.items()) or "none"
            return (f"training_finished: expected the job's script to end with exit 0, no torchrun agent did "
                    f"(exit codes: {exits}); {stopped}")
        return f"training_finished: expected the job to reach step {expected}, {stopped}"
    if name in ("triggered", "no_restart") and check.reason:
        return f"{name}: {check.reason}"
    if name == "faults_reverted":
        return "faults_reverted: a lasting fault was not reverted and verified (its lease reverts it on the node)"
    detail = ", ".join(f"{k}={v}" for k, v in check.dump().items() if k != "pass")
    return f"{name}: {detail}" if detail else name


def render_result(console, result: RunResult | dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    result = RunResult.model_validate(result)
    phases, slo = result.phases, result.slo
    model = result.recovery_model or phases.model or Stack.name
    title = f"recovery of {result.scenario}" + ("" if model == Stack.name else f" ({model} recovery model)")
    table = Table(title=title, title_justify="left")
    table.add_column("phase")
    table.add_column("measured", justify="right")
    table.add_column("SLO", justify="right")
    table.add_column("", justify="center")
    table.add_column("what it spans", style="dim")
    rode = result.checks.get("no_restart")
    if rode is not None and rode.passed and phases.detection_s is None:  # a disturbance ridden through: no phases
        console.print(f"[green]rode through[/green] {result.scenario}'s disturbance: no worker exit, restart, new "
                      "rendezvous or detection by the stack (expect.restart: false)")
    spans = phase_spans({"reallocation_from": phases.reallocation_from}, model_stack(model).phase_meanings)
    for p in SLO_PHASES:
        entry = slo.get(p.name)
        limit = f"<= {entry.limit_s:g}s" if entry else "-"
        table.add_row(p.label, _fmt(getattr(phases, p.key)), limit, _mark(entry), spans.get(p.name, p.meaning))
    lost = phases.lost_steps
    entry = slo.get("lost_steps")
    table.add_row(
        "lost work", "[yellow]not observed[/yellow]" if lost is None else f"{lost} step{'' if lost == 1 else 's'}",
        f"<= {entry.limit}" if entry else "-", _mark(entry),
        model_stack(model).lost_work(phases.model_dump()) or
        f"step {'?' if phases.last_step_before is None else phases.last_step_before} before the fault, "
        + ("no restored step observed" if phases.restored_step is None else f"restored {phases.restored_step}"
           + (f" (from the {phases.restored_from})" if phases.restored_from else "")),
    )
    if result.recurrence or "returns" in slo:
        entry = slo.get("returns")
        came = sum(r.returns for r in result.recurrence)
        table.add_row("returns", str(came), f"<= {entry.limit}" if entry else "-", _mark(entry),
                      "the job back on a node that keeps failing")
    if rode is None or not rode.passed or phases.detection_s is not None:
        console.print(table)
    slow = result.slowdown
    if slow:
        t = (lambda v: "not observed" if v is None else f"{v * 1000:.0f} ms")
        console.print(f"step time: before {t(slow.step_time_before_s)}, during {t(slow.step_time_during_s)}, "
                      f"after {t(slow.step_time_after_s)}; throughput lost: "
                      + ("not observed" if slow.throughput_lost_pct is None else f"{slow.throughput_lost_pct:g}%")
                      + "; back to speed " + ("not observed" if slow.recovery_after_revert_s is None
                                              else f"{slow.recovery_after_revert_s:.2f}s after the revert"))
    _render_incident(console, result)
    _render_returns(console, result)
    _render_checkpoint_io(console, result)
    for f in result.faults:
        if f.mechanism:
            console.print(f"fault {f.kind} on {', '.join(f.targets)}: mechanism {f.mechanism}"
                          + (f" ({f.fidelity})" if f.fidelity else "")
                          + (f", scope {f.scope}" if f.scope else ""))
    if phases.detected_by:
        console.print(f"detected by: {escape(phases.detected_by)}")
    for d in phases.detections:
        console.print(f"  detection source {escape(d.source)}: {d.kind} on {d.node or '?'} "
                      f"+{d.latency_s:.2f}s after the fault" + (f" ({d.behind_s:.2f}s after the first)" if d.behind_s else ""))
    _render_blame(console, result)
    wrapper = phases.wrapper
    if wrapper:
        console.print(f"  NVRx in-process Wrapper: {escape(str(wrapper.get('interruption')))} on ranks "
                      f"{escape(str(wrapper.get('ranks')))} +{wrapper['latency_s']:.2f}s after the fault")
    if phases.in_process is not None:
        console.print("restarted in-process: every rank's loop ran again in the process it had before the fault"
                      if phases.in_process else
                      "[yellow]not in-process:[/yellow] some rank's loop restarted in a new process (torchrun restarted it)")
    world = phases.world_size
    if world and world["after"] < world["before"]:
        console.print(f"[yellow]went on with {world['after']} of {world['before']} ranks:[/yellow] the in-process "
                      "Wrapper dropped the ranks it found unresponsive")
    for step in phases.reallocation_steps:
        console.print(f"  reallocation step {step.step}: {step.seconds:.2f}s  [dim](bounded by {escape(step.bound_by)})[/dim]")
    for name, check in result.checks.items():
        if not check.passed:
            console.print(f"[red]check failed:[/red] {escape(check_text(name, check))}")
    for note in result.notes:
        console.print(f"note: {escape(note)}")
    _verdict(console, result.verdict, result.run_dir)


def _render_checkpoint_io(console, result: RunResult) -> None:
    """Checkpoint saves and loads on the harmed nodes before, while and after a storage fault lasted."""
    io = result.checkpoint_io
    if io is None:
        return

    def window(t) -> str:
        if not t.count and not t.failed:
            return "none"
        text = "-" if t.median_s is None else (f"{t.median_s * 1000:.0f} ms" if t.median_s < 1 else f"{t.median_s:.2f}s")
        return text + (f" ({t.failed} failed)" if t.failed else "")

    for what in ("save", "load"):
        w = getattr(io, what)
        if not w or not any(t.count or t.failed for t in w.values()):
            continue
        x = getattr(io, f"{what}_slowdown_x")
        console.print(f"checkpoint {what}s on {', '.join(io.nodes)} (median): before {window(w['before'])}, while the "
                      f"storage was harmed {window(w['during'])}" + (f" (x{x:g})" if x else "")
                      + f", after {window(w['after'])}")


def _render_returns(console, result: RunResult) -> None:
    """A node that kept failing: how often the job came back, each return's cost, and what kept the node out."""
    for r in result.recurrence:
        costs = "; ".join(f"{e['fault']} " + ("-" if e.get("recovery_s") is None else f"{e['recovery_s']:.1f}s")
                          + ("" if e.get("lost_steps") is None else f", {e['lost_steps']} steps") for e in r.each)
        kept = (f"kept out {r.kept_out['after_s']:.1f}s after the first failure by {r.kept_out['by']}" if r.kept_out
                else r.reason or "not kept out")
        console.print(f"{', '.join(r.nodes)} kept failing: the job came back {r.returns} time"
                      f"{'' if r.returns == 1 else 's'}" + (f" ({costs})" if costs else "") + f"; {kept}")


_BLAME_COLOUR = {"right": "green", "wrong": "red", "none": "yellow"}


def _render_blame(console, result: RunResult) -> None:
    """``blame: torchrun agent named rank 1 on n1 (right): <its words>``: the headline fault's, or each fault's when
    there were several (``chaoskit/blame.py``); nothing for a result from before blame was kept."""
    from rich.markup import escape

    blames = [(f.fault, f.blame) for f in result.per_fault if f.blame is not None]
    if len(blames) < 2:
        blames = [("", result.blame)] if result.blame is not None else []
    for fault, b in blames:
        colour = _BLAME_COLOUR.get(b.verdict, "yellow")
        console.print(f"[{colour}]blame{f' ({fault})' if fault else ''}:[/{colour}] {escape(blame_line(b.dump()) or '')}")


def _render_incident(console, result: RunResult) -> None:
    """Several faults felt in one run: the incident's span and lost work, then each fault's own phases and what
    fired its trigger."""
    from rich.markup import escape

    inc = result.incident
    if inc is None:
        return
    during = f" ({', '.join(inc.during_recovery)} struck during the previous recovery)" if inc.during_recovery else ""
    console.print(f"incident of {len(inc.faults)} faults{during}: recovery "
                  + ("not observed" if inc.recovery_s is None else f"{inc.recovery_s:.3f}s")
                  + " from the first fault to the first step after the last recovery; lost work "
                  + ("not observed" if inc.lost_steps is None else f"{inc.lost_steps} steps"))
    for f in result.per_fault:
        own = ", ".join(f"{p.label} " + ("-" if getattr(f, p.key) is None else f"{getattr(f, p.key):.2f}s")
                        for p in SLO_PHASES)
        console.print(f"  {f.fault} {f.kind} on {', '.join(f.targets)}: {own}")
        t = f.trigger
        if t is not None:
            console.print(f"    fired at {escape(t.at)} by {t.event} on {t.node or '?'}"
                          + (f" rank {t.rank}" if t.rank is not None else "")
                          + f": in effect {t.latency_s * 1000:.0f} ms after the event (waited {t.waited_s:.2f}s)")


def _mark(entry: SloEntry | None) -> str:
    return ("[green]ok[/green]" if entry.passed else "[red]FAIL[/red]") if entry else ""


def _verdict(console, verdict: str, run_dir: str | None) -> None:
    colour = {"pass": "green", "fail": "red"}.get(verdict, "yellow")
    console.print(f"verdict: [bold {colour}]{verdict.upper()}[/bold {colour}]")
    if run_dir:
        console.print(f"result: {run_dir}/result.json", markup=False, highlight=False)


def render_repeat(console, result: dict[str, Any]) -> None:
    """The distribution of each phase over a repeat's samples, with the SLOs judged on it."""
    from rich.markup import escape
    from rich.table import Table

    dist, slo = result.get("distribution") or {}, result.get("slo") or {}
    table = Table(title=f"recovery of {result['scenario']} over {result['completed']} of {result['repeat']} samples",
                  title_justify="left")
    for col, justify in (("phase", "left"), ("p50", "right"), ("95% CI of p50", "right"), ("p95", "right"),
                         ("max", "right"), ("SLO", "right"), ("", "center")):
        table.add_column(col, justify=justify)
    for p in PHASE_TABLE:
        d = dist.get(p.key) or {}
        f = (lambda v: "-" if v is None else f"{v:.3f}s") if p.unit == "s" else (lambda v: "-" if v is None else f"{v:g}")
        entry = slo.get(p.name)
        limits = ", ".join(f"{'every' if p == 'max' and entry['every_sample'] else p} <= {c['limit']:g}"
                           for p, c in entry["percentiles"].items()) if entry else "-"
        mark = ("[green]ok[/green]" if entry["pass"] else "[red]FAIL[/red]") if entry else ""
        ci = d.get("ci95")
        missing = f" [yellow]({d['missing']} not observed)[/yellow]" if d.get("missing") else ""
        table.add_row(p.label, f(d.get("p50")) + missing, "-" if not ci else f"{f(ci[0])} .. {f(ci[1])}",
                      f(d.get("p95")), f(d.get("max")), limits, mark)
    console.print(table)
    for s in result.get("samples") or []:
        if s["status"] != "pass":
            console.print(f"sample {escape(s['dir'])}: {s['status']}" + (f": {escape(s['error'])}" if s.get("error") else ""))
    _verdict(console, result["verdict"], result.get("run_dir"))


PLAN_NODES = 8
"""Nodes a dry run names one by one; the rest are counted."""


def _render_env(console, env: dict[str, Any] | None, escape) -> None:
    """The plan's ``env``: each variable the job is given (one value, or each node's), what is unset, and why."""
    if not env:
        return
    nodes: dict[str, dict[str, str]] = env.get("nodes") or {}
    console.print("environment each agent and its workers get, on top of chaoskit's own:")
    why = env.get("why") or {}
    for name in sorted({n for e in nodes.values() for n in e}):
        values = {node: e[name] for node, e in nodes.items() if name in e}
        shown = (next(iter(values.values())) if len(set(values.values())) == 1 and len(values) == len(nodes)
                 else ", ".join(f"{node}: {v}" for node, v in values.items()))
        because = f"  ({why[name]})" if name in why else ""
        console.print(f"  {escape(name)}={escape(str(shown))}{escape(because)}", soft_wrap=True)
    for name in env.get("unset") or []:
        console.print(f"  {escape(name)} unset  (workload.env)", soft_wrap=True)
    if env.get("rdzv_store"):
        console.print(f"  rendezvous store: {escape(env['rdzv_store'])}", soft_wrap=True)


def render_plan(console, result: dict[str, Any]) -> None:
    """A dry run's plan; every value from the scenario, the inventory or the nodes is escaped (not markup)."""
    from rich.markup import escape

    console.print(f"[bold]dry run[/bold] of {result['scenario']}: nothing will be touched")
    nodes = result["cluster"]["nodes"]
    shown = ", ".join(f"{n['name']} ({', '.join(f'{k}={v}' for k, v in n['labels'].items())})" for n in nodes[:PLAN_NODES])
    more = f", ... {len(nodes) - PLAN_NODES} more" if len(nodes) > PLAN_NODES else ""
    console.print(f"cluster {escape(str(result['cluster']['id']))}: {len(nodes)} node(s): {escape(shown)}{more}", soft_wrap=True)
    if result.get("attach"):
        console.print(f"job: {escape(str(result['attach']))}", soft_wrap=True)
    else:
        console.print(f"job, one {escape(str(result.get('agent') or 'torchrun'))} agent per node:")
    for node, cmd in result["job"].items():
        console.print(f"  {node}: {escape(str(cmd))}", soft_wrap=True)
    _render_env(console, result.get("env"), escape)
    for item in result["plan"]:
        console.print(f"fault {item['fault']} [bold]{item['kind']}[/bold] at {escape(str(item['at']))}, "
                      f"target {escape(str(item['target']))}:", soft_wrap=True)
        for a in item["actions"]:
            console.print(f"  {a['node']}  {escape(str(a['target'])):<14} {escape(str(a['command']))}", soft_wrap=True)
    cluster = result.get("cluster") or {}
    if cluster.get("job_user"):
        isolation = f"; in {cluster['job_isolation']}" if cluster.get("job_isolation") else ""
        console.print(f"the job runs as {escape(str(cluster['job_user']))}{escape(isolation)}", soft_wrap=True)
    scope = result.get("scope")
    if scope:
        console.print(f"scope: {escape(scope['note'])}", soft_wrap=True)
        for item in scope.get("outside", []):
            console.print(f"  {item['what']} '{escape(item['regex'])}': {item['outside']} process(es) on this machine match "
                          "outside every node's scope (never touched)", soft_wrap=True)
    for line in result.get("preflight", []):
        console.print(f"[yellow]preflight:[/yellow] {escape(str(line))}", soft_wrap=True)
