"""Blame: which rank or node the recovery stack itself named as the failed one, against the truth chaoskit holds.

chaoskit knows, for every drill, the rank and node it faulted (the injection's ``node`` and ``targets``:
``n1/rank1``, ``n1``); "which rank hung?" is what users ask their stack. :func:`blame` reads what the stack said on
the timeline and judges it, per fault:

``{"blamed": {"rank", "node", "by", "words", ...}, "truth": {"rank", "node"}, "verdict": "right"|"wrong"|"none"}``

The stack's namings, each from its own words (the line's format is the one its log rule follows, the stack's
log preset), read by its stack module's readers (:attr:`chaoskit.stacks.api.Stack.blame_readers`, every registered
stack's, keyed by the event's kind and source):

- **torchrun's agent** (and ft_launcher's, which is torchrun's): ``failed (exitcode: -9) local_rank: 0 (pid: P)``
  (``worker.exit``) names a worker of its node; the worker's pid gives its rank (the worker's own start, or
  chaoskit's process watch). torchrun's "Root Cause (first observed failure)" block (rank, host, exit code, the
  error file's traceback), printed when the agent gives up, is read when the timeline holds no naming;
- **NVRx's rank monitor**: ``Did not get subsequent heartbeat. Waited 5.00 seconds.``, a section's timeout: the
  monitor's own rank (``[RankMonServer{pid}@{host}:{rank}]``);
- **NVRx's in-process Wrapper**: ``fn_ex`` names the rank that raised; ``term_ex``'s
  ``Interruption.X on ranks={...}`` the ranks it interrupted the iteration for;
- **torchft's lighthouse**: ``Detected quorum change, bumping quorum_id to N``; the group that left is the one
  that was training before the fault and did not reconfigure for quorum N (each survivor's manager logs
  ``reconfiguring for quorum_id=N``);
- **lm-resiliency's SCOUT**: ``SCOUT fault at step N: sdc=[0, 1], straggler=[0, 0]``: a 1 at a peer's place in
  its replay group, which for DDP is the world (the place is the rank);
- **Slurm**: a node drained or DOWN with its reason, a job's lost nodes (``node.drain``, ``node.down``,
  ``job.node_fail``); **Ray**: a node its GCS marked DEAD.

A surviving rank's collective error, chaoskit's process watch and its heartbeat are chaoskit's readings, not the
stack's: they blame nobody. The stack's blame for a fault is its first naming after the fault (torch elastic's rule:
the root cause is the earliest failure) and before training resumed, leaving out a naming of another fault's
target that had already struck (a cascade's first victim, reported after the second fault). ``right``: every party
it named is a faulted one (rank and node, where both sides have them); ``wrong``: it named some other (``note``
says which, and whether it named the faulted one too); ``none``: it named nobody.

Pure: events and injections in, verdicts out.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Optional, Protocol

from chaoskit.stacks.registry import STACKS

__all__ = ["VERDICTS", "RootCauseBlock", "truth_of", "stack_namings", "blame", "attach_blame", "blame_line"]

Event = dict[str, Any]
VERDICTS = ("right", "wrong", "none")

_TARGET = re.compile(r"^(?P<node>[^/:]+)(?:/(?:rank(?P<rank>\d+)|pid(?P<pid>\d+)))?")


class RootCauseBlock(Protocol):
    """What :class:`chaoskit.workloads.root_cause.RootCause` keeps of torchrun's "Root Cause" block."""

    block: dict[str, str]
    block_node: Optional[str]


def truth_of(fault: dict[str, Any], events: Iterable[Event] = ()) -> list[dict[str, Any]]:
    """The parties a fault struck, from its injection: one ``{"rank", "node"}`` per target (``n1/rank1``: rank 1
    on n1; ``n1``, ``n1:/ckpt``: node n1; ``n1/pid7``: the rank that pid was, if the timeline says)."""
    pids = _pid_ranks(events)
    out = []
    for target in fault.get("targets") or [fault.get("node")]:
        m = _TARGET.match(str(target or ""))
        if m is None:
            continue
        node = m.group("node")
        rank = int(m.group("rank")) if m.group("rank") else pids.get((node, int(m.group("pid")))) if m.group("pid") else None
        party = {"rank": rank, "node": node}
        if party not in out:
            out.append(party)
    if not out and fault.get("node"):
        out.append({"rank": None, "node": fault["node"]})
    return out


