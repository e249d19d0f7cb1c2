"""Start a training job under torchrun on the nodes of a local lab.

One torchrun agent per node (elastic, c10d rendezvous), its output piped back
line by line: each line is written to ``logs/<node>.log`` and handed to the
log probes with the moment it arrived.

The recovery stack (``workload.recovery``, :mod:`chaoskit.stacks`) says what differs from that: each node's
launcher (NVRx's ``ft_launcher``), its world (a torchft replica group is a world of its own), the variables it owns
and what runs beside the agents (torchft's lighthouse), through its :class:`~chaoskit.stacks.api.StackRun`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from chaoskit.backends.api import ClusterHandle
from chaoskit.cluster.transports.local import LocalTransport
from chaoskit.core.errors import InfraError, ScenarioError
from chaoskit.core.files import open_folder, torch_cache_env
from chaoskit.core.jobenv import SHARE_STORE_VAR, WHY
from chaoskit.core.lines import terminal_lines
from chaoskit.core.trusted import read_authors_file
from chaoskit.stacks.registry import stack_of
from chaoskit.workloads.api import Job, job_folder
from chaoskit.workloads.root_cause import RootCause

__all__ = ["TorchrunJob", "free_port", "torch_available"]


MAX_SCRIPT_BYTES = 16 << 20
"""The largest ``launch: command`` script chaoskit copies to run (a larger one is refused, never cut short)."""

LineSink = Callable[[str, str, float], None]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes(scope) -> list:
    """The scope's processes; none when its node cannot be reached (a powered-off container)."""
    try:
        return scope.processes()
    except InfraError:
        return []


def torch_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


