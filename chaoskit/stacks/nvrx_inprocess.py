"""``recovery: nvrx-inprocess``: the reference job's training loop runs under NVRx's in-process restart
(``nvidia_resiliency_ext.inprocess.Wrapper``), which reruns it in the same processes from the newest checkpoint when
a rank raises, stops making progress or dies (:func:`measure_nvrx_inprocess`). The agents are
torchrun's.

NVRx deprecated in-process restart in 0.6 ("use in-job restart via ft_launcher"): this stack measures the NVRx the
package registry here serves (the ``frameworks`` extra's pin, 0.4.1); ``recovery: nvrx`` is the one upstream keeps.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Iterable

from pydantic import Field

from chaoskit.core.durations import PositiveDuration, parse_duration
from chaoskit.core.models import StrictModel
from chaoskit.measure import measure_fault
from chaoskit.observe.presets import Preset
from chaoskit.observe.rules import LogRule
from chaoskit.stacks.api import LONG_DETECTION_S, CannotRun, Stack, StackRun

__all__ = ["measure_nvrx_inprocess", "NVRX_INPROCESS_SOURCE", "NVRX_INPROCESS_PRESET", "NvrxInprocess",
           "NvrxInprocessRun", "NvrxInprocessSettings", "DEPRECATED"]

DEPRECATED = ("deprecated upstream: NVRx 0.6 deprecated in-process restart (\"use in-job restart via ft_launcher\"); "
              "measured here on the NVRx the frameworks extra pins")


# nvidia_resiliency_ext/inprocess/wrap.py (0.4.1): CallWrapper.__call__ logs through utils.log_exc,
# f"{rank=} {name}: {format_exc(exc)}", where the root logger has a StreamHandler; the reference job's
# train_inprocess prefixes them "[nvrx-inprocess] LEVEL LOGGER: ". tests/data/nvrx-inprocess/ holds a real recording.
_WRAPPER = r"\[nvrx-inprocess\] [A-Z]+ nvidia_resiliency_ext\.inprocess\.wrap: rank=(?P<rank>\d+) "
NVRX_INPROCESS_PRESET = Preset("nvrx-inprocess", (
    # fn_ex: the wrapped loop raised in this rank (log.error): the first to know of an exception
    LogRule.of(_WRAPPER + r"fn_ex: (?P<error>.{1,300})", "detect",
               {"source": "nvrx-inprocess", "who": "NVRx in-process Wrapper",
                "why": "the wrapped training loop raised"}),
    # term_ex: the iteration is over, for every rank, and why (log.warning): RankShouldRestart('Interruption.X on
    # ranks={...}'); an exception, a soft timeout (no ping), a dead or silent peer
    # (several at once: "Interruption.EXCEPTION on ranks={0}, Interruption.SOFT_TIMEOUT on ranks={0}")
    LogRule.of(_WRAPPER + r"term_ex: RankShouldRestart\('(?P<interruptions>Interruption\.(?P<interruption>[A-Z_]{1,40}) "
               r"on ranks=\{(?P<ranks>[\d, ]{0,200})\}[^']{0,400})'\)", "detect",
               {"source": "nvrx-inprocess", "who": "NVRx in-process Wrapper",
                "why": "the Wrapper interrupted the iteration"}),
    # restart_ex: the rank passed its health check and restarts its loop (log.info)
    LogRule.of(_WRAPPER + r"restart_ex: ", "inprocess.restart", {"source": "nvrx-inprocess"}),
), sees=("detect", "inprocess.restart"),
    cannot_see="steps, checkpoints and the loop's restarts (the Wrapper prints none; the reference job's own "
               "events give them, restart_count being the Wrapper's iteration); a rank its monitor process killed "
               "(hard timeout) is torchrun's to report",
    verbosity="the nvidia_resiliency_ext logger at INFO and a StreamHandler on the root logger (without one the "
              "Wrapper warns 'logging not initialized, logs are disabled' and prints nothing)")


class NvrxInprocessSettings(StrictModel):
    """NVIDIA Resiliency Extension's in-process restart (``nvidia_resiliency_ext.inprocess.Wrapper``): the reference
    job's training loop runs inside the Wrapper, which reruns it in the same processes when a rank raises, stops
    making progress or dies."""

    soft_timeout: PositiveDuration = Field(5.0, description=(
        "A rank that has not pinged (one ping a step) for this long is hung: every rank restarts its loop "
        "(the Wrapper's default is 60 s)."))
    hard_timeout: PositiveDuration = Field(60.0, description=(
        "A rank still silent this long is killed by its monitor process (the Wrapper's default is 90 s). Must be "
        "longer than the collective timeout: on gloo a rank blocked in a collective is freed only by that timeout."))
    heartbeat_timeout: PositiveDuration = Field(5.0, description=(
        "A peer whose monitor process stopped heartbeating this long (a dead process) is gone: the others restart "
        "(the Wrapper's default is 30 s)."))

    def job_args(self) -> list[str]:
        """The reference job's options for these settings."""
        return ["--nvrx-inprocess", "--nvrx-soft-timeout", f"{self.soft_timeout:g}",
                "--nvrx-hard-timeout", f"{self.hard_timeout:g}", "--nvrx-heartbeat-timeout", f"{self.heartbeat_timeout:g}"]


