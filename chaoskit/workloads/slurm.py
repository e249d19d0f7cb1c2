"""Jobs that Slurm starts: ``sbatch`` of a generated batch script, or of the user's own.

``launch: reference`` / ``uninstrumented`` on a cluster with a scheduler: chaoskit
writes ``slurm/job.sbatch`` into the run directory (``--nodes N``, one task per node,
``--requeue``) and ``slurm/agent.sh``, which ``srun`` runs on every node of the
allocation: one torchrun agent per node, rendezvous (c10d) on the allocation's first
node, at the address Slurm knows it by (``NodeAddr``). A requeued job runs the
script again on its new allocation and resumes from the checkpoints.

``launch: sbatch``: the user's script, submitted as it is (``sbatch --chdir RUN_DIR
SCRIPT``); the environment tells it where the SDK writes (``CHAOSKIT_EVENTS``) and
where checkpoints go (``CHAOSKIT_CKPT_DIR``). Either way the job id and its output
files go into ``result.json`` (``slurm``), and the output is read through the log
probes as it is written.

As root, the generated batch script is submitted as the cluster's job account when it has one (a Slurm lab's
lab account, :attr:`~chaoskit.backends.api.ClusterHandle.job_account`), never as root: the script goes to sbatch's
standard input, the agent script is inside it (``srun bash -c``), and the job's output and logs are written in
the account's own folder (``RUN.job/logs``), copied into the run folder when the job has ended.
"""

from __future__ import annotations

import os
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, ClassVar

from chaoskit.backends.api import ClusterHandle
from chaoskit.cluster.slurm import JOB_DONE_STATES, SlurmAccess, SubmitRefused, SubmitUser, node_list, submit_user
from chaoskit.cluster.transports.api import JobScope
from chaoskit.core.errors import InfraError, ScenarioError
from chaoskit.core.accounts import JOB_GROUP, Account, unreachable_by
from chaoskit.core.files import copy_regular, torch_cache_env
from chaoskit.core.trusted import read_authors_file
from chaoskit.observe.probes import FileLogProbe
from chaoskit.workloads.api import Job, job_folder
from chaoskit.workloads.launch import TorchrunJob, free_port

__all__ = ["SlurmJob", "job_owner", "batch_script_path", "names_job"]

LineSink = Callable[[str, str, float], None]
POLL_S = 0.5
STOP_WAIT_S = 20.0
MAX_BATCH_SCRIPT_BYTES = 4 << 20
"""The largest batch script submitted (Slurm's own default limit, ``max_script_size``, is 4 MB)."""


def batch_script_path(workload: Any, base: Path) -> Path:
    """``workload.script`` as a path: relative ones from ``base`` (the scenario's folder)."""
    path = Path(workload.script).expanduser()
    return path if path.is_absolute() else (Path(base) / path).resolve()


def job_owner(workload: Any, base: Path) -> SubmitUser | None:
    """Whom an author's batch script (``launch: sbatch``) is submitted as, when not as chaoskit itself
    (:func:`~chaoskit.cluster.slurm.submit_user`); ``None`` for every other launch (chaoskit's own batch script
    of the reference job runs as chaoskit). :class:`ScenarioError` where it may not be submitted."""
    if workload.launch != "sbatch":
        return None
    try:
        return submit_user(workload.user, batch_script_path(workload, base))
    except SubmitRefused as exc:
        raise ScenarioError(f"workload.{exc.field}: {exc.message}; nothing was submitted") from None