def stack_namings(events: Iterable[Event]) -> list[dict[str, Any]]:
    """Every naming of a failed rank or node by the recovery stack on the timeline, first first: ``{"ts", "by",
    "words", "parties": [{"rank", "node"}], "via"?}`` (``via``: how chaoskit read a rank or node the words give
    only indirectly: a pid, the quorum's reconfigurations)."""
    timeline = sorted(events, key=lambda e: e.get("ts") or 0.0)
    where = _rank_nodes(timeline)
    pids = _pid_ranks(timeline)
    readers = {key: reader for name in STACKS.names() for key, reader in STACKS.get(name).blame_readers.items()}
    out = []
    for i, e in enumerate(timeline):
        reader = readers.get((e.get("kind"), e.get("source")))
        if reader is None or e.get("injected"):
            continue
        naming = reader(e, timeline, i, where, pids)
        if naming and naming["parties"]:
            out.append({"ts": e["ts"], **naming})
    return out


def blame(events: Iterable[Event], faults: list[dict[str, Any]],
          root_cause: Optional[RootCauseBlock] = None) -> list[dict[str, Any]]:
    """Per fault (``per_fault[]`` entries, or ``faults[]``: ``fault``, ``node``, ``targets``, ``t_fault``, and
    ``t_resumed`` when measured), what the stack blamed, the truth, and the verdict (this module's docstring).
    ``root_cause``: torchrun's Root Cause block, the naming of last resort."""
    events = list(events)
    namings = stack_namings(events)
    truths = [truth_of(f, events) for f in faults]
    out = []
    for fault, truth in zip(faults, truths):
        t_fault = fault.get("t_fault")
        end = fault.get("t_resumed") or float("inf")
        mine = []
        for n in namings:
            if t_fault is None or not t_fault <= n["ts"] <= end:
                continue
            # another fault's target, named once it had struck: the stack reporting that fault, not this one
            others = [f for f, tr in zip(faults, truths) if f is not fault and (f.get("t_fault") or 0) <= n["ts"]
                      and all(_matches(p, tr) for p in n["parties"])]
            if others and not all(_matches(p, truth) for p in n["parties"]):
                continue
            mine.append(n)
        chosen = mine[0] if mine else None
        if chosen is None and root_cause is not None and len(faults) == 1:
            chosen = _root_cause_naming(root_cause, _rank_nodes(events))
        verdict = _judge(chosen, truth, t_fault)
        # a wrong first naming with the faulted one close behind (two agents each reporting their own dead worker:
        # which line comes first is a race): the note says so, the verdict stays the first naming's
        realloc = fault.get("t_realloc") or end
        later = next((n for n in mine[1:] if n["ts"] <= realloc and all(_matches(p, truth) for p in n["parties"])), None)
        if verdict["verdict"] == "wrong" and later is not None and chosen is not None:
            verdict["note"] += (f"; then {later['by']} named {', '.join(_party_text(p) for p in later['parties'])}, "
                                f"{later['ts'] - chosen['ts']:.2f}s later")
        out.append(verdict)
    return out


def attach_blame(per_fault: list[dict[str, Any]], events: Iterable[Event], headline: Optional[dict[str, Any]],
                 root_cause: Optional[RootCauseBlock] = None) -> dict[str, Any]:
    """Set ``blame`` on each ``per_fault`` entry (in place) and return result.json's headline part: ``{"blame":
    the headline fault's}``, or ``{}`` when no fault was injected."""
    for entry, verdict in zip(per_fault, blame(events, per_fault, root_cause)):
        entry["blame"] = verdict
    return {"blame": headline["blame"]} if headline is not None and "blame" in headline else {}


def blame_line(b: Optional[dict[str, Any]]) -> Optional[str]:
    """The summary's and the report's line: ``torchrun agent named rank 1 on n1 (right): <words>``; ``None`` for
    no blame (a result from before blame was kept)."""
    if not b:
        return None
    blamed, verdict = b.get("blamed"), b.get("verdict")
    if not blamed:
        truth = _party_text(b.get("truth") or {})
        return f"no stack named the failed rank or node (none); chaoskit faulted {truth}"
    text = f"{blamed.get('by') or 'the stack'} named {_party_text(blamed)} ({verdict})"
    if blamed.get("words"):
        text += f": {blamed['words']}"
    if verdict == "wrong" and b.get("note"):
        text += f" [{b['note']}]"
    return text


