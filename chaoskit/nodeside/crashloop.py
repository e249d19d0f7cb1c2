"""gpu.fail's crash loop: kill the selected processes of the node, and any that start again, until told to stop.

The crash loop, run as ``python3 -I -c CRASHLOOP DIR DURATION_S POLL_S SCOPE_JSON SELECTOR_JSON`` on the node.

``SELECTOR_JSON`` holds the fault's ``ranks``, ``pid`` and ``process``, or ``{"node": true}``
for ``scope: node`` (every process of the job in the node's scope, agents first). It refuses
an existing ``DIR`` and one outside chaoskit's state folder, writes ``DIR/started`` (its clock, its pid) once it watches, one line
per kill to ``DIR/kills`` (time, pid, rank or ``None``), and ``DIR/exited`` when ``DIR/stop``
appears or ``DURATION_S`` has passed, then removes ``DIR`` itself unless its controller did within
``LOOP_GRACE_S`` (set in front; a controller killed mid-fault leaves nobody to). Only processes of the node's scope are ever
touched (the scope's ``CHAOSKIT_SCOPE`` token and network namespace), and of those only the
drilled job's (``SCOPE_JSON``'s ``job``: its run id, uid, Slurm job; its torchrun agent as the
parent of one of its workers), by the rule the node's agent applies: :mod:`chaoskit.nodeside.jobscope`, whose
source comes in front of this one with nodefs'.
"""

import json, os, re, signal, sys, time