class NvrxInprocessRun(StackRun):
    def __init__(self, stack: Stack, job: Any) -> None:
        super().__init__(stack, job)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            self.store_port = s.getsockname()[1]
        """The job's own store under NVRx's in-process restart (the Wrapper's is at MASTER_PORT)."""

    def job_args(self) -> list[str]:
        return self.job.workload.nvrx_inprocess.job_args()

    def env_defaults(self) -> dict[str, str]:
        # the Wrapper's store waits warn from c10d's C++ twice a second per rank ("waitForInput ... timed out
        # after 500ms"), every one of them expected
        return {"TORCH_CPP_LOG_LEVEL": "ERROR"}

    def env_owned(self, node: str, plan: bool = False) -> dict[str, str]:
        return {"CHAOSKIT_NVRX_STORE_PORT": str(self.store_port)}


def _wrapper(e: dict[str, Any], timeline: list[dict[str, Any]], i: int, where: dict[int, str],
             pids: dict[tuple[str, int], int]) -> dict[str, Any] | None:
    by = e.get("who") or "NVRx in-process Wrapper"
    if e.get("interruption"):  # term_ex: RankShouldRestart('Interruption.X on ranks={...}')
        ranks = sorted({int(r) for r in str(e.get("ranks", "")).replace(" ", "").split(",") if r.isdigit()})
        return {"by": by, "words": f"rank={e.get('rank')} term_ex: RankShouldRestart('{e.get('interruptions')}')",
                "parties": [{"rank": r, "node": where.get(r)} for r in ranks]}
    if e.get("error") is not None and e.get("rank") is not None:  # fn_ex: the loop raised in this rank
        return {"by": by, "words": f"rank={e['rank']} fn_ex: {e['error']}",
                "parties": [{"rank": e["rank"], "node": e.get("node")}]}
    return None


NVRX_INPROCESS_SOURCE = "nvrx-inprocess"
"""The ``source`` of the ``nvrx-inprocess`` preset's events: the in-process Wrapper's own lines."""


