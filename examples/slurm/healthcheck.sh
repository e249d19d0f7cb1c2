#!/bin/sh
# A node health check of the kind Slurm sites run as HealthCheckProgram (NHC-style): drain this node when
# one of its GPUs has a fatal NVIDIA Xid in the kernel log since boot (or since the check last acted on one,
# so a node an administrator resumed is not drained again for the same line), and requeue the jobs running
# on it, since they cannot go on with a failed GPU.
#
# chaoskit's Slurm lab runs it (cluster.slurm.health_check_interval); on your own cluster, use your own.
#
# Settings (environment):
#   SLURMD_NODENAME  this node's Slurm name (slurmd sets it); else looked up by address in HC_NODE_MAP
#   HC_NODE_MAP      file of "ADDRESS NODE" lines (nodes that share one host name, as the lab's do)
#   HC_GPU_DIR       folder with one file per node listing its GPUs' PCI bus ids (the lab's emulated GPUs);
#                    without it: nvidia-smi --query-gpu=pci.bus_id
#   HC_STATE_DIR     where the check remembers the last line it acted on (default /var/lib/xid-healthcheck;
#                    made 0700; must be root's and not a link)
#   HC_FATAL         the Xid codes that drain (default: 48 64 74 79 95)
#   HC_REQUEUE       1 (default): requeue the node's running jobs after draining it; 0: only drain
set -u
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
umask 077

FATAL="${HC_FATAL:-48 64 74 79 95}"
STATE_DIR="${HC_STATE_DIR:-/var/lib/xid-healthcheck}"

node="${SLURMD_NODENAME:-}"
if [ -z "$node" ] && [ -n "${HC_NODE_MAP:-}" ] && [ -r "$HC_NODE_MAP" ]; then
    for addr in $(ip -o -4 addr show 2>/dev/null | awk '{split($4, a, "/"); print a[1]}'); do
        node=$(awk -v a="$addr" '$1 == a { print $2; exit }' "$HC_NODE_MAP")
        [ -n "$node" ] && break
    done
fi
case "$node" in
    ''|*[!A-Za-z0-9._-]*) echo "healthcheck: cannot tell this node's Slurm name" >&2; exit 1 ;;
esac

# This node's GPUs, as the Xid line names them: DDDD:BB:DD in lower case.
if [ -n "${HC_GPU_DIR:-}" ]; then
    gpus=$(cat -- "$HC_GPU_DIR/$node" 2>/dev/null)
else
    gpus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader 2>/dev/null)
fi
gpus=$(printf '%s\n' "$gpus" | awk -F: 'NF >= 3 { split($3, d, "."); print tolower(substr($1, length($1) - 3) ":" $2 ":" d[1]) }')
[ -n "$gpus" ] || exit 0   # no GPU here: nothing to check

# The state folder: root's own, no link, nobody else may write it.
if [ ! -d "$STATE_DIR" ]; then
    mkdir -m 0700 -p -- "$STATE_DIR" || exit 1
fi
if [ -L "$STATE_DIR" ] || [ "$(stat -c %u -- "$STATE_DIR")" != "0" ] || [ -n "$(find "$STATE_DIR" -maxdepth 0 -perm /022)" ]; then
    echo "healthcheck: refusing state folder $STATE_DIR (a link, not root's, or writable by others)" >&2
    exit 1
fi
mark="$STATE_DIR/$node.last"
last=0
if [ -f "$mark" ] && [ ! -L "$mark" ]; then
    last=$(head -c 32 -- "$mark" | tr -cd '0-9.')
    [ -n "$last" ] || last=0
fi

# The first fatal Xid of one of this node's GPUs logged after the last one acted on: "TIME CODE PCI MESSAGE".
found=$(dmesg -r 2>/dev/null | awk -v last="$last" -v fatal=" $FATAL " -v gpus="$gpus" '
    BEGIN { n = split(gpus, g, "\n"); for (i = 1; i <= n; i++) own[g[i]] = 1 }
    match($0, /NVRM: Xid \(PCI:[0-9A-Fa-f:.]+\): [0-9]+,/) {
        t = $0; sub(/^<[0-9]+>\[ */, "", t); sub(/\].*/, "", t)
        if (t + 0 <= last + 0) next
        x = substr($0, RSTART, RLENGTH); sub(/^NVRM: Xid \(PCI:/, "", x)
        pci = x; sub(/\).*/, "", pci); code = x; sub(/.*: /, "", code); sub(/,$/, "", code)
        split(pci, p, ":"); split(p[3], d, ".")
        id = tolower(substr(p[1], length(p[1]) - 3) ":" p[2] ":" d[1])
        if (!(id in own) || index(fatal, " " code " ") == 0) next
        msg = substr($0, RSTART + RLENGTH); sub(/^ *pid=[^,]*, name=[^,]*, /, "", msg)
        print t, code, id, msg; exit
    }')
[ -n "$found" ] || exit 0

when=$(printf '%s\n' "$found" | awk '{print $1}')
code=$(printf '%s\n' "$found" | awk '{print $2}')
pci=$(printf '%s\n' "$found" | awk '{print $3}')
msg=$(printf '%s\n' "$found" | cut -d' ' -f4- | tr -cd 'A-Za-z0-9 _.,:;()/+=@-' | cut -c1-200)

state=$(scontrol -o show node "$node" 2>/dev/null | tr ' ' '\n' | awk -F= '$1 == "State" { print $2 }')
case "$state" in
    *DRAIN*|*DOWN*|*FAIL*) ;;   # already out of service: leave its reason as it is
    *)
        if ! scontrol update "nodename=$node" state=drain "reason=healthcheck: Xid $code on PCI:$pci: $msg"; then
            echo "healthcheck: could not drain $node" >&2
            exit 1
        fi
        if [ "${HC_REQUEUE:-1}" = "1" ]; then
            for job in $(squeue -h -w "$node" -t RUNNING,CONFIGURING -o %A 2>/dev/null); do
                case "$job" in *[!0-9_]*) continue ;; esac
                scontrol requeue "$job" || echo "healthcheck: could not requeue job $job" >&2
            done
        fi
        ;;
esac
tmp="$mark.$$"
rm -f -- "$tmp"
printf '%s\n' "$when" > "$tmp" && mv -f -- "$tmp" "$mark"
exit 0
