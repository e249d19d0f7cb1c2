#!/bin/sh
# A chaoskit lab node: start sshd in the foreground and nothing else. chaoskit starts
# each run's torchrun agent in here itself (docker exec), so every drill gets a fresh job;
# faults act on the processes and the network namespace of this container.
set -eu
mkdir -p /run/sshd /root/.ssh
chmod 700 /root/.ssh
ssh-keygen -A >/dev/null
# Optional: one public key allowed to log in as root (e.g. to drive the node over SSH).
if [ -n "${CHAOSKIT_AUTHORIZED_KEY:-}" ]; then
    printf '%s\n' "$CHAOSKIT_AUTHORIZED_KEY" > /root/.ssh/authorized_keys
    chmod 600 /root/.ssh/authorized_keys
fi
exec /usr/sbin/sshd -D -e