def measure_nvrx_inprocess(events: Iterable[dict[str, Any]], t_fault: float, t_fault_uncertainty: float = 0.0,
                           node: str | None = None, fault_step: int | None = None) -> dict[str, Any]:
    """Measure a job under NVRx's in-process restart (``nvidia_resiliency_ext.inprocess.Wrapper``) recovering from
    one fault (docs/architecture.md, "Recovery models"). The Wrapper reruns the training loop in the same
    processes, so the phases are the restart model's with the loop's restart in place of new workers:

    - detection: ``t_fault`` to the first of the Wrapper's lines (``detect`` from the ``nvrx-inprocess`` preset:
      the loop raised in a rank, or the iteration was interrupted: a soft timeout, a dead peer) and any other
      failure seen (a peer's collective error), whichever came first;
    - reallocation: to every rank's loop started again (``worker.start`` with the Wrapper's iteration as its
      ``restart_count``);
    - checkpoint load, recovery, lost work: as :func:`measure_fault`.

    The keys are :func:`measure_fault`'s, plus ``wrapper``: the Wrapper's first interruption after the fault
    (``{ts, latency_s, rank, interruption, ranks, interruptions}``: the first, the ranks it names, all of them as
    the Wrapper wrote them; ``None`` when it logged none), and ``in_process``: whether every
    rank's restarted loop ran in a process that was already a worker before the fault (``True``: no process was
    replaced; ``False``: torchrun had to restart some; ``None``: no restart seen, or starts without pids), and
    ``world_size``: ``{before, after}`` the restart (the Wrapper goes on without ranks it finds unresponsive: a
    dead node's; ``None`` where the starts do not say)."""
    timeline = sorted(events, key=lambda e: e["ts"])
    phases = measure_fault(timeline, t_fault, t_fault_uncertainty, node=node, fault_step=fault_step)
    phases["model"] = "nvrx-inprocess"
    stop = next((e for e in timeline if e["ts"] > t_fault and e.get("kind") == "detect"
                 and e.get("source") == NVRX_INPROCESS_SOURCE and e.get("interruption")), None)
    phases["wrapper"] = None if stop is None else {
        "ts": stop["ts"], "latency_s": round(stop["ts"] - t_fault, 4), "rank": stop.get("rank"),
        "interruption": stop.get("interruption"), "ranks": _rank_list(stop.get("ranks")),
        "interruptions": stop.get("interruptions")}
    before = {e.get("pid") for e in timeline if e["ts"] <= t_fault and e.get("kind") == "worker.start"}
    t_realloc = phases.get("t_realloc")
    restarted = [e for e in timeline if e.get("kind") == "worker.start" and t_realloc is not None
                 and t_fault < e["ts"] <= t_realloc]
    pids = [e.get("pid") for e in restarted]
    phases["in_process"] = (None if not restarted or None in pids or None in before
                            else all(pid in before for pid in pids))
    worlds = [e["world_size"] for e in timeline if e["ts"] <= t_fault and e.get("kind") == "worker.start"
              and isinstance(e.get("world_size"), int)]
    after = [e["world_size"] for e in restarted if isinstance(e.get("world_size"), int)]
    phases["world_size"] = {"before": max(worlds), "after": min(after)} if worlds and after else None
    if phases["detection_s"] is None:
        phases["reasons"]["detection"] = ("not observed: no line of the in-process Wrapper (the nvrx-inprocess "
                                          "preset's fn_ex / term_ex) and no worker failure after the fault")
    return phases


def _rank_list(v: Any) -> list[int]:
    """``"0, 1"`` (or ``1``: a log rule reads a lone number as one) as ``[0, 1]``."""
    return sorted({int(r) for r in str(v).replace(" ", "").split(",") if r.isdigit()}) if v is not None else []


