"""``recovery: nvrx``: NVIDIA Resiliency Extension's ``ft_launcher`` (``nvidia-resiliency-ext``) in place of
torchrun, one rank monitor per worker, which end and restart the workers when a rank's heartbeat or section stops
coming (:func:`measure_nvrx`).

The NVRx it drives: the installed ``nvidia-resiliency-ext`` (``importlib.metadata``), else :data:`PINNED`.
:data:`SETTINGS_SINCE` says which NVRx brought each setting; one the NVRx in use lacks is refused at its line.
NVRx 0.7 (upstream) adds hot spares and node health checks (NIC link state, storage) and keeps only the barrier
rendezvous; the package registry here serves up to 0.4.1, so those settings are refused until the pin moves.
Moving is the pin in ``pyproject.toml`` and this module: their options in :meth:`NvrxSettings.launcher_args`, and
their lines in the ``nvrx`` preset as detection sources.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Literal

from pydantic import Field, ValidationInfo, field_validator

from chaoskit.core.durations import PositiveDuration
from chaoskit.core.errors import InfraError
from chaoskit.core.files import open_folder
from chaoskit.core.models import StrictModel, check_each
from chaoskit.measure import measure_fault
from chaoskit.observe.presets import Preset
from chaoskit.observe.rules import LogRule
from chaoskit.stacks.api import LONG_DETECTION_S, CannotRun, Stack, StackRun

__all__ = ["measure_nvrx", "NVRX_SOURCE", "NVRX_PRESET", "Nvrx", "NvrxRun", "NvrxSettings", "PINNED",
           "SETTINGS_SINCE", "nvrx_version", "NVRX_LAUNCHER", "NVRX_DEFAULT_HEARTBEAT_S"]

PINNED = "0.4.1"
"""The NVRx the ``frameworks`` extra pins (the newest the package registry here serves)."""
SETTINGS_SINCE: dict[str, str] = {
    "heartbeat_timeout": "0.1.0", "initial_heartbeat_timeout": "0.1.0", "check_interval": "0.1.0",
    "section_timeouts": "0.2.0", "out_of_section_timeout": "0.2.0",
    "hot_spares": "0.7.0", "health_checks": "0.7.0",
}
"""Each ``workload.nvrx`` setting -> the first NVRx that has it."""
NVRX_DEFAULT_HEARTBEAT_S = 45 * 60.0
"""nvidia-resiliency-ext's own ``rank_heartbeat_timeout`` (fault_tolerance/config.py) when a job sets none."""
NVRX_LAUNCHER = ("-c", "import sys; from nvidia_resiliency_ext.fault_tolerance.launcher import main; sys.exit(main())")
"""``ft_launcher`` run by the job's Python (its console script's entry point), so that a node's own Python is used."""
SECTION_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
_SOCKET_DIR_MAX = 60
"""The longest folder ``ft_launcher``'s Unix sockets may go in: it adds up to ~45 characters of its own
(``_ft_launcher<pid>_rmon<n>.socket``), and a socket path is at most 107 bytes."""


@functools.lru_cache(maxsize=1)
def nvrx_version() -> str:
    """The NVRx chaoskit drives: the installed ``nvidia-resiliency-ext``'s version, else :data:`PINNED`."""
    try:
        return importlib.metadata.version("nvidia-resiliency-ext")
    except importlib.metadata.PackageNotFoundError:
        return PINNED


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        parts.append(int(digits or 0))
    return tuple(parts)


def _since(name: str, value: Any) -> Any:
    """Refuse a setting the NVRx in use lacks (:data:`SETTINGS_SINCE`), at its line."""
    since = SETTINGS_SINCE[name]
    if value is not None and value != [] and _release(nvrx_version()) < _release(since):
        raise ValueError(f"{name} needs NVRx {since} or later, and chaoskit drives NVRx {nvrx_version()} (the installed "
                         f"nvidia-resiliency-ext, else the pinned {PINNED}): docs/recovery-stacks.md")
    return value


