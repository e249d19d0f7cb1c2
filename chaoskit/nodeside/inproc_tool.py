"""inproc.*'s node side: write a process's fault order into the node's in-process channel folder, wait for
its answer and its firing, take the order back, and end a process that missed its fault's end.

``python3 -I -c HELPER order|wait|clear|end FOLDER PID ...``, in the node's state folder only (nodefs in front).
"""

import json, os, signal, sys, time


def _folder(path):
    base = check_dir(os.path.dirname(path))
    if os.path.basename(path) != "inproc":
        raise StateDirError("%s is not chaoskit's in-process channel folder" % path)
    return make_dirs(base, path)


def _status(folder, pid):
    try:
        return json.loads(read_file("%s/status-%d.json" % (folder, pid), 1 << 16))
    except (OSError, ValueError, TypeError):
        return None


def _start_time(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2:].split()[19].decode()


def _take_back(folder, pid, status=False):
    for name in ("order", "status") if status else ("order",):
        try:
            os.unlink("%s/%s-%d.json" % (folder, name, pid))
        except FileNotFoundError:
            pass


def main():
    op, folder, pid = sys.argv[1], _folder(sys.argv[2]), int(sys.argv[3])
    def _wait(oid, timeout, wanted):
        end = time.time() + timeout
        while True:
            st = _status(folder, pid)
            if isinstance(st, dict) and (st.get("status") == "refused" or st.get("id") == oid and st.get("status") in wanted):
                return st
            if not os.path.exists("/proc/%d" % pid):
                return {"status": "gone"}
            if time.time() >= end:
                return {"status": "timeout", "last": st}
            time.sleep(0.02)

    if op == "order":  # ORDER [ID CHECKIN_S FIRE_S]: write it; then wait for its answer, and for it to fire
        try:
            os.unlink("%s/status-%d.json" % (folder, pid))
        except FileNotFoundError:
            pass
        write_file("%s/order-%d.json" % (folder, pid), sys.argv[4])
        if len(sys.argv) == 5:
            print(json.dumps({"ok": True}))
        else:
            oid, checkin, fire = sys.argv[5], float(sys.argv[6]), float(sys.argv[7])
            st = _wait(oid, checkin, ("armed", "fired", "ended"))
            if st.get("status") == "armed":
                st = _wait(oid, fire, ("fired", "ended"))
                if st.get("status") == "timeout":
                    st["status"] = "unfired"
            print(json.dumps(st))
    elif op == "wait":
        print(json.dumps(_wait(sys.argv[4], float(sys.argv[5]), sys.argv[6].split(","))))
    elif op == "clear":
        _take_back(folder, pid, status=True)
        print(json.dumps({"ok": True}))
    elif op == "end":
        start, oid, grace = sys.argv[4], sys.argv[5], float(sys.argv[6])
        _take_back(folder, pid)
        end = time.time() + grace
        while time.time() < end:
            st = _status(folder, pid)
            if _start_time(pid) != start or isinstance(st, dict) and st.get("id") == oid and st.get("status") == "ended":
                _take_back(folder, pid, status=True)
                print(json.dumps({"killed": False}))
                sys.exit(0)
            if st is None:  # no answer left: another end of this fault (its lease's watchdog, at the same deadline) took it back
                print(json.dumps({"killed": False, "ended_by": "another end of the fault"}))
                sys.exit(0)
            time.sleep(0.05)
        fd = None
        if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                fd = None
        if _start_time(pid) != start:
            print(json.dumps({"killed": False}))
            sys.exit(0)
        if fd is not None:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        _take_back(folder, pid, status=True)
        print(json.dumps({"killed": True, "why": "the process missed the end of its in-process fault"}))
    else:
        sys.exit("unknown op")


if __name__ == "__main__":
    main()
