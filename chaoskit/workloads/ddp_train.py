"""The reference training job: :mod:`plain_train` instrumented with the chaoskit SDK.

Run under torchrun: ``torchrun ... -m chaoskit.workloads.ddp_train --steps 400``.
Events go to ``$CHAOSKIT_EVENTS`` (see :mod:`chaoskit.sdk.probe`).
"""

from __future__ import annotations


from chaoskit.sdk import probe
from chaoskit.workloads.plain_train import Hooks, error_line, leave, parse_args, train, train_inprocess


HEARTBEAT_S = 1.0
"""How often each rank's heartbeat thread emits the SDK's ``heartbeat`` event."""


class SdkHooks(Hooks):
    def __init__(self) -> None:
        self.heartbeat = None

    def worker_start(self, rank: int, world: int, restart: int, iteration: int | None = None) -> None:
        probe.worker_start(**({} if iteration is None else {"iteration": iteration}))  # NVRx's in-process restart
        # a thread of its own, as real jobs' watchdogs are: it beats on while the training thread is held
        # (inproc.hang), and stops with the whole process (SIGSTOP, inproc.gil); one per process, however
        # often the loop restarts inside it
        if self.heartbeat is None:
            self.heartbeat = probe.start_heartbeat(HEARTBEAT_S)
        super().worker_start(rank, world, restart, iteration)

    def rendezvous_done(self, rank: int, world: int) -> None:
        probe.rendezvous_done(world)

    def load(self, rank: int, path: str):
        return probe.checkpoint_load(path=path)

    def save(self, rank: int, step: int):
        return probe.checkpoint_save(step)

    def load_failed(self, rank: int, path: str, exc: BaseException, fallback: str | None) -> None:
        probe.emit("ckpt.load.failed", path=path, why="checkpoint load failed", error=error_line(exc), fallback=fallback)
        super().load_failed(rank, path, exc, fallback)

    def save_failed(self, rank: int, step: int, exc: BaseException) -> None:
        probe.emit("ckpt.save.failed", step=int(step), why="checkpoint save failed", error=error_line(exc))
        super().save_failed(rank, step, exc)

    def step(self, rank: int, step: int, loss: float) -> None:
        probe.step(step, loss=round(loss, 5))

    def finished(self, rank: int) -> None:
        if self.heartbeat is not None:  # no daemon thread beats on while the interpreter shuts down
            self.heartbeat.set()

    def collective_error(self, rank: int, exc: BaseException) -> None:
        text = str(exc).splitlines()[0] if str(exc) else ""
        probe.detect("collective error", error=f"{type(exc).__name__}: {text}"[:300])
        super().collective_error(rank, exc)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return (train_inprocess if args.nvrx_inprocess else train)(args, SdkHooks())


if __name__ == "__main__":
    leave(main())