# nvidia_resiliency_ext/fault_tolerance/rank_monitor_server.py (0.4.1): each rank's monitor logs through
# RankMonitorLogger, "[%(asctime)s] [%(levelname)s] [RankMonServer{pid}@{hostname}:{rank}] %(message)s", on stderr
# (which ft_launcher passes through); tests/data/nvrx/ holds a real recording.
_RANK_MONITOR = r"\[RankMonServer\d+@[^\]\s]*:(?P<rank>\d+)\] "
NVRX_PRESET = Preset("nvrx", (
    # _is_hb_timeout_elapsed: f"Did not get subsequent heartbeat. Waited {timeout:.2f} seconds."
    LogRule.of(_RANK_MONITOR + r"Did not get subsequent heartbeat\. Waited (?P<timeout_s>[\d.]+) seconds", "detect",
               {"source": "nvrx", "who": "NVRx rank monitor", "why": "no heartbeat within the rank heartbeat timeout"}),
    # the same, before any: f"Did not get initial heartbeat. Waited {timeout:.2f} seconds."
    LogRule.of(_RANK_MONITOR + r"Did not get initial heartbeat\. Waited (?P<timeout_s>[\d.]+) seconds", "detect",
               {"source": "nvrx", "who": "NVRx rank monitor", "why": "no first heartbeat within the initial timeout"}),
    # _is_section_timeout_elapsed: f"Section '{section}' has been open for {elapsed:.2f} seconds. Timeout is ..."
    LogRule.of(_RANK_MONITOR + r"Section '(?P<section>[^']{1,64})' has been open for [\d.]+ seconds\. Timeout is "
               r"(?P<timeout_s>[\d.]+) seconds", "detect",
               {"source": "nvrx", "who": "NVRx rank monitor", "why": "a section stayed open past its timeout"}),
    # the same: f"Was out of section for {elapsed:.2f} seconds. Timeout is {timeout:.2f} seconds."
    LogRule.of(_RANK_MONITOR + r"Was out of section for [\d.]+ seconds\. Timeout is (?P<timeout_s>[\d.]+) seconds",
               "detect", {"source": "nvrx", "who": "NVRx rank monitor", "why": "out of every section past its timeout"}),
), sees=("detect",),
    cannot_see="steps, checkpoints and worker starts (ft_launcher prints none; combine with the job's own events "
               "or its framework's preset); a rank that exits is reported by ft_launcher's torchrun lines "
               "(the torchrun preset), not by its rank monitor",
    verbosity="ft_launcher's default (--ft-log-level INFO: the monitors' timeout lines are warnings)",
    tee_prefixes=False)


