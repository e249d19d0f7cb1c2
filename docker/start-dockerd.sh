#!/usr/bin/env bash
# Start Debian's dockerd (docker.io) when no engine answers, and wait until it does.
# It picks its storage driver itself (overlay2 where the kernel allows, else vfs);
# set DOCKERD_ARGS="--storage-driver=vfs" to force one. Needs root.
set -euo pipefail
if docker info >/dev/null 2>&1; then
    echo "start-dockerd: an engine is already running ($(docker info --format '{{.Driver}}'))"
    exit 0
fi
command -v dockerd >/dev/null || { echo "start-dockerd: dockerd is missing: apt-get install docker.io" >&2; exit 1; }
log=${DOCKERD_LOG:-/var/log/chaoskit-dockerd.log}
# shellcheck disable=SC2086 # DOCKERD_ARGS is a list of flags
nohup dockerd ${DOCKERD_ARGS:-} >"$log" 2>&1 &
for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then
        echo "start-dockerd: dockerd up (storage driver $(docker info --format '{{.Driver}}'), log $log)"
        exit 0
    fi
    sleep 0.5
done
echo "start-dockerd: dockerd did not come up in 30 s; its log ($log):" >&2
tail -20 "$log" >&2
exit 1
