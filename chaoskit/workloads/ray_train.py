"""The second reference workload: a Ray Train ``TorchTrainer`` on the Ray lab.

One Ray Train worker per job node (``placement_strategy=SPREAD``), DDP over
gloo (NCCL with CUDA), a checkpoint every ``checkpoint_every`` steps reported
through ``ray.train.report``, and ``FailureConfig(max_failures=max_restarts)``.
When a worker or its node dies, Ray Train tears the worker group down and
starts a new one from the latest reported checkpoint: the new group's
``worker.start`` events are the reallocation, its checkpoint restore the load.

The driver (``python -m chaoskit.workloads.ray_train``) runs on the controller
machine in a scope of its own (``<lab>.ray-driver``), so powering a node off
never kills it; the workers run in the raylets' worker processes and so carry
their node's ``CHAOSKIT_SCOPE``. They write SDK events like the torchrun job.

The driver joins with the cluster's token (``ray_token_file`` in the cluster's details, named to it by
``RAY_AUTH_TOKEN_PATH``) and runs as the account the lab's nodes run as (the cluster's ``job_account``), in the
job's own folder, where the workers keep their checkpoints too.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from chaoskit.cluster.transports.local import LocalTransport
from chaoskit.cluster.transports.ray import ray_auth_env
from chaoskit.core.errors import InfraError
from chaoskit.core.files import torch_cache_env
from chaoskit.core.lines import bounded_lines
from chaoskit.sdk import probe
from chaoskit.workloads.api import Job, job_folder

__all__ = ["RayTrainJob", "train_loop", "DRIVER_SCOPE"]

DRIVER_SCOPE = "ray-driver"


def train_loop(config: dict[str, Any]) -> None:
    """Runs in every Ray Train worker."""
    import tempfile

    import ray.train
    import torch

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    os.environ["RANK"] = str(rank)
    scope = os.environ.get(LocalTransport.SCOPE_ENV, "")
    os.environ["CHAOSKIT_NODE"] = scope.rsplit(".", 1)[-1] if scope else os.uname().nodename
    if config.get("events"):
        os.environ["CHAOSKIT_EVENTS"] = config["events"]
    probe.worker_start(world_size=world, runtime="ray-train")
    probe.rendezvous_done(world)  # TorchTrainer formed the process group before calling us

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            path = os.path.join(folder, "state.pt")
            with probe.checkpoint_load(path=path) as info:
                state = torch.load(path, weights_only=True)
                model.load_state_dict(state["model"])
                opt.load_state_dict(state["opt"])
                start = int(state["step"])
                info["step"] = start
                info["bytes"] = os.path.getsize(path)
    ddp = ray.train.torch.prepare_model(model)
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(start + 1, config["steps"] + 1):
        t0 = time.monotonic()
        x = torch.randn(16, 32, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        try:
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()  # the gradient all-reduce: where a dead peer is noticed
        except Exception as exc:  # noqa: BLE001 - report it, then let Ray Train restart the group
            text = str(exc).splitlines()[0] if str(exc) else ""
            probe.detect("collective error", error=f"{type(exc).__name__}: {text}"[:300])
            raise
        opt.step()
        rest = config["step_time"] - (time.monotonic() - t0)
        if rest > 0:
            time.sleep(rest)
        probe.step(step, loss=round(loss.item(), 5))
        if step % config["checkpoint_every"] == 0 or step == config["steps"]:
            with tempfile.TemporaryDirectory(dir=_staging(config.get("storage"))) as tmp:
                reported = None
                if rank == 0:
                    with probe.checkpoint_save(step) as info:
                        path = os.path.join(tmp, "state.pt")
                        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, path)
                        info["bytes"] = os.path.getsize(path)
                    reported = ray.train.Checkpoint.from_directory(tmp)
                ray.train.report({"step": step}, checkpoint=reported)


def _staging(storage: str | None) -> str | None:
    """Where a checkpoint is written before Ray Train copies it into storage: a folder of the run's own local
    storage (a worker killed mid-save leaves its half there, with the run, not in /tmp); the system's temporary
    folder when storage is remote (a URI)."""
    if not storage or "://" in storage or not os.path.isabs(storage):
        return None
    folder = os.path.join(storage, ".staging")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return folder


def main(argv: list[str] | None = None) -> int:
    """The driver: ``python -m chaoskit.workloads.ray_train --address HOST:PORT ...``."""
    p = argparse.ArgumentParser(prog="python -m chaoskit.workloads.ray_train")
    p.add_argument("--address", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument("--collective-timeout", type=float, default=30.0)
    p.add_argument("--max-failures", type=int, default=3)
    p.add_argument("--storage", required=True)
    p.add_argument("--events", default=None)
    args = p.parse_args(argv)

    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(address=args.address, log_to_driver=False, logging_level="ERROR")
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"steps": args.steps, "step_time": args.step_time,
                           "checkpoint_every": args.checkpoint_every, "events": args.events, "storage": args.storage},
        torch_config=TorchConfig(backend="gloo", timeout_s=int(args.collective_timeout)),
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False, resources_per_worker={"CPU": 1},
                                     placement_strategy="SPREAD"),
        run_config=RunConfig(name=args.name, storage_path=args.storage,
                             failure_config=FailureConfig(max_failures=args.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)),
    )
    result = trainer.fit()
    print(f"training finished: {result.metrics}", flush=True)
    return 0


LineSink = Callable[[str, str, float], None]


class RayTrainJob(Job):
    """The Ray Train job as the runner drives it: a driver on this machine, its workers in the raylets."""

    def __init__(self, cluster, workload, run_dir: Path, run_id: str, events_path: Path | None,
                 on_line: LineSink | None = None, *, base: Path | None = None) -> None:
        """``base``: unused (the driver is chaoskit's own module)."""
        self.cluster, self.workload, self.run_dir, self.run_id = cluster, workload, Path(run_dir).resolve(), run_id
        self.events_path, self.on_line = events_path, on_line
        self.account = cluster.job_account
        """The account the driver runs as (the lab's nodes'), or ``None``: as chaoskit."""
        # The job's folder (Job.folders): the account's own beside the run folder, whose files are chaoskit's; else
        # the run folder. The Ray lab has no shared folder.
        self.job_dir = job_folder(cluster, self.run_dir, run_id, owned=self.account is not None)
        self.log_dir = self.run_dir / "logs"
        self.driver: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    def driver_argv(self) -> list[str]:
        w = self.workload
        argv = [sys.executable, "-m", "chaoskit.workloads.ray_train",
                "--address", str(self.cluster.details.get("ray_address", "<ray head>")), "--name", self.run_id,
                "--workers", str(len(self.cluster.job_nodes) * w.nproc_per_node), "--steps", str(w.steps),
                "--step-time", f"{w.step_time:g}", "--checkpoint-every", str(w.checkpoint_every),
                "--collective-timeout", f"{w.collective_timeout:g}", "--max-failures", str(w.max_restarts),
                "--storage", str(self.job_dir / "checkpoints")]
        if self.events_path is not None:
            argv += ["--events", str(Path(self.events_path).resolve())]
        return argv

    def commands(self) -> dict[str, list[str]]:
        return {"driver": self.driver_argv()}

    def start(self, nodes: list[str] | None = None) -> None:
        import importlib.util

        if importlib.util.find_spec("ray.train") is None or importlib.util.find_spec("torch") is None:
            raise InfraError("the Ray Train workload needs ray[train] and torch", hint="pip install 'chaoskit[ray,workload]'")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, LocalTransport.SCOPE_ENV: self.cluster.scope(DRIVER_SCOPE), "PYTHONUNBUFFERED": "1",
               "OMP_NUM_THREADS": "1", **torch_cache_env(self.job_dir)}
        for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN"):
            env.pop(name, None)
        token = self.cluster.details.get("ray_token_file")
        if token:
            env.update(ray_auth_env(str(token)))
        ids: dict[str, Any] = {}
        if self.account is not None:  # the job's folder is the account's (the runner made it); none of root's identity
            env.update({**self.account.env(), "HOME": str(self.job_dir), "TMPDIR": str(self.job_dir / "tmp")})
            ids = self.account.popen_ids()
        self.driver = subprocess.Popen(self.driver_argv(), env=env, cwd=self.job_dir, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, **ids)
        self._reader = threading.Thread(target=self._pump, daemon=True, name="chaoskit-log-driver")
        self._reader.start()

    def _pump(self) -> None:
        assert self.driver is not None and self.driver.stdout is not None
        with open(self.log_dir / "driver.log", "ab") as log:
            for raw, line in bounded_lines(self.driver.stdout):  # cut at MAX_LINE_BYTES, as launch.py's
                ts = time.time()
                log.write(raw)
                log.flush()
                if self.on_line and line is not None:
                    try:
                        self.on_line("driver", line.decode(errors="replace"), ts)
                    except Exception:  # noqa: BLE001 - one bad line must not stop the driver's output
                        pass

    def running(self) -> bool:
        return self.driver is not None and self.driver.poll() is None

    def returncodes(self) -> dict[str, int | None]:
        return {"driver": self.driver.poll() if self.driver else None}

    def stop(self, grace: float = 10.0) -> None:
        """Stop the driver; Ray then ends the job's actors (the Train controller and its workers)."""
        if self.driver is not None and self.driver.poll() is None:
            os.killpg(self.driver.pid, signal.SIGTERM)
            try:
                self.driver.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.driver.pid, signal.SIGKILL)
                self.driver.wait(timeout=5)
        # Workers the job left (they should go with the driver) are processes of their nodes: end them.
        deadline = time.time() + grace
        while time.time() < deadline and self._train_workers():
            time.sleep(0.1)
        for scope in [DRIVER_SCOPE, *self.cluster.agent_nodes]:
            for p in LocalTransport(scope, self.cluster.scope(scope)).processes():
                if scope == DRIVER_SCOPE or "RayTrainWorker" in p.cmdline:
                    try:
                        os.kill(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        if self._reader is not None:
            self._reader.join(timeout=2)

    def _train_workers(self) -> list[int]:
        return [p.pid for n in self.cluster.agent_nodes for p in LocalTransport(n, self.cluster.scope(n)).processes()
                if "RayTrainWorker" in p.cmdline]


if __name__ == "__main__":
    sys.exit(main())