def _root_cause_naming(rc: RootCauseBlock, where: dict[int, str]) -> Optional[dict[str, Any]]:
    # torch/distributed/elastic/multiprocessing/errors/__init__.py, _MSG_FORMAT_TEMPLATE:
    # "rank      : 1 (local_rank: 0)", "exitcode  : -9 (pid: 7)", "host", "error_file", "traceback"
    block = getattr(rc, "block", None) or {}
    m = re.match(r"(\d+)", block.get("rank", ""))
    if m is None:
        return None
    rank = int(m.group(1))
    words = "Root Cause (first observed failure): " + ", ".join(
        f"{k}: {block[k]}" for k in ("rank", "exitcode", "host", "traceback") if block.get(k))
    return {"ts": None, "by": "torchrun root cause", "words": words[:300],
            "parties": [{"rank": rank, "node": getattr(rc, "block_node", None) or where.get(rank)}]}


# --- judging ---------------------------------------------------------------------------------------------------


def _matches(party: dict[str, Any], truth: list[dict[str, Any]]) -> bool:
    """A named party is a faulted one: some target agrees on every part both sides have (rank, node)."""
    for t in truth:
        comparable = [k for k in ("rank", "node") if party.get(k) is not None and t.get(k) is not None]
        if comparable and all(party[k] == t[k] for k in comparable):
            return True
    return False


def _judge(naming: Optional[dict[str, Any]], truth: list[dict[str, Any]], t_fault: Optional[float]) -> dict[str, Any]:
    first = truth[0] if truth else {"rank": None, "node": None}
    out: dict[str, Any] = {"blamed": None, "truth": {"rank": first["rank"], "node": first["node"]}}
    if len(truth) > 1:
        out["truth"]["targets"] = [_party_text(t) for t in truth]
    if naming is None:
        out["verdict"] = "none"
        return out
    parties = naming["parties"]
    ranks = [p["rank"] for p in parties if p.get("rank") is not None]
    nodes = list(dict.fromkeys(p["node"] for p in parties if p.get("node") is not None))
    blamed: dict[str, Any] = {"rank": ranks[0] if len(ranks) == 1 else None,
                              "node": nodes[0] if len(nodes) == 1 else None}
    if len(ranks) > 1:
        blamed["ranks"] = ranks
    if len(nodes) > 1:
        blamed["nodes"] = nodes
    if len(parties) == 1 and parties[0].get("local_rank") is not None and blamed["rank"] is None:
        blamed["local_rank"] = parties[0]["local_rank"]
    blamed["by"] = naming["by"]
    blamed["words"] = naming["words"]
    if naming.get("via"):
        blamed["via"] = naming["via"]
    if naming.get("ts") is not None and t_fault is not None:
        blamed["after_s"] = round(naming["ts"] - t_fault, 4)
    out["blamed"] = blamed
    right = [p for p in parties if _matches(p, truth)]
    out["verdict"] = "right" if len(right) == len(parties) else "wrong"
    if out["verdict"] == "wrong":
        innocent = [_party_text(p) for p in parties if p not in right]
        out["note"] = (f"{', '.join(innocent)} {'was' if len(innocent) == 1 else 'were'} not faulted"
                       + (f"; it named {', '.join(_party_text(p) for p in right)} too" if right else ""))
    return out


def _party_text(p: dict[str, Any]) -> str:
    """``rank 1 on n1``, ``ranks 0, 1 on n0``, ``local_rank 0 on n1``, ``node n1``."""
    if p.get("ranks"):
        who: Optional[str] = "ranks " + ", ".join(str(r) for r in p["ranks"])
    elif p.get("rank") is not None:
        who = f"rank {p['rank']}"
    elif p.get("local_rank") is not None:
        who = f"local_rank {p['local_rank']}"
    else:
        who = None
    nodes = p.get("nodes") or ([p["node"]] if p.get("node") is not None else [])
    if who:
        return f"{who} on {', '.join(nodes)}" if nodes else who
    return ("nodes " if len(nodes) > 1 else "node ") + ", ".join(nodes) if nodes else "nobody"


# --- the timeline's own map of ranks -----------------------------------------------------------------------------


def _rank_nodes(timeline: Iterable[Event]) -> dict[int, str]:
    """rank -> the node its worker ran on, the last the timeline says."""
    out: dict[int, str] = {}
    for e in timeline:
        if e.get("kind") in ("worker.start", "process.gone", "step") and isinstance(e.get("rank"), int) and e.get("node"):
            out[e["rank"]] = e["node"]
    return out


def _pid_ranks(events: Iterable[Event]) -> dict[tuple[str, int], int]:
    """(node, pid) -> rank, from the workers' own starts and chaoskit's process watch."""
    out: dict[tuple[str, int], int] = {}
    for e in events:
        if (e.get("kind") in ("worker.start", "process.gone", "process.stopped", "heartbeat")
                and isinstance(e.get("pid"), int) and isinstance(e.get("rank"), int) and e.get("node")):
            out[(e["node"], e["pid"])] = e["rank"]
    return out
