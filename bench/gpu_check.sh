#!/usr/bin/env bash
# gpu.fail, mechanism nvidia, against the reference job with NCCL on a GPU machine (not run in CI:
# there is no GPU there; the tests drive a recording stand-in nvidia-smi instead).
#
#   sudo bench/gpu_check.sh [PYTHON]     # root: nvidia-smi -c needs it
#
# Passes when: the run injected with mechanism nvidia, the device's compute mode was PROHIBITED while
# the fault lasted and is back to what it was afterwards, and no chaoskit process is left. Until this
# has passed on a GPU, chaoskit's catalog marks the nvidia mechanism "not yet verified on a GPU".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
command -v nvidia-smi >/dev/null || { echo "gpu_check: no nvidia-smi here" >&2; exit 3; }
nvidia-smi -L
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() and torch.distributed.is_nccl_available() else 1)' \
  || { echo "gpu_check: torch sees no CUDA device or no NCCL" >&2; exit 3; }
before=$(nvidia-smi -i 0 --query-gpu=compute_mode --format=csv,noheader)
out=$(mktemp -d /tmp/chaoskit-gpu-check.XXXXXX)
cat > "$out/gpu-fail-nvidia.yaml" <<'YAML'
name: gpu-fail-nvidia
description: gpu.fail with mechanism nvidia on GPU 0 of a 1-node, 1-GPU NCCL job; in place, it fails by design
cluster: {kind: process, nodes: 1}
workload:
  launch: reference               # picks NCCL when torch sees CUDA
  steps: 200
  step_time: 50ms
  checkpoint_every: 25
  max_restarts: 1
faults:
  - kind: gpu.fail
    target: {ranks: [0]}
    mechanism: nvidia
    duration: 20s
    at: {step: 30}
slo: {detection: 10s, recovery: 60s}
safety: {max_nodes: 1, abort_after: 3m}
YAML
# one node x one worker: rank 0 on GPU 0
( while sleep 0.5; do m=$(nvidia-smi -i 0 --query-gpu=compute_mode --format=csv,noheader); echo "$(date +%s.%N) $m"; done ) > "$out/modes.log" &
watcher=$!
set +e
PYTHONPATH=$PWD "$PY" -m chaoskit run "$out/gpu-fail-nvidia.yaml" --out "$out/run" --json > "$out/result.json"
rc=$?
set -e
kill "$watcher"
after=$(nvidia-smi -i 0 --query-gpu=compute_mode --format=csv,noheader)
mech=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["faults"][0].get("mechanism"))' "$out/result.json")
echo "run exit $rc; mechanism $mech; compute mode before '$before', after '$after'"
grep -q Prohibited "$out/modes.log" || { echo "FAIL: the compute mode was never PROHIBITED" >&2; exit 1; }
[ "$mech" = nvidia ] || { echo "FAIL: mechanism $mech, not nvidia" >&2; exit 1; }
[ "$before" = "$after" ] || { echo "FAIL: compute mode not restored" >&2; exit 1; }
pgrep -f chaoskit-crashloop- >/dev/null && { echo "FAIL: a crash loop is left" >&2; exit 1; }
# The NVML health probe (chaoskit[gpu]): NVML loads, sees the devices and takes Xid/ECC event registration.
"$PY" - <<'PY' || { echo "FAIL: the NVML probe did not start on this GPU machine (pip install 'chaoskit[gpu]')" >&2; exit 1; }
from chaoskit.cluster.inventory import Node
from chaoskit.cluster.transports.local import LocalTransport
from chaoskit.observe.events import EventBus
from chaoskit.observe.gpu import NvmlProbe
probe = NvmlProbe.for_nodes(EventBus(), [Node("n0", gpus=1, conn=LocalTransport("n0", "gpu-check"))])
assert probe is not None and probe.devices > 0, "NvmlProbe.for_nodes gave no probe"
probe.start(); probe.stop()
print(f"NVML probe: watching {probe.devices} GPU(s) for Xid and ECC events; errors: {probe.errors or 'none'}")
PY
echo "PASS: gpu.fail (nvidia) verified on $(nvidia-smi -i 0 --query-gpu=name --format=csv,noheader); files in $out"
