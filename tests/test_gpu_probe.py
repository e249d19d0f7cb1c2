"""The NVML GPU health probe, against a STAND-IN ``pynvml`` (no GPU here).

:data:`FAKE_PYNVML` is a small module put first on ``sys.path`` for these tests only: it answers
``nvmlInit``, two devices, event registration, and serves one Xid 79 event on device 1 (then an
uncorrectable ECC event) through ``nvmlEventSetWait_v2``, timing out otherwise. The tests prove
which events chaoskit publishes, when the probe starts and that it stays silent where it cannot
run, not what a real driver reports: real NVML is only checked on a GPU machine
(bench/gpu_check.sh).
"""

from __future__ import annotations

import sys
import textwrap
import time

import pytest

from chaoskit.cluster.inventory import Node
from chaoskit.cluster.transports.local import LocalTransport
from chaoskit.measure import DETECT_KINDS, measure_fault
from chaoskit.observe.events import EventBus
from chaoskit.observe.gpu import NvmlProbe
from tests.conftest import wait_until

FAKE_PYNVML = textwrap.dedent("""\
    # Stand-in for nvidia-ml-py's pynvml (tests only): two GPUs, one Xid 79 on GPU 1, then a double-bit ECC error.
    import os, time
    NVML_ERROR_TIMEOUT = 10
    nvmlEventTypeSingleBitEccError = 1
    nvmlEventTypeDoubleBitEccError = 2
    nvmlEventTypeXidCriticalError = 8
    calls = []
    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__("NVML error %d" % value)
            self.value = value
    class Event:
        def __init__(self, device, kind, data):
            self.device, self.eventType, self.eventData = device, kind, data
    queue = []
    def nvmlInit():
        if os.environ.get("FAKE_NVML_FAIL"):
            raise NVMLError(9)  # NVML_ERROR_DRIVER_NOT_LOADED
        calls.append("init")
        queue[:] = [Event(("handle", 1), nvmlEventTypeXidCriticalError, 79), Event(("handle", 0), nvmlEventTypeDoubleBitEccError, 0)]
    def nvmlShutdown(): calls.append("shutdown")
    def nvmlDeviceGetCount(): return 2
    def nvmlDeviceGetHandleByIndex(i): return ("handle", i)
    def nvmlDeviceGetIndex(h): return h[1]
    def nvmlDeviceGetSupportedEventTypes(h): return 0xF
    def nvmlEventSetCreate(): return "set"
    def nvmlDeviceRegisterEvents(h, mask, s): calls.append(("register", h[1], mask))
    def nvmlEventSetFree(s): calls.append("free")
    def nvmlEventSetWait_v2(s, timeout_ms):
        time.sleep(0.05)
        if queue and os.environ.get("FAKE_NVML_SERVE"):
            return queue.pop(0)
        raise NVMLError(NVML_ERROR_TIMEOUT)
""")


@pytest.fixture
def fake_pynvml(tmp_path, monkeypatch):
    (tmp_path / "pynvml.py").write_text(FAKE_PYNVML)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    yield
    sys.modules.pop("pynvml", None)


def _gpu_node(name: str = "g0", gpus: int = 2) -> Node:
    return Node(name, gpus=gpus, conn=LocalTransport(name, f"nvml-test.{name}"))


def test_xid_and_ecc_events_become_timeline_events_and_detect(fake_pynvml, monkeypatch):
    """Stand-in pynvml: an Xid 79 and a double-bit ECC error are published, and the Xid is the detection."""
    monkeypatch.setenv("FAKE_NVML_SERVE", "1")
    bus = EventBus()
    probe = NvmlProbe.for_nodes(bus, [_gpu_node()])
    assert probe is not None and probe.devices == 2
    import pynvml

    assert ("register", 1, pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError) in pynvml.calls
    t_fault = time.time()
    probe.start()
    assert wait_until(lambda: len(bus.events) >= 2, 5)
    probe.stop()
    xid, ecc = bus.events
    assert xid["kind"] == "gpu.xid" and xid["xid"] == 79 and xid["device"] == 1 and xid["node"] == "g0"
    assert xid["source"] == "nvml" and xid["why"] == "Xid 79 on GPU 1"
    assert ecc["kind"] == "gpu.ecc" and ecc["device"] == 0 and ecc["errors"] == "uncorrectable"
    assert {"gpu.xid", "gpu.ecc"} <= DETECT_KINDS
    assert measure_fault(bus.events, t_fault - 0.001)["detected_by"] == "NVML on g0: Xid 79 on GPU 1"
    assert t_fault <= xid["ts"]
    assert pynvml.calls[-2:] == ["free", "shutdown"]  # NVML released when the probe stops


def test_not_started_without_gpus_in_the_inventory(fake_pynvml):
    """Stand-in pynvml present, but no node says it has GPUs: NVML is not even initialised."""
    assert NvmlProbe.for_nodes(EventBus(), [_gpu_node(gpus=0)]) is None
    assert "pynvml" not in sys.modules


def test_not_started_when_nvml_does_not_load(fake_pynvml, monkeypatch):
    """Stand-in pynvml whose nvmlInit fails as it does without a driver: no probe, nothing said."""
    monkeypatch.setenv("FAKE_NVML_FAIL", "1")
    bus = EventBus()
    assert NvmlProbe.for_nodes(bus, [_gpu_node()]) is None
    assert bus.events == []


def test_not_started_when_nvidia_ml_py_is_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    assert NvmlProbe.for_nodes(EventBus(), [_gpu_node()]) is None


def test_nvml_is_nvidia_ml_pys_module_without_the_deprecated_shadows_warning():
    """NVRx installs the deprecated ``pynvml`` package beside nvidia-ml-py: its import hook warned on every GPU
    probe's start (issue 53). The module the probe gets is nvidia-ml-py's, and no FutureWarning escapes."""
    import subprocess
    import sys

    code = ("import warnings; warnings.simplefilter('error')\n"
            "from chaoskit.observe.gpu import import_nvml\n"
            "m = import_nvml(); print(m.__file__, hasattr(m, 'nvmlInit'))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    path, has_init = res.stdout.split()
    assert path.endswith("site-packages/pynvml.py") and has_init == "True"
