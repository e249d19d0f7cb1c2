"""Which processes of a node are the drilled job's: the one copy of that rule, run on the node.

Standard library only, Python 3.6+, like every module of :mod:`chaoskit.nodeside`: the node's agent
(:mod:`chaoskit.nodeside.agent`) and the crash loop (:mod:`chaoskit.nodeside.crashloop`)
carry its source in front of their own (:func:`chaoskit.nodeside.nodefs.bundle`); the agent imports it from
here when it runs on the controller (a local node). A job is ``{"run_id", "uid", "slurm_job", "pending", "agents"}`` as the
controller chose it (:class:`chaoskit.cluster.transports.api.JobScope`); a process is judged by its real uid
and its environment (the keys torchrun and Slurm set).
"""


def uid_of(pid):
    """The real uid of ``pid`` (``/proc/PID/status``), or None."""
    try:
        with open("/proc/%d/status" % pid, "rb") as fh:
            for line in fh:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def job_owns(uid, env, job):
    """Same uid and Slurm job as the drilled job (where it names them): a torchrun agent has no run id of its
    own, so this is all an agent can show."""
    if job.get("uid") is not None and uid != int(job["uid"]):
        return False
    if job.get("slurm_job") is not None and env.get("SLURM_JOB_ID") != str(job["slurm_job"]):
        return False
    return True


def job_marks(uid, env, job):
    """Whether the process itself carries every mark of the drilled job: its run id, uid and Slurm job. Nothing
    does while the job is still being chosen (``pending``)."""
    if job.get("pending"):
        return False
    if job.get("run_id") is not None and env.get("TORCHELASTIC_RUN_ID") != str(job["run_id"]):
        return False
    return job_owns(uid, env, job)