def main():
    d, duration, poll = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    scope, sel = json.loads(sys.argv[4]), json.loads(sys.argv[5])
    check_dir(os.path.dirname(d))  # chaoskit's own folder, or nothing is done
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        sys.exit(3)
    deadline = time.time() + duration
    me = os.getpid()
    def netns(pid):
        try:
            return os.readlink("/proc/%s/ns/net" % pid)
        except OSError:
            return None
    own = netns("self") if scope.get("netns") else None
    token = scope.get("env")
    uids = set(scope["uids"]) if scope.get("uids") is not None else None
    since = scope.get("since")
    job = scope.get("job") or None
    def owned(pid, env):  # the job's rule is the agent's own (jobscope, bundled in front of this program)
        return job_owns(uid_of(pid), env, job)

    def carries(pid, env):
        return job_marks(uid_of(pid), env, job)

    ranks = set(sel["ranks"]) if sel.get("ranks") is not None else None
    class SlowPattern(Exception):
        pass
    def _bounded(source, limit=0.5):
        # A scenario's regex, with a time bound per command line (the regex package's timeout where the node has
        # it, else SIGALRM: this loop is its process's main thread): a slow match counts as no match and is noted
        # in DIR/slow, and the stop file and the deadline are looked at before every match, so they always win.
        try:
            import regex as rx
            compiled = rx.compile(source)
            run = lambda text, left: compiled.search(text, timeout=left)
            slow = (TimeoutError, SlowPattern)
        except ImportError:
            compiled = re.compile(source)
            def alarm(*_):
                raise SlowPattern()
            signal.signal(signal.SIGALRM, alarm)
            def run(text, left):
                signal.setitimer(signal.ITIMER_REAL, left)
                try:
                    return compiled.search(text)
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            slow = (SlowPattern,)
        class Bounded:
            def search(self, text):
                left = min(limit, deadline - time.time())
                if left <= 0 or os.path.exists(os.path.join(d, "stop")):
                    return None
                try:
                    return run(text, left)
                except slow:
                    with open(os.path.join(d, "slow"), "a") as fh:
                        fh.write("%f the process pattern took over %gs on a command line of %d characters\n" % (time.time(), left, len(text)))
                    return None
        return Bounded()
    pattern = _bounded(sel["process"]) if sel.get("process") else None
    pid_sel = sel.get("pid")
    whole_node = bool(sel.get("node"))
    AGENT = re.compile(r"torchrun|torch[./]distributed[./]run")
    cache = {}
    def env_of(pid, key):
        env = cache.get(key)
        if env is None:
            env = {}
            try:
                with open("/proc/%d/environ" % pid, "rb") as fh:
                    raw = fh.read()
            except OSError:
                return None
            for item in raw.split(b"\0"):
                k, s, v = item.partition(b"=")
                if s:
                    env[k.decode(errors="replace")] = v.decode(errors="replace")
            if key[2]:
                if len(cache) > 4096:
                    cache.clear()
                cache[key] = env
        return env
    def matches(pid):
        try:
            with open("/proc/%d/stat" % pid, "rb") as fh:
                stat = fh.read().decode(errors="replace")
            with open("/proc/%d/cmdline" % pid, "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            return None
        rest = stat[stat.rfind(")") + 2:].split()
        if not rest or rest[0] == "Z":
            return None
        env = env_of(pid, (pid, rest[19], cmd))
        if env is None:
            return None
        if token is not None and env.get("CHAOSKIT_SCOPE") != token:
            return None
        if uids is not None and uid_of(pid) not in uids:  # the token copied into another user's process
            return None
        if since is not None and int(rest[19]) < since:  # older than the lab: not one of its processes
            return None
        if own is not None and netns(pid) != own:
            return None
        if pid_sel is not None and pid != pid_sel:
            return None
        if pattern is not None and not pattern.search(cmd):
            return None
        rank = env.get("RANK")
        rank = int(rank) if rank is not None and rank.isdigit() else None
        if job is not None and not carries(pid, env):
            # of the drilled job only: a torchrun agent (no run id of its own) seen before, or the parent of a worker
            if not whole_node or job.get("pending") or not owned(pid, env):
                return None
            if [pid, int(rest[19])] in (job.get("agents") or []):
                return (rank, None)
            return (rank, None, "agent") if AGENT.search(cmd) else None
        if whole_node:
            if "CHAOSKIT_NODE" in env or "TORCHELASTIC_RUN_ID" in env:
                worker = "TORCHELASTIC_RUN_ID" in env and rank is not None
                return (rank, int(rest[1]) if worker else None)
            if AGENT.search(cmd):
                return (rank, None, "agent")
            return None
        if pid_sel is None and pattern is None and ("TORCHELASTIC_RUN_ID" not in env or rank is None):
            return None
        if ranks is not None and rank not in ranks:
            return None
        return (rank, None)
    create_file(os.path.join(d, "started"), "%f %d\n" % (time.time(), me))
    kills = os.fdopen(os.open(os.path.join(d, "kills"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND,
                              0o600), "a")
    stop = os.path.join(d, "stop")
    killed, reason = 0, None
    while reason is None:
        if os.path.exists(stop):
            reason = "stopped"
            break
        if time.time() >= deadline:
            reason = "deadline"
            break
        found = {}
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            pid = int(name)
            hit = matches(pid)
            if hit is not None:
                found[pid] = hit
        if whole_node:
            # The job's own processes carry its marks; an agent of a job started elsewhere is known as the
            # parent of a worker. Agents die first, so none of them can start a worker again in this pass.
            parents = {hit[1] for hit in found.values() if hit[1] is not None}
            found = {pid: hit for pid, hit in found.items() if len(hit) == 2 or pid in parents}
        for pid in sorted(found, key=lambda p: found[p][0] is not None):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
            killed += 1
            kills.write("%f %d %s\n" % (time.time(), pid, found[pid][0]))
            kills.flush()
        time.sleep(poll)
    create_file(os.path.join(d, "exited"), "%f %s %d\n" % (time.time(), reason, killed))
    kills.close()
    # The controller's verify reads the folder and removes it; with no controller (killed, its lease's watchdog
    # stopped this loop), nobody would: the loop removes it itself after LOOP_GRACE_S, so nothing is left behind.
    end = time.time() + LOOP_GRACE_S
    while time.time() < end and os.path.lexists(d):
        time.sleep(0.1)
    remove_tree(d)


if __name__ == "__main__":
    main()
