"""An in-process fault's answer is the job's word: it never steers the fault's end (issue 48, finding 12).

A real job process takes a real ``inproc.hang`` order through the node's channel (chaoskit's helper writes it
into the node's state folder, the process reads it with the SDK's own checks) and answers as a hostile job would:
the pid, start time, folder and rank of another user's process, and a fault time an hour before the order. Then
it never reports the hang's end. The fault's end must act on the process chaoskit chose (and kill it, as it
missed its end), leave the other user's process running, journal the kill of the right pid, and keep chaoskit's
own time for the fault, with a note saying why. The job is stdlib only (the SDK's channel side imports no
torch): the fastest real job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT, fault_context, wait_exec

LIAR = r'''
import os, sys, time
from chaoskit.sdk import inproc
folder, victim, victim_start, elsewhere = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
order = None
while order is None:  # the SDK's own checks of the folder and the order
    order = inproc.read_order(folder, os.getpid())
    time.sleep(0.02)
# the answer of a job that lies: another process's pid, start time, folder and rank, and a time an hour back
inproc._write_status(folder, {"id": order["id"], "status": "fired", "ts": time.time() - 3600, "step": 7,
                              "detail": {"where": "step", "pid": victim, "start_time": victim_start,
                                         "folder": elsewhere, "rank": 5}})
time.sleep(600)  # and it never reports the hang's end
'''


def _start_time(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat[stat.rfind(b")") + 2:].split()[19])


def test_a_jobs_answer_cannot_aim_the_faults_end_at_another_users_process_nor_set_its_time(job_user, tmp_path):
    from chaoskit.cluster.inventory import Inventory, Node
    from chaoskit.cluster.selectors import ProcessTarget
    from chaoskit.cluster.transports.local import LocalTransport, proc_info
    from chaoskit.faults.inproc import InprocHangFault

    transport = LocalTransport("n1", state_dir=str(tmp_path / "node-state"))
    folder = f"{transport.state_dir}/inproc"
    os.makedirs(folder, mode=0o700, exist_ok=True)
    elsewhere = tmp_path / "elsewhere" / "inproc"  # a channel folder the helper would accept, not this node's
    elsewhere.mkdir(mode=0o700, parents=True)
    (tmp_path / "elsewhere").chmod(0o700)
    victim = subprocess.Popen(["sleep", "600"], user=job_user.pw_uid, group=job_user.pw_gid, extra_groups=[],
                              stdin=subprocess.DEVNULL)
    script = tmp_path / "liar.py"
    script.write_text(LIAR)
    job = None
    try:
        wait_exec(victim)
        victim_start = _start_time(victim.pid)
        assert os.stat(f"/proc/{victim.pid}").st_uid == job_user.pw_uid
        job = subprocess.Popen([sys.executable, str(script), folder, str(victim.pid), str(victim_start), str(elsewhere)],
                               env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "RANK": "1"},
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        wait_exec(job)
        target = ProcessTarget("n1", proc_info(job.pid))
        assert (target.pid, target.rank) == (job.pid, 1) and target.start_time is not None

        inventory = Inventory("site", [Node("n1", conn=transport)])
        fault = InprocHangFault(InprocHangFault.Spec(kind="inproc.hang", duration=30), "f0")
        with fault_context(inventory, tmp_path, ttl=60.0) as ctx:
            t_before = time.time()
            [inj] = fault.inject(ctx, [target])
            t_after = time.time()
            fault.revert(ctx, inj)  # the job never reported the hang's end
            ctx.leases.release(inj.fault_id)

        # the other user's process is untouched; the job chaoskit chose is the one the end killed
        assert victim.poll() is None and _start_time(victim.pid) == victim_start
        assert inj.detail["killed"] is True and job.wait(timeout=10) == -signal.SIGKILL
        kills = [e for e in map(json.loads, (tmp_path / "journal.jsonl").read_text().splitlines())
                 if e["action"] == "lease.kill"]
        assert [e["pid"] for e in kills] == [job.pid]
        # chaoskit's choice in the detail; what the job claimed kept apart
        d = inj.detail
        assert (d["pid"], d["start_time"], d["folder"], d["rank"]) == (job.pid, target.start_time, folder, 1)
        assert d["reported"] == {"pid": victim.pid, "start_time": victim_start, "folder": str(elsewhere), "rank": 5}
        assert d["where"] == "step" and d["step"] == 7
        # the job's time (an hour before the order) is not the fault's: chaoskit's own is, and a note says so
        assert t_before <= inj.t_fault <= t_after
        assert "outside its window" in d["note"] and "the fault's time is chaoskit's own" in d["note"]
    finally:
        for p in (job, victim):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=10)
