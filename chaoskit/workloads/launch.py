"""Start a training job under torchrun on the nodes of a local lab.

One torchrun agent per node (elastic, c10d rendezvous), its output piped back
line by line: each line is written to ``logs/<node>.log`` and handed to the
log probes with the moment it arrived.

With ``workload.recovery: torchft`` every node is one torchft replica group: its agent is a torchrun world
of its own (its own rendezvous and restarts; a shared world would restart the survivors when the dead
group's agent rejoins), and torchft's lighthouse runs beside the first node's agent.

With ``workload.recovery: nvrx`` each node's agent is NVIDIA's ``ft_launcher`` (nvidia-resiliency-ext, a
torchrun with a rank monitor per worker) in place of torchrun, with the timeouts of ``workload.nvrx``; its
sockets go in a private folder of the job's (``TMPDIR``), not under guessable names in ``/tmp``.

With ``workload.recovery: nvrx-inprocess`` the agents are torchrun's and the reference job runs its loop under
NVRx's ``inprocess.Wrapper`` (``--nvrx-inprocess``, :func:`chaoskit.workloads.plain_train.train_inprocess`), its own
store at a port picked here (``CHAOSKIT_NVRX_STORE_PORT``).
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
from chaoskit.core.jobenv import SHARE_STORE_VAR, WHY, share_rdzv_store
from chaoskit.core.lines import terminal_lines
from chaoskit.core.trusted import read_authors_file
from chaoskit.workloads.api import Job
from chaoskit.workloads.root_cause import RootCause

__all__ = ["TorchrunJob", "free_port", "job_dir", "checkpoint_dir", "torch_available", "NVRX_LAUNCHER"]

NVRX_LAUNCHER = ("-c", "import sys; from nvidia_resiliency_ext.fault_tolerance.launcher import main; sys.exit(main())")
"""``ft_launcher`` run by the job's Python (its console script's entry point), so that a node's own Python is used."""
_SOCKET_DIR_MAX = 60
"""The longest folder ``ft_launcher``'s Unix sockets may go in: it adds up to ~45 characters of its own
(``_ft_launcher<pid>_rmon<n>.socket``), and a socket path is at most 107 bytes."""

MAX_SCRIPT_BYTES = 16 << 20
"""The largest ``launch: command`` script chaoskit copies to run (a larger one is refused, never cut short)."""

LineSink = Callable[[str, str, float], None]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_dir(cluster: ClusterHandle, run_dir: Path, run_id: str, owned: bool = False) -> Path:
    """Where the job's own files go (checkpoints, the SDK's events): the cluster's shared folder
    when its nodes are not this machine, else the run directory. ``owned``: the job runs as another user than
    chaoskit (an author's batch script, submitted as its user): then the folder is the job's own, never the run
    folder, whose files are chaoskit's (beside it on this machine: ``RUN.job``)."""
    shared = cluster.shared_dir
    if shared is not None:
        return Path(shared) / run_id
    run_dir = Path(run_dir)
    return run_dir.with_name(run_dir.name + ".job") if owned else run_dir


