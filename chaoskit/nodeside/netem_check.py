"""Whether the node's kernel has netem.

A stdlib script: exit 0 when the kernel has ``sch_netem`` (loaded, built in, or a module that loads).
"""

import glob, gzip, os, subprocess, sys


def main():
    if os.path.isdir('/sys/module/sch_netem'):
        sys.exit(0)
    rel = os.uname().release
    for path in ('/lib/modules/%s/modules.builtin' % rel, '/usr/lib/modules/%s/modules.builtin' % rel):
        try:
            if 'sch_netem' in open(path).read():
                sys.exit(0)
        except OSError:
            pass
    conf = ''
    for path in ('/proc/config.gz', '/boot/config-%s' % rel):
        try:
            conf = (gzip.open(path, 'rt') if path.endswith('.gz') else open(path)).read()
            break
        except OSError:
            pass
    if 'CONFIG_NET_SCH_NETEM=y' in conf:
        sys.exit(0)
    if 'CONFIG_NET_SCH_NETEM is not set' in conf:
        sys.exit(1)
    try:
        if subprocess.call(['modprobe', '-q', 'sch_netem'], stderr=subprocess.DEVNULL) == 0 and os.path.isdir('/sys/module/sch_netem'):
            sys.exit(0)
    except OSError:
        pass
    sys.exit(1)


if __name__ == "__main__":
    main()