class NvrxSettings(StrictModel):
    """NVIDIA Resiliency Extension (``nvidia-resiliency-ext``) fault tolerance: ``ft_launcher``'s rank monitors,
    one per worker, that end and restart the workers when a rank's heartbeat or section stops coming."""

    heartbeat_timeout: PositiveDuration | None = Field(5.0, description=(
        "--ft-rank-heartbeat-timeout: a rank silent this long after a heartbeat is hung (NVRx's default is 45 min). "
        "null: switched off (NVRx's null: never checked, as its own sections example sets it), for a job that "
        "sends no heartbeats and is watched by its sections alone; chaoskit says it in ft_launcher's config file "
        "(--ft-cfg-path), since its options take numbers only."))
    initial_heartbeat_timeout: PositiveDuration | None = Field(60.0, description=(
        "--ft-initial-rank-heartbeat-timeout: the longest a rank may take to its first heartbeat (start-up, "
        "checkpoint load; NVRx's default is 60 min). null: none (as heartbeat_timeout)."))
    section_timeouts: dict[str, PositiveDuration] = Field(default_factory=dict, description=(
        "--ft-rank-section-timeouts: the longest each named section may stay open. The reference job opens "
        "'setup' (process group and checkpoint load), 'step' (one training step) and 'checkpointing' (a save); "
        "empty: heartbeats only."))
    out_of_section_timeout: PositiveDuration | None = Field(None, description=(
        "--ft-rank-out-of-section-timeout: the longest a rank may spend outside every section (with section_timeouts)."))
    check_interval: PositiveDuration = Field(0.5, description=(
        "--ft-workload-check-interval: how often a rank monitor checks its timeouts; a hang is seen up to this "
        "much after its timeout (NVRx's default is 5 s)."))
    hot_spares: int | None = Field(None, ge=1, le=64, description=(
        "NVRx 0.7 and later: nodes ft_launcher holds in reserve to replace a failed one. Refused under an older "
        "NVRx (chaoskit drives the installed one, else 0.4.1)."))
    health_checks: list[Literal["nic_link", "storage"]] = Field(default_factory=list, description=(
        "NVRx 0.7 and later: node health checks ft_launcher runs (a NIC's link state, storage). Refused under an "
        "older NVRx (chaoskit drives the installed one, else 0.4.1)."))

    @field_validator("section_timeouts")
    @classmethod
    def _sections(cls, v: dict[str, float]) -> dict[str, float]:
        check_each(v, SECTION_RE, "section name", "letters, digits and _, at most 64")
        if len(v) > 16:
            raise ValueError("at most 16 sections")
        return _since("section_timeouts", v or None) or v

    @field_validator("out_of_section_timeout", "hot_spares", "health_checks")
    @classmethod
    def _in_this_nvrx(cls, v: Any, info: ValidationInfo) -> Any:
        return _since(info.field_name, v)

    def null_timeouts(self) -> list[str]:
        """NVRx's names of the heartbeat timeouts switched off (``null``): ft_launcher's options take a number only, so
        these go in its config file (:meth:`config_yaml`)."""
        return [name for name, value in (("initial_rank_heartbeat_timeout", self.initial_heartbeat_timeout),
                                         ("rank_heartbeat_timeout", self.heartbeat_timeout)) if value is None]

    def config_yaml(self) -> str | None:
        """The ``--ft-cfg-path`` file's text when a timeout is switched off, else ``None``. NVRx's options are
        ``type=float`` and an option not given keeps NVRx's default (45 and 60 min), so ``null`` is said in its
        config file's ``fault_tolerance`` section, where a null timeout "has no effect" (fault_tolerance/config.py);
        the options given beside it override the file."""
        nulls = self.null_timeouts()
        if not nulls:
            return None
        return "fault_tolerance:\n" + "".join(f"  {name}: null\n" for name in nulls)

    def launcher_args(self, config_path: str | None = None) -> list[str]:
        """``ft_launcher``'s options for these settings; ``config_path``: where :meth:`config_yaml` is written (needed
        when a timeout is switched off: ``ValueError`` without it)."""
        args: list[str] = []
        if self.null_timeouts():
            if config_path is None:
                raise ValueError("a heartbeat timeout switched off needs ft_launcher's config file (config_path)")
            args += ["--ft-cfg-path", config_path]
        if self.heartbeat_timeout is not None:
            args += ["--ft-rank-heartbeat-timeout", f"{self.heartbeat_timeout:g}"]
        if self.initial_heartbeat_timeout is not None:
            args += ["--ft-initial-rank-heartbeat-timeout", f"{self.initial_heartbeat_timeout:g}"]
        args += ["--ft-workload-check-interval", f"{self.check_interval:g}"]
        if self.section_timeouts:
            args += ["--ft-rank-section-timeouts", ",".join(f"{k}:{v:g}" for k, v in self.section_timeouts.items())]
        if self.out_of_section_timeout is not None:
            args += ["--ft-rank-out-of-section-timeout", f"{self.out_of_section_timeout:g}"]
        return args