class SlurmJob(Job):
    """The runner's :class:`~chaoskit.workloads.api.Job` for a job that Slurm runs."""

    wait_poll_s: ClassVar[float] = 0.2

    def __init__(self, cluster: ClusterHandle, workload: Any, run_dir: Path, run_id: str,
                 events_path: Path | None = None, on_line: LineSink | None = None, *, base: Path | None = None) -> None:
        """``base``: the folder a relative ``workload.script`` is taken from (the scenario's)."""
        assert cluster.scheduler is not None
        self.cluster, self.workload, self.run_id = cluster, workload, run_id
        self.run_dir = Path(run_dir).resolve()
        self.base = Path(base) if base is not None else Path.cwd()
        self.access: SlurmAccess = cluster.scheduler
        self.events_path, self.on_line = events_path, on_line
        self.owner: SubmitUser | None = (job_owner(workload, self.base) if not self.generated
                                         else _submit_user(cluster.job_account))
        """The user an author's batch script, or the generated one, is submitted as (chaoskit runs as root: the
        script's user; the cluster's job account), or ``None``: as chaoskit."""
        self.job_dir = job_folder(cluster, self.run_dir, run_id, owned=self.owner is not None)
        self.ckpt_dir = self.job_dir / "checkpoints"
        self.slurm_dir = self.run_dir / "slurm"
        self.log_dir = self.run_dir / "logs"
        """Where the job's output and agents' logs are read from: the run folder's, or for a generated job of an
        account the account's own folder's (copied into the run folder's at :meth:`stop`)."""
        self.run_logs = self.log_dir
        if self.generated and self.owner is not None:
            self.log_dir = self.job_dir / "logs"
        self.port = free_port()
        self.job_id: str | None = None
        self.submitted_at: float | None = None
        self.fields: dict[str, str] = {}
        self.outputs: list[str] = []
        self.followers: list[FileLogProbe] = []
        self._checked = 0.0
        self._lock = threading.Lock()

    # -- what is submitted ------------------------------------------------------------------

    @classmethod
    def runs_as(cls, workload: Any, base: Path) -> SubmitUser | None:
        return job_owner(workload, base)

    @property
    def generated(self) -> bool:
        return self.workload.launch != "sbatch"

    def script_path(self) -> Path:
        if self.generated:
            return self.slurm_dir / "job.sbatch"
        return batch_script_path(self.workload, self.base)

    def sbatch_args(self, text: str | None = None) -> list[str]:
        """``sbatch``'s arguments: the script is never edited; where it runs (and, generated, its output) is said here.
        ``text``: the author's script as it was checked, which goes to sbatch's standard input (no script argument),
        named as sbatch names a script's job (its file's name) unless its ``#SBATCH`` lines name it."""
        args = ["--parsable", f"--chdir={self.job_dir}"]
        if self.generated:
            args.append(f"--output={self.log_dir / 'slurm-%j.out'}")
        if text is None:
            return [*args, str(self.script_path())]
        # named as sbatch names a script's job: the file name as given (never a name read again through a link)
        name = Path(self.workload.script).name if not self.generated else self.script_path().name
        return [*args, *([] if names_job(text) else [f"--job-name={name}"])]

    def commands(self) -> dict[str, list[str]]:
        """What ``--dry-run`` shows: the submission, on the controller."""
        argv = self.access.argv("sbatch", *self.sbatch_args())
        if self.owner is not None:  # what runuser would say: the submission is the script's user's
            argv = ["runuser", "-u", self.owner.name, "--", *argv]
        return {"controller": argv}

    def describe(self) -> str:
        if self.generated:
            n = len(self.cluster.job_nodes)
            return (f"a generated batch script (sbatch --nodes {n} --requeue; srun starts one torchrun agent per node, "
                    "rendezvous on the allocation's first node)")
        who = f" as {self.owner.name}" if self.owner is not None else ""
        return f"the batch script {self.workload.script}, submitted unmodified{who}"

    def plan_part(self) -> dict[str, Any]:
        return {"submit": self.describe()}

    def batch_script(self, agent: str | None = None) -> str:
        """The generated batch script; ``agent``: the agent script's text, put inside it for a job of an account."""
        w = self.workload
        n = len(self.cluster.job_nodes)
        partition = self.cluster.scheduler_options.get("partition")
        lines = [
            "#!/bin/bash",
            f"# Generated by chaoskit for run {self.run_id}: the {w.launch} job, one torchrun agent per node.",
            f"#SBATCH --job-name=chaoskit-{self.run_id[-40:]}",
            f"#SBATCH --nodes={n}",
            "#SBATCH --ntasks-per-node=1",
            "#SBATCH --requeue",
            "#SBATCH --open-mode=append",
            *([f"#SBATCH --partition={partition}"] if partition else []),
            "set -u",
            'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            # The first node's address as Slurm knows it: node names need not resolve (a lab's do not).
            "CHAOSKIT_RDZV_HOST=$(scontrol -o show node \"$head\" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')",
            "export CHAOSKIT_RDZV_HOST",
            'echo "chaoskit: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST, '
            'rendezvous on $head ($CHAOSKIT_RDZV_HOST)"',
            # Each agent writes logs/<node>.log itself: srun's %N is the machine's host name, not the Slurm node's.
            f"srun --kill-on-bad-exit=0 --output=none bash {self._agent_arg(agent)}",
        ]
        return "\n".join(lines) + "\n"

    def _agent_arg(self, agent: str | None) -> str:
        """What ``srun bash`` runs on each node: ``slurm/agent.sh`` in the run folder, or for a job of an account
        (which cannot read root's run folder) the agent script itself (``-c``; ``agent``: its text)."""
        if self.owner is None or agent is None:
            return shlex.quote(str(self.slurm_dir / "agent.sh"))
        return "-c " + shlex.quote(agent)

    def agent_script(self) -> str:
        w = self.workload
        n = len(self.cluster.job_nodes)
        agent = TorchrunJob(self.cluster, w, self.run_dir, self.run_id, self.events_path, base=self.base)
        agent.check_script()  # launch: command's script as checked, a copy in the job's folder (never by its path again)
        script = agent.script_argv()
        iface = self.cluster.scheduler_options.get("local_addr_interface")
        python = self.cluster.python or sys.executable
        launcher = agent.stack_run.launcher()  # the recovery stack's (ft_launcher in place of torchrun), files written
        private_tmp = agent.stack_run.sets_tmpdir
        argv = [
            python, *launcher, "--nnodes", f"{n}:{n}", "--nproc-per-node", str(w.nproc_per_node),
            "--rdzv-backend", "c10d", "--rdzv-id", self.run_id, "--max-restarts", str(w.max_restarts),
            "--monitor-interval", "0.1",
        ]
        lines = [
            "#!/bin/bash",
            "# One torchrun agent on this node of the allocation (srun runs it once per node).",
            "set -u",
            "export CHAOSKIT_NODE=$SLURMD_NODENAME",
            f'exec >>{shlex.quote(str(self.log_dir))}/"$SLURMD_NODENAME.log" 2>&1',
            'echo "chaoskit: agent on $SLURMD_NODENAME, job $SLURM_JOB_ID restart ${SLURM_RESTART_COUNT:-0}"',
            'is_host=false; [ "$SLURM_NODEID" = 0 ] && is_host=true',
        ]
        if private_tmp:
            # A private folder per node for the launcher's Unix sockets (ft_launcher's), not /tmp's guessable names. The launcher runs
            # as this script's child (not exec'd) so that the folder is removed when it ends; a SIGTERM from Slurm
            # (scancel, requeue, the step's end) is passed on and waited for. Only a SIGKILL can leave the folder.
            lines += [f'TMPDIR=$(mktemp -d -t chaoskit-{agent.stack.name}-XXXXXXXX) || exit 1; export TMPDIR',
                      """trap 'rm -rf -- "$TMPDIR"' EXIT""",
                      """trap 'kill -TERM "$launcher" 2>/dev/null' TERM INT"""]
        extra = ""
        if iface:
            lines.append(f"local_addr=$(ip -o -4 addr show dev {shlex.quote(iface)} | awk '{{print $4}}' | cut -d/ -f1)")
            extra = ' --local-addr "$local_addr"'
        launch = (f'{shlex.join(argv)} --rdzv-endpoint "$CHAOSKIT_RDZV_HOST:{self.port}" '
                  f'--rdzv-conf "is_host=$is_host" --log-dir {shlex.quote(str(self.log_dir))}/torchelastic/"$SLURMD_NODENAME"'
                  f'{extra} {shlex.join(script)}')
        if private_tmp:
            lines += [f"{launch} &", "launcher=$!",
                      # wait returns early when a trapped signal arrives: wait again until the launcher has ended
                      'while :; do wait "$launcher"; rc=$?; kill -0 "$launcher" 2>/dev/null || break; done',
                      'exit "$rc"']
        else:
            lines.append(f"exec {launch}")
        return "\n".join(lines) + "\n"

    def job_env(self) -> dict[str, str]:
        node = self.cluster.job_nodes[0]
        env = {
            **self.access.env(),
            "CHAOSKIT_CKPT_DIR": str(self.ckpt_dir),
            "CHAOSKIT_RUN_ID": self.run_id,
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            **torch_cache_env(self.job_dir),
            **self.cluster.launch_env(node),
        }
        for name, value in self.workload.env.items():  # the scenario's (never one of chaoskit's: validated)
            if value is not None:
                env[name] = value
        if self.events_path is not None:
            env["CHAOSKIT_EVENTS"] = str(self.events_path)
        if self.generated and self.owner is not None:  # none of root's: the account's own folder
            env.update({"HOME": str(self.job_dir), "TMPDIR": str(self.job_dir / "tmp")})
        return env

    # -- running ----------------------------------------------------------------------------

    def start(self, nodes: list[str] | None = None) -> None:
        """Submit the job (nothing else: Slurm starts it when it allocates the nodes)."""
        if self.owner is None:  # else the job's own folder, made for its user before the run's probes started
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        self.run_logs.mkdir(parents=True, exist_ok=True)
        script = self.script_path()
        text = None
        if self.generated:
            self.slurm_dir.mkdir(parents=True, exist_ok=True)
            agent = self.agent_script()
            (self.slurm_dir / "agent.sh").write_text(agent)
            script.write_text(self.batch_script(agent))
            if self.owner is not None:  # the account reads neither: the script on stdin, its logs in its folder
                text = script.read_text()
                _own_folder(self.job_dir, "logs", self.owner)
        else:
            text = self.checked_text()
        # the author's script as its own user, with none of chaoskit's environment; chaoskit's own script as chaoskit
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")} if self.owner is None else {}
        job_env = self.job_env()
        for name, value in self.workload.env.items():  # NAME: null: sbatch exports the rest of its environment
            if value is None:
                env.pop(name, None)
                job_env.pop(name, None)
        self._check_reaches_conf()
        res = self.access.run("sbatch", *self.sbatch_args(text), check=False, env={**env, **job_env}, timeout=30,
                              as_user=self.owner, input=text)
        if res.returncode != 0:
            raise InfraError(f"sbatch refused the job (exit {res.returncode}): {(res.stderr or res.stdout).strip()}",
                             hint=f"the script: {script}")
        self.job_id = res.stdout.strip().split(";")[0]
        self.cluster.scheduler_jobs.add(self.job_id)
        if self.job_id.isdigit():  # the job's processes carry SLURM_JOB_ID and run as its submitter: nothing else
            # on the nodes is in scope (another user's process that sets SLURM_JOB_ID to ours is a look-alike)
            uid = self.owner.uid if self.owner is not None else os.geteuid()
            self.cluster.scope_job(JobScope(uid=uid, slurm_job=self.job_id))
        self.submitted_at = time.time()
        self.refresh()
        if self.generated:
            for node in self.cluster.inventory.names():
                self._follow(node, self.log_dir / f"{node}.log")
        self._follow_outputs()

    def _check_reaches_conf(self) -> None:
        """:class:`InfraError` (nothing submitted) when the user the script is submitted as cannot read the cluster's
        ``slurm.conf`` (a Slurm lab's is the lab accounts' group's only), rather than sbatch's own retries and error."""
        owner = self.owner
        if owner is None or not self.access.conf:
            return
        problem = unreachable_by(Account(owner.name, owner.uid, owner.gid, owner.home, tuple(owner.groups)),
                                 [Path(self.access.conf)])
        if problem:
            raise InfraError(f"{owner.name} cannot submit to this cluster: {problem}; nothing was submitted",
                             hint=f"on a Slurm lab, let them submit: usermod --append --groups {JOB_GROUP} {owner.name}")

    def checked_text(self) -> str:
        """The author's batch script, read once through the descriptor that was checked (issue 48, finding 7): inside
        the site policy's ``script_roots`` when it has them (where the opened file really is), the file of the user it
        is submitted as when that user was taken from its owner (``self.owner``, for whom the job's folder was made),
        and one that user could read. :class:`ScenarioError` otherwise; nothing was submitted."""
        script = self.script_path()
        policy = self.cluster.inventory.policy
        data, st, _ = read_authors_file(script, roots=policy.script_roots if policy is not None else None,
                                        field="workload.script", what="batch script", limit=MAX_BATCH_SCRIPT_BYTES,
                                        nothing="nothing was submitted")
        owner = self.owner
        if owner is not None:
            if self.workload.user is None and st.st_uid != owner.uid:
                raise ScenarioError(f"workload.script: {script} is now a file of uid {st.st_uid}, not of {owner.name} "
                                    f"(uid {owner.uid}), whom it was to be submitted as (its owner when the run began); "
                                    "nothing was submitted")
            if not _readable_by(st, owner):
                raise ScenarioError(f"workload.script: {owner.name} cannot read {script} (uid {st.st_uid}, gid "
                                    f"{st.st_gid}, mode {st.st_mode & 0o777:04o}); chaoskit submits as a user only a "
                                    "script that user could read; nothing was submitted")
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise ScenarioError(f"workload.script: {script} is not UTF-8 text; nothing was submitted") from None

    def start_spares(self) -> list[str]:
        """Nothing: Slurm's idle nodes are the spares; a requeued job is allocated one."""
        return []

    def refresh(self) -> dict[str, str]:
        fields = self.access.job(self.job_id) if self.job_id else None
        with self._lock:
            self._checked = time.monotonic()
            if fields is not None:
                self.fields = fields
            return dict(self.fields)

    def _follow_outputs(self) -> None:
        paths = self.access.own_job_outputs(self.job_id) if self.job_id else {}
        for key in ("StdOut", "StdErr"):
            path = paths.get(key)
            if path and path not in self.outputs and path != "/dev/null":
                self.outputs.append(path)
                host = self.fields.get("BatchHost")
                self._follow(host if host in self.cluster.inventory else self.cluster.job_nodes[0], Path(path))

    def _follow(self, node: str, path: Path) -> None:
        if self.on_line is None:
            return
        follower = FileLogProbe(_Sink(self.on_line), node, path, interval=0.05)  # type: ignore[arg-type]
        follower.start()
        self.followers.append(follower)

    def state(self) -> str:
        if time.monotonic() - self._checked >= POLL_S:
            try:
                self.refresh()
            except InfraError:
                pass
        return self.fields.get("JobState", "UNKNOWN") if self.fields else "UNKNOWN"

    def running(self) -> bool:
        """Until Slurm says the job is done (a NODE_FAIL of a ``--requeue`` job is not: it comes back)."""
        if self.job_id is None:
            return False
        return self.state() not in JOB_DONE_STATES

    def diagnosis(self) -> str | None:
        if self.job_id is None:
            return "the job was not submitted"
        f = self.refresh()
        state, reason = f.get("JobState", "?"), f.get("Reason", "?")
        nodes = f.get("NodeList") or "no nodes"
        return f"Slurm job {self.job_id} is {state} (reason {reason}) on {nodes}; its output: {', '.join(self.outputs) or 'none yet'}"

    def info(self) -> dict[str, Any]:
        f = self.fields
        return {
            "job_id": self.job_id, "script": str(self.script_path()), "generated": self.generated,
            "user": self.owner.name if self.owner is not None else None,
            "submitted_at": self.submitted_at, "state": f.get("JobState"), "restarts": int(f.get("Restarts") or 0),
            "nodes": node_list(f.get("NodeList")), "outputs": self.outputs,
            "node_logs": sorted(str(p) for p in self.log_dir.glob("*.log")) if self.generated else [],
        }

    @property
    def line_errors(self) -> list[str]:
        """Output files that were refused (a FIFO, a device, a link swapped in), for the run's notes."""
        return [e for f in self.followers for e in f.errors]

    def result_part(self) -> dict[str, Any]:
        return {"slurm": self.info()}

    def returncodes(self) -> dict[str, int | None]:
        code = self.fields.get("ExitCode", "")
        return {"job": int(code.split(":")[0]) if code[:1].isdigit() else None}

    def stop(self, grace: float = 5.0) -> None:
        """Cancel the job if it still runs and wait until Slurm has ended it (its steps killed on every node)."""
        if self.job_id is not None:
            if self.state() not in JOB_DONE_STATES:
                self.access.run("scancel", self.job_id, check=False)
            end = time.time() + STOP_WAIT_S
            while time.time() < end:
                f = self.refresh()
                if f.get("JobState") in JOB_DONE_STATES and not self.access.completing(self.job_id):
                    break
                time.sleep(0.2)
        for follower in self.followers:
            follower.stop()
        if self.log_dir != self.run_logs:  # the account's logs, as data: never through a link, never a FIFO
            for name in sorted(os.listdir(self.log_dir)) if self.log_dir.is_dir() else []:
                if name.endswith((".log", ".out")) and not (self.run_logs / name).exists():
                    copy_regular(self.log_dir / name, self.run_logs / name)
            self.outputs = [str(self.run_logs / Path(o).name) if Path(o).parent == self.log_dir else o
                            for o in self.outputs]


def _submit_user(account: Account | None) -> SubmitUser | None:
    """The cluster's job account as whom a generated batch script is submitted (``None``: as chaoskit)."""
    if account is None:
        return None
    return SubmitUser(account.name, account.uid, account.gid, account.home, (account.gid, *account.groups))


def _own_folder(parent: Path, name: str, user: SubmitUser) -> None:
    """``parent/name`` made for ``user`` (``mkdir`` from ``parent``'s descriptor, which fails on anything that
    is there, a link too; then given to them)."""
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.mkdir(name, 0o700, dir_fd=fd)
        os.chown(name, user.uid, user.gid, dir_fd=fd, follow_symlinks=False)
    finally:
        os.close(fd)


def names_job(text: str) -> bool:
    """Whether a batch script's ``#SBATCH`` lines (those sbatch reads: before its first command) may name its job
    (``-J``, ``--job-name``, or an abbreviation of it): a name given on sbatch's command line would override it."""
    for i, line in enumerate(text.splitlines()):
        if i == 0 and line.startswith("#!"):
            continue
        if line.startswith("#SBATCH"):
            try:
                words = shlex.split(line[len("#SBATCH"):], comments=True)
            except ValueError:
                return True  # sbatch reads it some way: let its own words stand
            if any(w.startswith("-J") or w.startswith("--job") for w in words):
                return True
        elif line.strip() and not line.lstrip().startswith("#"):
            return False
    return False


def _readable_by(st: os.stat_result, user: SubmitUser) -> bool:
    if st.st_uid == user.uid:
        return bool(st.st_mode & 0o400)
    if st.st_gid == user.gid or st.st_gid in user.groups:
        return bool(st.st_mode & 0o040)
    return bool(st.st_mode & 0o004)


class _Sink:
    """A :class:`FileLogProbe`'s consumer that hands each line on to the runner's line sink, with the time it was read."""

    def __init__(self, on_line: LineSink) -> None:
        self.on_line = on_line

    def feed(self, node: str, line: str, ts: float | None = None) -> None:
        self.on_line(node, line, time.time() if ts is None else ts)
