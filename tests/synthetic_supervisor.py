"""A stand-in for torchrun with known delays, for measuring chaoskit's accuracy.

It is a real supervisor of real processes: it forks WORLD workers that emit SDK
events (start, checkpoint load, steps, saves). When one worker dies it waits
DETECT_S and reports the exit (as an agent would), kills the survivors, waits
RESTART_S, forks a new world, and each new worker takes LOAD_S (rank r: LOAD_S *
(r + 1) / WORLD, so the last rank loads last) to load the newest checkpoint; no
rank steps before all have loaded, as with DDP's first all-reduce.

Besides the SDK events it writes the truth, read off the clock where each thing
really happened (``ckpt.txt.truth``: ``noticed``, ``started``, ``loaded`` lines):
on a loaded machine the delays come out longer than asked, and the truth says
by how much. Each truth line and its event carry the same clock reading (the
event's ``ts`` is given), so a process descheduled between writing the two
cannot part them: what is measured is chaoskit's choice of events, not the
scheduler.

    python synthetic_supervisor.py DETECT_S RESTART_S LOAD_S STEP_S STEPS CKPT_EVERY
"""

import os
import signal
import sys
import time

from chaoskit import probe

WORLD = 2


def truth(state, what, restart, rank):
    """Write the truth line for ``what`` and return its clock reading, for the event that marks it."""
    now = time.time()
    with open(state + ".truth", "a") as fh:
        fh.write("%s %d %d %.6f\n" % (what, restart, rank, now))
    return now


def worker(rank, restart, delays, state):
    os.environ["RANK"] = str(rank)
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(restart)
    os.environ["WORLD_SIZE"] = str(WORLD)
    probe.worker_start(ts=truth(state, "started", restart, rank))
    _, _, load_s, step_s, steps, every = delays
    start = 0
    if os.path.exists(state):
        probe.emit("ckpt.load.start")
        time.sleep(load_s * (rank + 1) / WORLD)
        with open(state) as fh:
            start = int(fh.read())
        probe.emit("ckpt.load.end", step=start, ts=truth(state, "loaded", restart, rank))
    # Like DDP's first all-reduce: no rank steps before every rank of the world is ready.
    barrier = "%s.ready.%d" % (state, restart)
    open("%s.%d" % (barrier, rank), "w").close()
    while not all(os.path.exists("%s.%d" % (barrier, r)) for r in range(WORLD)):
        time.sleep(0.001)
    for step in range(start + 1, steps + 1):
        probe.step(step)
        if rank == 0 and step % every == 0:
            with probe.checkpoint_save(step):
                with open(state + ".tmp", "w") as fh:
                    fh.write(str(step))
                os.replace(state + ".tmp", state)
        time.sleep(step_s)
    os._exit(0)


def spawn(restart, delays, state):
    pids = {}
    for rank in range(WORLD):
        pid = os.fork()
        if pid == 0:
            worker(rank, restart, delays, state)
        pids[pid] = rank
    return pids


def main(argv):
    detect_s, restart_s, load_s, step_s = map(float, argv[:4])
    steps, every = int(argv[4]), int(argv[5])
    delays = (detect_s, restart_s, load_s, step_s, steps, every)
    state = os.path.join(os.path.dirname(os.environ["CHAOSKIT_EVENTS"]), "ckpt.txt")
    restart = 0
    pids = spawn(restart, delays, state)
    while pids:
        pid, status = os.wait()
        rank = pids.pop(pid, None)
        if rank is None or status == 0:
            continue
        time.sleep(detect_s)
        probe.emit("worker.exit", ts=truth(state, "noticed", restart, rank), rank=rank, exitcode=-os.WTERMSIG(status) if os.WIFSIGNALED(status) else status >> 8)
        for other in list(pids):
            os.kill(other, signal.SIGKILL)
            os.waitpid(other, 0)
        pids.clear()
        time.sleep(restart_s)
        restart += 1
        pids = spawn(restart, delays, state)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