def checkpoint_dir(cluster: ClusterHandle, run_dir: Path, run_id: str, owned: bool = False) -> Path:
    """The folder the job keeps its checkpoints in (``CHAOSKIT_CKPT_DIR``, ``--checkpoint-dir``)."""
    return job_dir(cluster, Path(run_dir).resolve(), run_id, owned) / "checkpoints"


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
        self.job_dir = job_dir(cluster, self.run_dir, run_id, owned=owned)
        self.ckpt_dir = checkpoint_dir(cluster, self.run_dir, run_id, owned=owned)
        self.log_dir = self.run_dir / "logs"
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self._readers: list[threading.Thread] = []
        self.port = free_port()
        self.torchft = workload.recovery == "torchft"
        self.lighthouse: subprocess.Popen[bytes] | None = None
        self.lighthouse_port = free_port() if self.torchft else None
        self.node_env: dict[str, dict[str, str]] = {}
        """Variables for one node's processes on top of :meth:`job_env`'s (the in-process channel: :meth:`use_inproc`)."""

        self.nvrx = workload.recovery == "nvrx"
        self._nvrx_tmp: Path | None = None
        self.nvrx_inprocess = workload.recovery == "nvrx-inprocess"
        self.inprocess_store_port = free_port() if self.nvrx_inprocess else None
        """The job's own store under NVRx's in-process restart (the Wrapper's is at MASTER_PORT)."""
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
        if self.nvrx_inprocess:
            args += w.nvrx_inprocess.job_args()
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
        if self.torchft:  # a replica group: a world of its own, its rendezvous on the node's own loopback
            world = ["--nnodes", "1:1", "--rdzv-endpoint", "127.0.0.1:0", "--rdzv-id", f"{self.run_id}-{node}",
                     "--rdzv-conf", "is_host=true"]
        launcher = ["-m", "torch.distributed.run"]
        if self.nvrx:  # ft_launcher takes torchrun's options and its own --ft-* ones
            config = self.nvrx_config_path()
            launcher = [*NVRX_LAUNCHER, *w.nvrx.launcher_args(str(config) if config is not None else None)]
        return [
            self.cluster.python or sys.executable, *launcher,
            "--nproc-per-node", str(w.nproc_per_node), "--rdzv-backend", "c10d", *world,
            "--max-restarts", str(w.max_restarts), "--monitor-interval", "0.1",
            # torchrun's own files (each attempt's error files) stay with the run, not in /tmp/torchelastic_*
            "--log-dir", str(self.job_dir / "torchelastic" / node),
            *self.cluster.agent_args(node),
            *self.script_argv(),
        ]

    def nvrx_config_path(self) -> Path | None:
        """ft_launcher's config file (``--ft-cfg-path``) when ``workload.nvrx`` switches a heartbeat timeout off
        (:meth:`~chaoskit.scenario.model.NvrxSettings.config_yaml`), else ``None``; written by :meth:`start`."""
        return self.job_dir / "nvrx-ft.yaml" if self.nvrx and self.workload.nvrx.config_yaml() else None

    def write_nvrx_config(self) -> str | None:
        """Write :meth:`nvrx_config_path`'s file (once) and return its path, or ``None`` when none is needed."""
        path = self.nvrx_config_path()
        if path is None or path.exists():
            return None if path is None else str(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        dfd = open_folder(self.job_dir)
        try:  # chaoskit's file (as check_script's copy): never through a link, the job's account reads it
            fd = os.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        finally:
            os.close(dfd)
        with os.fdopen(fd, "w") as fh:
            os.fchmod(fd, 0o644)
            fh.write(self.workload.nvrx.config_yaml())
        return str(path)

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
        share, _ = share_rdzv_store(self.workload.recovery)
        env = {
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            # whether the workers share torchrun's rendezvous store: per recovery stack (core/jobenv.py says why)
            **({} if share else {SHARE_STORE_VAR: "1"}),
            **torch_cache_env(self.job_dir),  # not /tmp/torchinductor_<user>; the cluster's or node's env may override
            **self.cluster.launch_env(node),
        }
        if self.nvrx_inprocess:
            # the Wrapper's store waits warn from c10d's C++ twice a second per rank ("waitForInput ... timed out
            # after 500ms"), every one of them expected
            env["TORCH_CPP_LOG_LEVEL"] = "ERROR"
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
        if self.nvrx_inprocess:
            env["CHAOSKIT_NVRX_STORE_PORT"] = str(self.inprocess_store_port)
        if self.account is not None:  # none of root's identity; its temporary files in its own folder, not /tmp
            env.update({**self.account.env(), "HOME": str(self.job_dir), "TMPDIR": str(self.job_dir / "tmp")})
        if self.nvrx:
            # ft_launcher makes its sockets in tempfile.gettempdir() under names from its pid (guessable in /tmp)
            env["TMPDIR"] = "<a private folder of the job's, made at start>" if plan else str(self.nvrx_socket_dir())
        if self.torchft:  # what torchft's Manager reads (torchft/manager.py) to join the lighthouse's quorum
            env.update({"REPLICA_GROUP_ID": str(self.cluster.job_nodes.index(node)) if node in self.cluster.job_nodes
                        else str(self.cluster.agent_nodes.index(node)),
                        "NUM_REPLICA_GROUPS": str(len(self.cluster.job_nodes)),
                        "TORCHFT_LIGHTHOUSE": f"http://{self.cluster.rdzv_host}:{self.lighthouse_port}"})
        return env

    def plan_part(self) -> dict[str, Any]:
        """``--dry-run``'s ``env``: what each agent (and so each worker) is given on top of chaoskit's own environment
        (``nodes``), what is unset (``unset``), where each of the scenario's comes from, and why chaoskit sets its own
        (``why``; the rendezvous store's choice for the recovery stack always)."""
        mine = self.workload.env
        _, store = share_rdzv_store(self.workload.recovery)
        nodes = {node: self.job_env(node, plan=True) for node in self.cluster.agent_nodes}
        names = {name for env in nodes.values() for name in env}
        why = {name: "workload.env" for name, value in mine.items() if value is not None}
        why.update({name: text for name, text in WHY.items() if name in names and name not in mine})
        if SHARE_STORE_VAR in mine:
            said = "unset" if mine[SHARE_STORE_VAR] is None else f"{SHARE_STORE_VAR}={mine[SHARE_STORE_VAR]}"
            store = f"as workload.env says ({said}); chaoskit's own choice for recovery: {self.workload.recovery}: {store}"
        if "TMPDIR" in names and not self.nvrx and self.account is not None:
            why["TMPDIR"] = "the job account's own folder, not /tmp"
        return {"env": {"nodes": nodes, "unset": self.unset_env(), "why": why, "rdzv_store": store}}

    def nvrx_socket_dir(self) -> Path:
        """The private folder (0700) ``ft_launcher`` keeps its sockets in: the job's own ``nvrx/`` when its path is
        short enough for a Unix socket, else a fresh one from :func:`tempfile.mkdtemp` (a random name)."""
        if self._nvrx_tmp is None:
            import tempfile

            mine = self.job_dir / "nvrx"
            if self.account is not None:  # the account's own folder (made with it), or a fresh random one given to it
                mine = self.job_dir / "tmp"
                if len(str(mine)) > _SOCKET_DIR_MAX:
                    mine = Path(tempfile.mkdtemp(prefix="chaoskit-nvrx-"))
                    os.chown(mine, self.account.uid, self.account.gid, follow_symlinks=False)
                self._nvrx_tmp = mine
            elif len(str(mine)) <= _SOCKET_DIR_MAX:
                mine.mkdir(mode=0o700, parents=True, exist_ok=True)
                if mine.is_symlink() or not mine.is_dir() or mine.stat().st_uid != os.geteuid():
                    raise InfraError(f"{mine} is not a folder of this user's: refusing to put ft_launcher's sockets there")
                mine.chmod(0o700)
                self._nvrx_tmp = mine
            else:
                self._nvrx_tmp = Path(tempfile.mkdtemp(prefix="chaoskit-nvrx-"))
        return self._nvrx_tmp

    def lighthouse_argv(self) -> list[str]:
        """torchft's lighthouse (the ``torchft_lighthouse`` console script beside the job's Python): a quorum as
        soon as one group is there, stragglers awaited 1 s, a group silent 5 s is dead (torchft's default)."""
        script = Path(self.cluster.python or sys.executable).with_name("torchft_lighthouse")
        return [str(script), "--min_replicas", "1", "--join_timeout_ms", "1000", "--quorum_tick_ms", "100",
                "--bind", f"{self.cluster.rdzv_host}:{self.lighthouse_port}"]

    def commands(self) -> dict[str, list[str]]:
        agents = {node: self.launch_argv(node) for node in self.cluster.agent_nodes}
        if self.torchft:  # the lighthouse, beside the first node's agent
            return {f"{self.cluster.agent_nodes[0]} (torchft lighthouse)": self.lighthouse_argv(), **agents}
        return agents

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
        self.write_nvrx_config()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.torchft and self.lighthouse is None:
            first = self.cluster.agent_nodes[0]
            self.lighthouse = self._popen(first, self.lighthouse_argv())
            # its log has a few lines a step per group; only its quorum changes go to the probes (the torchft preset)
            self._follow(first, self.lighthouse, "lighthouse", only="Detected quorum change")
        for node in self.cluster.job_nodes if nodes is None else nodes:
            self.agents[node] = proc = self._popen(node, self.agent_argv(node))
            self._follow(node, proc, node)

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
        with open(self.log_dir / f"{name or node}.log", "ab") as log:
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
        for proc in [*self.agents.values(), *([self.lighthouse] if self.lighthouse is not None else [])]:
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        for t in self._readers:
            t.join(timeout=2)
        if self._nvrx_tmp is not None and self._nvrx_tmp.name.startswith("chaoskit-nvrx-"):
            import shutil

            shutil.rmtree(self._nvrx_tmp, ignore_errors=True)