class NvrxInprocess(Stack):
    name = "nvrx-inprocess"
    log_presets = (NVRX_INPROCESS_PRESET,)
    blame_readers = {("detect", "nvrx-inprocess"): _wrapper}
    describe = "NVIDIA's in-process restart (deprecated upstream in NVRx 0.6): the Wrapper reruns every rank's loop in its own process"
    launches = ("reference", "uninstrumented")
    refusal = ("recovery: nvrx-inprocess runs the reference job's loop under NVRx's inprocess.Wrapper "
               "(launch: {launches}), not launch: {launch}; a job of your own that wraps itself is measured "
               "with recovery: restart and the nvrx-inprocess preset")
    settings_key = "nvrx_inprocess"
    Settings = NvrxInprocessSettings
    settings_doc = ("recovery: nvrx-inprocess only: the Wrapper's timeouts (default: 5 s soft, 60 s hard, 5 s "
                    "heartbeat). NVRx deprecated in-process restart in 0.6.")
    presets = ("nvrx-inprocess",)  # the Wrapper's own lines
    phase_meanings = {"detection": "fault -> the in-process Wrapper's first line (a rank raised, or the iteration "
                                   "was interrupted) or another failure",
                      "reallocation": "noticed -> every rank's loop started again in its process",
                      "checkpoint_load": "started -> last rank loaded", "recovery": "fault -> first step after load",
                      "lost_steps": "the last step before the fault - the step restored"}
    reallocation_label = "every rank's loop started again"
    result_keys = ("wrapper", "in_process")
    extra = "frameworks"
    requires = "nvidia_resiliency_ext"
    install = "pip install 'chaoskit[frameworks]' (nvidia-resiliency-ext, NVRx)"
    scorecard_column = "nvrx-inprocess"
    scorecard_note = DEPRECATED
    framework = "nvrx-inprocess"
    init_lines = ("  recovery: restart                    # your job wraps its loop in NVRx's inprocess.Wrapper "
                  "itself: torchrun starts it, the nvrx-inprocess preset reads the Wrapper's lines (recovery: "
                  "nvrx-inprocess wraps chaoskit's reference job only)",)
    run_class = NvrxInprocessRun

    def measure(self, events: Any, t_fault: float, t_fault_uncertainty: float = 0.0, *, node: str | None = None,
                fault_step: int | None = None) -> dict[str, Any]:
        return measure_nvrx_inprocess(events, t_fault, t_fault_uncertainty, node=node, fault_step=fault_step)

    def check(self, workload: Any) -> None:
        s = workload.nvrx_inprocess
        if workload.collective_timeout >= s.hard_timeout:
            raise ValueError(f"collective_timeout ({workload.collective_timeout:g}s) must be shorter than "
                             f"nvrx_inprocess.hard_timeout ({s.hard_timeout:g}s): on gloo a rank "
                             "blocked in a collective is freed only by its timeout, and the Wrapper kills a rank "
                             "silent for hard_timeout")

    def adapt_row(self, doc: dict[str, Any], folder: Path) -> dict[str, Any]:
        w = doc["workload"]
        if self.launch_problem(w.get("launch", "reference")):
            raise CannotRun(f"the in-process Wrapper wraps the reference job's training loop; launch: {w['launch']} is "
                            "a job of its own")
        w["recovery"] = self.name
        given = w.get("collective_timeout", 30)  # the hard timeout must outlast it (gloo has no abort)
        collective = float(given) if isinstance(given, (int, float)) else float(parse_duration(given))
        w.setdefault("nvrx_inprocess", {"soft_timeout": "5s", "hard_timeout": f"{max(30.0, 2 * collective):g}s",
                                        "heartbeat_timeout": "5s"})
        return doc

    def timeouts(self, workload: Any) -> tuple[dict[str, str], list[str]]:
        s: NvrxInprocessSettings = workload.nvrx_inprocess
        timeouts = {"NVRx in-process soft timeout": f"{s.soft_timeout:g}s",
                    "NVRx in-process hard timeout": f"{s.hard_timeout:g}s",
                    "NVRx in-process heartbeat timeout": f"{s.heartbeat_timeout:g}s"}
        warnings = []
        if s.soft_timeout >= LONG_DETECTION_S:
            warnings.append(f"NVRx in-process soft timeout {s.soft_timeout:g}s: a hung rank takes "
                            f"{s.soft_timeout / 60:.0f} min to notice")
        return timeouts, warnings

    def bound(self, who: str, detection_s: float, workload: Any) -> str | None:
        if not who.startswith("NVRx in-process Wrapper"):
            return None
        soft = workload.nvrx_inprocess.soft_timeout
        return f", at its soft timeout ({soft:g}s)" if abs(detection_s - soft) <= max(1.0, 0.2 * soft) else ""