class TorchrunJob(Job):
    """The reference (or a user's) training job: one torchrun agent per node of the cluster.

    Agents on spare nodes join too; torchrun keeps them waiting (its rendezvous
    "redundancy list") until a node of the world is lost.
    """

    bootstraps = True

    def __init__(
        self,
        cluster: ClusterHandle,
        workload,  # chaoskit.scenario.model.Workload
        run_dir: Path,
        run_id: str,
        events_path: Path | None,
        on_line: LineSink | None = None,
        *,
        base: Path | None = None,
    ) -> None:
        """``base``: the folder a relative ``workload.command`` script is taken from (the scenario's)."""
        self.base = Path(base) if base is not None else Path.cwd()
        self.cluster, self.workload, self.run_dir, self.run_id = cluster, workload, Path(run_dir).resolve(), run_id
        self.events_path, self.on_line = events_path, on_line
        self.root_cause = RootCause()
        """Why workers died, from their output (torchrun's Root Cause block, the last exception)."""
        self.line_errors: list[str] = []
        """What went wrong handling a line of the job's output (the line was skipped; the job kept being read)."""
        self.account = cluster.job_account
        """The unprivileged account the job runs as (its folder is then ``RUN.job``, that account's), or ``None``."""
        owned = self.account is not None
        self.job_dir = job_folder(cluster, self.run_dir, run_id, owned=owned)
        self.ckpt_dir = self.job_dir / "checkpoints"
        self.log_dir = self.run_dir / "logs"
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self._readers: list[threading.Thread] = []
        self.port = free_port()
        self.node_env: dict[str, dict[str, str]] = {}
        """Variables for one node's processes on top of :meth:`job_env`'s (the in-process channel: :meth:`use_inproc`)."""

        self.stack = stack_of(workload)
        self.stack_run = self.stack.for_job(self)
        """The recovery stack's part in starting the job: its launcher, world, environment, processes beside it."""
        self.beside: list[subprocess.Popen[bytes]] = []
        """What the stack started beside the agents (torchft's lighthouse)."""
        self.checked_script: tuple[Path, str] | None = None
        """``launch: command``: the copy of its script that the workers run, and where the checked script really is
        (:meth:`check_script`); ``None`` until the job starts."""

    def use_inproc(self, folders: dict[str, str], sdc_every: int | None = None, final_checksum: bool = False) -> None:
        """Load chaoskit's bootstrap into the job's Python processes (its folder first on ``PYTHONPATH``), with the
        in-process channel's folder on each node (``folders``: node -> ``<state folder>/inproc``), the SDC probe's
        interval, and whether the ranks write their checksums at exit (a drill that flips a bit)."""
        boot = str(Path(__file__).resolve().parent.parent / "sdk" / "_boot")
        env = self.workload.env
        path = env["PYTHONPATH"] if "PYTHONPATH" in env else os.environ.get("PYTHONPATH")  # a policy-allowed one
        for node, folder in folders.items():
            env = {"PYTHONPATH": boot + (os.pathsep + path if path else ""), "CHAOSKIT_INPROC_DIR": folder}
            if sdc_every:
                env["CHAOSKIT_SDC_EVERY"] = str(int(sdc_every))
            if final_checksum:
                env["CHAOSKIT_SDC_FINAL"] = "1"
            self.node_env[node] = env

    def script_argv(self) -> list[str]:
        w = self.workload
        args = [
            "--steps", str(w.steps), "--step-time", f"{w.step_time:g}",
            "--checkpoint-every", str(w.checkpoint_every), "--checkpoint-dir", str(self.ckpt_dir),
            "--collective-timeout", f"{w.collective_timeout:g}",
        ]
        if w.step_compute:
            args += ["--step-compute", f"{w.step_compute:g}"]
        args += self.stack_run.job_args()
        if w.launch == "reference":
            return ["-m", "chaoskit.workloads.ddp_train", *args]
        if w.launch == "uninstrumented":
            return [str(Path(__file__).with_name("plain_train.py")), *args]
        script = w.command_script(self.base)
        if script is None:
            return list(w.command)
        if self.checked_script is not None:  # the checked bytes, run under the script's own name
            copy, real = self.checked_script
            return ["-m", "chaoskit.workloads.checked_script", str(copy), real, *w.command[1:]]
        return [str(script), *w.command[1:]]  # the plan of a job not started

    def check_script(self) -> None:
        """``launch: command``'s script opened once (:func:`~chaoskit.core.trusted.open_checked`; inside the site
        policy's ``script_roots`` when it has them, judged where the opened file really is) and its bytes written to
        a new file in the job's folder (``O_EXCL``, never through a link, mode 0644: chaoskit's, which the job's
        account reads and cannot change), which the workers run (:mod:`chaoskit.workloads.checked_script`): a link
        swapped after the check is never run. :class:`ScenarioError` when it is not there or is refused."""
        script = self.workload.command_script(self.base)
        if script is None or self.checked_script is not None:
            return
        policy = self.cluster.inventory.policy
        body, _, real = read_authors_file(script, roots=policy.script_roots if policy is not None else None,
                                          field="workload.command", what="script", limit=MAX_SCRIPT_BYTES,
                                          nothing="nothing was started")
        name = f"command-{Path(real).name}"
        dfd = open_folder(self.job_dir)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        finally:
            os.close(dfd)
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fd, 0o644)  # whatever the umask: the job's account reads it
            fh.write(body)
        self.checked_script = (self.job_dir / name, real)

    def agent_argv(self, node: str) -> list[str]:
        """The torchrun agent's command line as it runs on the node."""
        w = self.workload
        n = len(self.cluster.job_nodes)
        host = node == self.cluster.agent_nodes[0]
        world = ["--nnodes", f"{n}:{n}", "--rdzv-endpoint", f"{self.cluster.rdzv_host}:{self.port}",
                 "--rdzv-id", self.run_id, "--rdzv-conf", f"is_host={'true' if host else 'false'}"]
        world = self.stack_run.world(node) or world
        launcher = self.stack_run.launcher(plan=True)
        return [
            self.cluster.python or sys.executable, *launcher,
            "--nproc-per-node", str(w.nproc_per_node), "--rdzv-backend", "c10d", *world,
            "--max-restarts", str(w.max_restarts), "--monitor-interval", "0.1",
            # torchrun's own files (each attempt's error files) stay with the run, not in /tmp/torchelastic_*
            "--log-dir", str(self.job_dir / "torchelastic" / node),
            *self.cluster.agent_args(node),
            *self.script_argv(),
        ]

    def launch_argv(self, node: str) -> list[str]:
        """What this machine runs to start the node's agent (e.g. ``ip netns exec NS ...``, ``docker exec ...``)."""
        argv = self.agent_argv(node)
        if self.cluster.launch_wrap is not None:
            return self.cluster.launch_wrap(node, self._unset(argv), self.job_env(node, plan=True), self.job_dir)
        return [*self.cluster.launch_prefix(node), *argv]

    def unset_env(self) -> list[str]:
        """The variables ``workload.env`` unsets (``NAME: null``): none of the job's processes has them."""
        return [name for name, value in self.workload.env.items() if value is None]

    def _unset(self, argv: list[str]) -> list[str]:
        """``argv`` run by ``env -u NAME ...`` where a wrap starts it (docker exec): the unset variables are not
        passed to the wrap, but the node's own environment may hold them."""
        unset = self.unset_env()
        return ["env", *(f for name in unset for f in ("-u", name)), "--", *argv] if unset else argv

    def job_env(self, node: str, plan: bool = False) -> dict[str, str]:
        """The variables the job needs on ``node``, on top of the environment it inherits: chaoskit's defaults, then
        the scenario's ``workload.env`` (a ``null`` removes one), then what chaoskit owns (the scope mark, its channels,
        a recovery stack's variables, the job account's identity). ``plan``: as ``--dry-run`` shows it (nothing made)."""
        share, _ = self.stack.share_store()
        env = {
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            # whether the workers share torchrun's rendezvous store: per recovery stack (core/jobenv.py says why)
            **({} if share else {SHARE_STORE_VAR: "1"}),
            **torch_cache_env(self.job_dir),  # not /tmp/torchinductor_<user>; the cluster's or node's env may override
            **self.cluster.launch_env(node),
        }
        env.update(self.stack_run.env_defaults())
        for name, value in self.workload.env.items():  # the scenario's; none of the names below (validated)
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        env.update({
            LocalTransport.SCOPE_ENV: self.cluster.scope(node),
            "CHAOSKIT_NODE": node,
            "CHAOSKIT_CKPT_DIR": str(self.ckpt_dir),
            **self.node_env.get(node, {}),
        })
        if self.events_path is not None:
            env["CHAOSKIT_EVENTS"] = str(self.events_path)
        if self.account is not None:  # none of root's identity; its temporary files in its own folder, not /tmp
            env.update({**self.account.env(), "HOME": str(self.job_dir), "TMPDIR": str(self.job_dir / "tmp")})
        env.update(self.stack_run.env_owned(node, plan=plan))  # the recovery stack's own (its owned_env)
        return env

    def plan_part(self) -> dict[str, Any]:
        """``--dry-run``'s ``env``: what each agent (and so each worker) is given on top of chaoskit's own environment
        (``nodes``), what is unset (``unset``), where each of the scenario's comes from, and why chaoskit sets its own
        (``why``; the rendezvous store's choice for the recovery stack always)."""
        mine = self.workload.env
        _, store = self.stack.share_store()
        nodes = {node: self.job_env(node, plan=True) for node in self.cluster.agent_nodes}
        names = {name for env in nodes.values() for name in env}
        why = {name: "workload.env" for name, value in mine.items() if value is not None}
        why.update({name: text for name, text in WHY.items() if name in names and name not in mine})
        if SHARE_STORE_VAR in mine:
            said = "unset" if mine[SHARE_STORE_VAR] is None else f"{SHARE_STORE_VAR}={mine[SHARE_STORE_VAR]}"
            store = f"as workload.env says ({said}); chaoskit's own choice for recovery: {self.workload.recovery}: {store}"
        if "TMPDIR" in names and not self.stack_run.sets_tmpdir and self.account is not None:
            why["TMPDIR"] = "the job account's own folder, not /tmp"
        return {"env": {"nodes": nodes, "unset": self.unset_env(), "why": why, "rdzv_store": store}}

    def commands(self) -> dict[str, list[str]]:
        agents = {node: self.launch_argv(node) for node in self.cluster.agent_nodes}
        return {**self.stack_run.side_commands(), **agents}  # what the stack runs beside them first

    def start(self, nodes: list[str] | None = None) -> None:
        """Start the agents of ``nodes`` (default: the job's nodes; spares come with :meth:`start_spares`)."""
        if not torch_available() and self.launch_spec.needs_torch:
            raise InfraError(
                "PyTorch is not installed, so the reference training job cannot start",
                hint="pip install 'chaoskit[workload]' (torch==2.13.0, the CPU build)",
            )
        if self.account is None:  # else made with the account's folder, as that account's (the runner's job_owner)
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        self.check_script()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.beside += self.stack_run.start()
        for node in self.cluster.job_nodes if nodes is None else nodes:
            self.agents[node] = proc = self._popen(node, self.agent_argv(node))
            self._follow(node, proc, node)

    def start_beside(self, node: str, argv: list[str], log: str, only: str | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` on ``node`` in the job's scope, its output in ``logs/<log>.log`` and (with ``only``: the
        lines that contain it) to the probes: what a recovery stack runs beside the agents."""
        proc = self._popen(node, argv)
        self._follow(node, proc, log, only=only)
        return proc

    def _popen(self, node: str, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start ``argv`` on ``node`` in the job's scope (its processes are the job's: :meth:`stop` ends them)."""
        env = dict(os.environ)
        env.pop("CHAOSKIT_EVENTS", None)
        for name in self.unset_env():  # workload.env's NAME: null: not inherited either
            env.pop(name, None)
        if self.cluster.launch_wrap is None:  # the agent inherits this environment; elsewhere the wrap passes job_env
            env.update(self.job_env(node))
            argv = [*self.cluster.launch_prefix(node), *argv]
        else:
            argv = self.cluster.launch_wrap(node, self._unset(argv), self.job_env(node), self.job_dir)
        return subprocess.Popen(argv, env=env, cwd=self.job_dir, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)

    def _follow(self, node: str, proc: subprocess.Popen[bytes], log: str, only: str | None = None) -> None:
        t = threading.Thread(target=self._pump, args=(node, proc, log, only), daemon=True, name=f"chaoskit-log-{log}")
        t.start()
        self._readers.append(t)

    def start_spares(self) -> list[str]:
        """Start the spare nodes' agents once the world has formed: they wait in torchrun's
        redundancy list and join the next world when a node of this one is lost."""
        spares = [n for n in self.cluster.agent_nodes if n not in self.cluster.job_nodes and n not in self.agents]
        if spares:
            self.start(spares)
        return spares

    def _pump(self, node: str, proc: subprocess.Popen[bytes], name: str | None = None, only: str | None = None) -> None:
        """Write ``proc``'s output to ``logs/<name>.log`` and hand each line to the probes (with ``only``: the lines
        that contain it)."""
        assert proc.stdout is not None
        # Lines are cut at MAX_LINE_BYTES (the log keeps all of it), and nothing a line does to on_line stops
        # this thread: were it to stop, the job's stdout pipe would fill and the job would block on its next print.
        # the pipe is closed at its end here: a job object kept after its run would otherwise hold its agents' pipes
        with open(self.log_dir / f"{name or node}.log", "ab") as log, proc.stdout:
            for raw, lines in terminal_lines(proc.stdout):  # a progress bar's every redraw (\r) is a line
                ts = time.time()
                if raw:
                    log.write(raw)
                    log.flush()
                for line in lines:
                    text = line.decode(errors="replace")
                    if not text or only is not None and only not in text:
                        continue
                    try:
                        self.root_cause.feed(node, text)
                    except Exception as exc:  # noqa: BLE001 - as below
                        self.line_errors.append(f"{node}: {type(exc).__name__}: {exc}"[:500])
                    if self.on_line:
                        try:
                            self.on_line(node, text, ts)
                        except Exception as exc:  # noqa: BLE001 - one bad line must not stop the job's output
                            self.line_errors.append(f"{node}: {type(exc).__name__}: {exc}"[:500])

    def running(self) -> bool:
        """Whether the job goes on: some agent of the world (not a spare still waiting) is alive."""
        if not any(p.poll() is None for p in self.agents.values()):
            return False
        done = [p.poll() for n, p in self.agents.items() if n in self.cluster.job_nodes]
        # torchrun agents exit 0 once training finished; a spare that never joined keeps waiting.
        return not (done and all(code == 0 for code in done) and self._only_spares_left())

    def _only_spares_left(self) -> bool:
        return all(p.poll() is not None for n, p in self.agents.items() if n in self.cluster.job_nodes)

    def diagnosis(self) -> str | None:
        """Why the run may not see the job advance: the root cause its workers' output gives, if any."""
        return self.root_cause.summary()

    def returncodes(self) -> dict[str, int | None]:
        return {n: p.poll() for n, p in self.agents.items()}

    def stop(self, grace: float = 5.0) -> None:
        """Stop every agent and worker of the job (SIGTERM, then SIGKILL), on every node."""
        if self.cluster.job_transport is not None:
            scopes = [self.cluster.job_transport(node) for node in self.cluster.agent_nodes]
        else:
            scopes = [LocalTransport(node, self.cluster.scope(node)) for node in self.cluster.agent_nodes]
        for sig, wait in ((signal.SIGCONT, 0.0), (signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
            for scope in scopes:
                for p in _processes(scope):
                    try:
                        scope.signal(p.pid, sig, p.start_time)
                    except (ProcessLookupError, InfraError):
                        pass
            deadline = time.time() + wait
            while time.time() < deadline and any(_processes(s) for s in scopes):
                time.sleep(0.05)
        for proc in [*self.agents.values(), *self.beside]:
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        for t in self._readers:
            t.join(timeout=2)
        self.stack_run.cleanup()
