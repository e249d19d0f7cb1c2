"""gpu.xid's writer: one NVIDIA Xid line into the node's kernel log.

Run as ``python3 -I -c XID_WRITER LINE`` on the node (root): writes one Xid line to the node's kernel log and
prints the node's time it did.
"""

import json, os, sys, time


def main():
    line = sys.argv[1]
    if "\n" in line or not line.startswith("NVRM: Xid (PCI:"):
        sys.exit(2)
    fd = os.open("/dev/kmsg", os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, ("<4>" + line + "\n").encode())  # KERN_WARNING, as the driver logs an Xid
    finally:
        os.close(fd)
    print(json.dumps({"t": time.time()}))


if __name__ == "__main__":
    main()