class NvrxRun(StackRun):
    sets_tmpdir = True

    def __init__(self, stack: Stack, job: Any) -> None:
        super().__init__(stack, job)
        self._socket_dir: Path | None = None

    def config_path(self) -> Path | None:
        """ft_launcher's config file (``--ft-cfg-path``) when ``workload.nvrx`` switches a heartbeat timeout off
        (:meth:`NvrxSettings.config_yaml`), else ``None``; written by :meth:`write_config`."""
        return self.job.job_dir / "nvrx-ft.yaml" if self.job.workload.nvrx.config_yaml() else None

    def write_config(self) -> str | None:
        """Write :meth:`config_path`'s file (once) and return its path, or ``None`` when none is needed."""
        path = self.config_path()
        if path is None or path.exists():
            return None if path is None else str(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        dfd = open_folder(self.job.job_dir)
        try:  # chaoskit's file (as a checked script's copy): never through a link, the job's account reads it
            fd = os.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        finally:
            os.close(dfd)
        with os.fdopen(fd, "w") as fh:
            os.fchmod(fd, 0o644)
            fh.write(self.job.workload.nvrx.config_yaml())
        return str(path)

    def launcher(self, plan: bool = False) -> list[str]:
        # ft_launcher takes torchrun's options and its own --ft-* ones
        config = self.config_path() if plan else self.write_config()
        return [*NVRX_LAUNCHER, *self.job.workload.nvrx.launcher_args(str(config) if config is not None else None)]

    def env_owned(self, node: str, plan: bool = False) -> dict[str, str]:
        # ft_launcher makes its sockets in tempfile.gettempdir() under names from its pid (guessable in /tmp)
        return {"TMPDIR": "<a private folder of the job's, made at start>" if plan else str(self.socket_dir())}

    def socket_dir(self) -> Path:
        """The private folder (0700) ``ft_launcher`` keeps its sockets in: the job's own ``nvrx/`` when its path is
        short enough for a Unix socket, else a fresh one from :func:`tempfile.mkdtemp` (a random name)."""
        if self._socket_dir is None:
            job = self.job
            mine = job.job_dir / "nvrx"
            if job.account is not None:  # the account's own folder (made with it), or a fresh random one given to it
                mine = job.job_dir / "tmp"
                if len(str(mine)) > _SOCKET_DIR_MAX:
                    mine = Path(tempfile.mkdtemp(prefix="chaoskit-nvrx-"))
                    os.chown(mine, job.account.uid, job.account.gid, follow_symlinks=False)
                self._socket_dir = mine
            elif len(str(mine)) <= _SOCKET_DIR_MAX:
                mine.mkdir(mode=0o700, parents=True, exist_ok=True)
                if mine.is_symlink() or not mine.is_dir() or mine.stat().st_uid != os.geteuid():
                    raise InfraError(f"{mine} is not a folder of this user's: refusing to put ft_launcher's sockets there")
                mine.chmod(0o700)
                self._socket_dir = mine
            else:
                self._socket_dir = Path(tempfile.mkdtemp(prefix="chaoskit-nvrx-"))
        return self._socket_dir

    def start(self) -> list[Any]:
        self.write_config()
        return []

    def cleanup(self) -> None:
        if self._socket_dir is not None and self._socket_dir.name.startswith("chaoskit-nvrx-"):
            shutil.rmtree(self._socket_dir, ignore_errors=True)


_MONITOR_WORDS = {  # nvidia_resiliency_ext/fault_tolerance/rank_monitor_server.py (0.4.1), by the preset's ``why``
    "no heartbeat within the rank heartbeat timeout": "Did not get subsequent heartbeat. Waited {t:.2f} seconds.",
    "no first heartbeat within the initial timeout": "Did not get initial heartbeat. Waited {t:.2f} seconds.",
    "out of every section past its timeout": "Was out of section for ... seconds. Timeout is {t:.2f} seconds.",
}


def _rank_monitor(e: dict[str, Any], timeline: list[dict[str, Any]], i: int, where: dict[int, str],
                  pids: dict[tuple[str, int], int]) -> dict[str, Any] | None:
    rank = e.get("rank")
    try:
        timeout: float | None = float(e["timeout_s"])  # a capture: "5.00"
    except (KeyError, TypeError, ValueError):
        timeout = None
    if e.get("section"):
        words = (f"Section '{e['section']}' has been open for ... seconds. Timeout is "
                 + (f"{timeout:.2f} seconds." if timeout is not None else "... seconds."))
    else:
        template = _MONITOR_WORDS.get(str(e.get("why")))
        words = (template.format(t=timeout) if template and timeout is not None
                 else str(e.get("why") or "a rank monitor's timeout"))
    return {"by": e.get("who") or "NVRx rank monitor", "words": f"[RankMonServer:{rank}] {words}",
            "parties": [{"rank": rank, "node": e.get("node")}] if rank is not None else []}


NVRX_SOURCE = "nvrx"
"""The ``source`` of the ``nvrx`` preset's events: a rank monitor's heartbeat or section timeout."""


def measure_nvrx(events: Iterable[dict[str, Any]], t_fault: float, t_fault_uncertainty: float = 0.0,
                 node: str | None = None, fault_step: int | None = None) -> dict[str, Any]:
    """Measure a job under NVIDIA's ``ft_launcher`` (nvidia-resiliency-ext) recovering from one fault
    (docs/architecture.md, "Recovery models"). ft_launcher restarts the world as torchrun does, so the phases
    after detection are the restart model's; what it adds is who notices:

    - detection: ``t_fault`` to the first of a rank monitor's timeout line (``detect`` from the ``nvrx`` preset:
      "Did not get subsequent heartbeat", a section open past its timeout) and the worker's own failure (the
      launcher's agent seeing it exit, a surviving rank's collective error), whichever came first;
    - reallocation: to every worker of the restarted world started (ft_launcher's in-job restart, or a new
      rendezvous round with a spare);
    - checkpoint load, recovery, lost work: as :func:`measure_fault`.

    The keys are :func:`measure_fault`'s, plus ``rank_monitor``: the rank monitors' first timeout after the fault
    (``{ts, latency_s, rank, why, timeout_s}``), ``None`` when no monitor noticed (a rank that died is the launcher's
    to see, not its monitor's)."""
    timeline = sorted(events, key=lambda e: e["ts"])
    phases = measure_fault(timeline, t_fault, t_fault_uncertainty, node=node, fault_step=fault_step)
    phases["model"] = "nvrx"
    monitor = next((e for e in timeline if e["ts"] > t_fault and e.get("kind") == "detect"
                    and e.get("source") == NVRX_SOURCE), None)
    phases["rank_monitor"] = None if monitor is None else {
        "ts": monitor["ts"], "latency_s": round(monitor["ts"] - t_fault, 4), "rank": monitor.get("rank"),
        "why": monitor.get("why"), "timeout_s": _number(monitor.get("timeout_s")),
        **({"section": monitor["section"]} if monitor.get("section") else {})}
    if phases["detection_s"] is None:
        phases["reasons"]["detection"] = ("not observed: no rank monitor timeout (the nvrx preset's 'Did not get "
                                          "subsequent heartbeat' / section lines) and no worker failure after the fault")
    return phases


def _number(v: Any) -> float | None:
    try:
        return float(v) if v is not None else None
    except (TypeError, ValueError):
        return None


class Nvrx(Stack):
    name = "nvrx"
    log_presets = (NVRX_PRESET,)
    blame_readers = {("detect", "nvrx"): _rank_monitor}
    describe = "NVIDIA's ft_launcher: each rank's monitor restarts a world whose rank stopped heartbeating"
    launches = ("reference", "uninstrumented", "command")
    refusal = "recovery: nvrx starts ft_launcher in place of torchrun (launch: {launches}), not launch: {launch}"
    settings_key = "nvrx"
    Settings = NvrxSettings
    settings_doc = "recovery: nvrx only: ft_launcher's timeouts (default: a 5 s heartbeat timeout, checked every 0.5 s)."
    agent = "ft_launcher"
    owned_env = ("TMPDIR",)
    presets = ("nvrx",)  # ft_launcher's rank monitors say who noticed
    phase_meanings = {"detection": "fault -> a rank monitor's heartbeat/section timeout or the worker's failure",
                      "reallocation": "noticed -> ft_launcher's restarted world started",
                      "checkpoint_load": "started -> last rank loaded", "recovery": "fault -> first step after load",
                      "lost_steps": "the last step before the fault - the step restored"}
    result_keys = ("rank_monitor",)
    extra = "frameworks"
    requires = "nvidia_resiliency_ext"
    install = f"pip install 'chaoskit[frameworks]' (nvidia-resiliency-ext=={PINNED})"
    scorecard_column = "nvrx"
    framework = "nvrx"
    init_lines = ("  recovery: nvrx                       # NVRx's ft_launcher in place of torchrun: its rank monitors "
                  "(FT_RANK_MONITOR_IPC_SOCKET) for your job's RankMonitorClient",
                  "  nvrx:                                # EDIT: ft_launcher's timeouts; null switches one off (a job "
                  "watched by its sections alone, as NVRx's sections example)",
                  "    heartbeat_timeout: 5s              # a rank silent this long after a heartbeat is hung (null: none)",
                  "    initial_heartbeat_timeout: 60s     # the longest to the first heartbeat (null: none)",
                  "    # section_timeouts: {step: 10s}    # the sections your job opens, and the longest each may stay open")
    run_class = NvrxRun

    def measure(self, events: Any, t_fault: float, t_fault_uncertainty: float = 0.0, *, node: str | None = None,
                fault_step: int | None = None) -> dict[str, Any]:
        return measure_nvrx(events, t_fault, t_fault_uncertainty, node=node, fault_step=fault_step)

    def adapt_row(self, doc: dict[str, Any], folder: Path) -> dict[str, Any]:
        w = doc["workload"]
        if self.launch_problem(w.get("launch", "reference")):
            raise CannotRun(f"ft_launcher replaces torchrun; launch: {w['launch']} has none")
        w["recovery"] = self.name
        w.setdefault("nvrx", {"heartbeat_timeout": "5s", "initial_heartbeat_timeout": "60s"})
        return doc

    def timeouts(self, workload: Any) -> tuple[dict[str, str], list[str]]:
        n: NvrxSettings = workload.nvrx
        timeouts = {"NVRx version": nvrx_version()}
        for label, value in (("heartbeat timeout", n.heartbeat_timeout),
                             ("initial heartbeat timeout", n.initial_heartbeat_timeout)):
            timeouts[f"NVRx {label}"] = "off (null)" if value is None else f"{value:g}s"
        timeouts["NVRx check interval"] = f"{n.check_interval:g}s"
        if n.section_timeouts:
            timeouts["NVRx section timeouts"] = ", ".join(f"{k} {v:g}s" for k, v in n.section_timeouts.items())
        if n.out_of_section_timeout is not None:
            timeouts["NVRx out-of-section timeout"] = f"{n.out_of_section_timeout:g}s"
        warnings = []
        if n.heartbeat_timeout is not None and n.heartbeat_timeout >= LONG_DETECTION_S:
            warnings.append(f"NVRx heartbeat timeout {n.heartbeat_timeout:g}s (nvidia-resiliency-ext's default is "
                            f"45 min): a hang takes {n.heartbeat_timeout / 60:.0f} min to notice")
        return timeouts, warnings

    def bound(self, who: str, detection_s: float, workload: Any) -> str | None:
        if not who.startswith("NVRx rank monitor"):
            return None
        hb = workload.nvrx.heartbeat_timeout
        return "" if hb is None else f", at its heartbeat timeout ({hb:g}s)"  # null: switched off
