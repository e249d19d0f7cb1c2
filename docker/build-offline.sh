#!/usr/bin/env bash
# Build the lab node image (docker/Dockerfile) without any image registry:
#
#   1. the base: a minimal Debian bookworm root file system made by debootstrap (Python 3.11,
#      openssh-server, iproute2, nftables, procps), imported as chaoskit-base:bookworm
#      (skipped when that image exists);
#   2. the wheels: chaoskit and its dependencies (torch 2.13.0 CPU) collected on this machine
#      into build/docker-wheels;
#   3. docker build --network none with BASE=chaoskit-base:bookworm and pip told to use only
#      those wheels.
#
# Needs root (debootstrap), docker, and a Python with pip (PYTHON, default python3).
# An image of TAG built from the same source (a digest of chaoskit/, pyproject.toml, README.md and docker/,
# its label io.chaoskit.source) is kept as it is: CI builds each tree once. CHAOSKIT_REBUILD=1 forces a build.
#
# Usage: docker/build-offline.sh [TAG]        (default chaoskit-node:latest)
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${1:-chaoskit-node:latest}
BASE=${CHAOSKIT_BASE_IMAGE:-chaoskit-base:bookworm}
PYTHON=${PYTHON:-python3}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null || { echo "build-offline: debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }
    rootfs=$(mktemp -d /tmp/chaoskit-rootfs.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    echo "build-offline: debootstrap bookworm into $rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,openssh-server,iproute2,nftables,procps \
        bookworm "$rootfs" "$MIRROR" >/dev/null
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
    echo "build-offline: base image $BASE imported"
fi

# What the image is built from (its source: the package, its metadata, docker/) has a digest; an image that
# carries the same digest is this tree's already, and is kept (CHAOSKIT_REBUILD=1 builds it anyway).
source_digest=$(git ls-files -co --exclude-standard -z -- chaoskit pyproject.toml README.md docker 2>/dev/null \
    | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
built=$(docker image inspect --format '{{index .Config.Labels "io.chaoskit.source"}}' "$TAG" 2>/dev/null || true)
if [ -z "${CHAOSKIT_REBUILD:-}" ] && [ -n "$source_digest" ] && [ "$built" = "$source_digest" ]; then
    echo "build-offline: $TAG is already built from this source (digest $source_digest)"
    exit 0
fi

wheels=build/docker-wheels
rm -rf "$wheels"
mkdir -p "$wheels"
echo "build-offline: collecting wheels into $wheels"
"$PYTHON" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$wheels" '.[workload]' numpy
rm -rf build/lib build/bdist.*   # what setuptools leaves behind building chaoskit's wheel

echo "build-offline: docker build $TAG (--network none)"
DOCKER_BUILDKIT=0 docker build --quiet --network none \
    --build-arg BASE="$BASE" \
    --build-arg PIP_ARGS="--no-index --find-links /src/$wheels" --label io.chaoskit.source="$source_digest" \
    -f docker/Dockerfile -t "$TAG" . >/dev/null
echo "build-offline: built $TAG (source digest $source_digest)"
# the images this tag named before are no longer used by anything: each is over a GiB
docker image prune --force --filter "label=io.chaoskit.image=node" >/dev/null 2>&1 || true
