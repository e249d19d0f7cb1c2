"""GPU health through NVML: Xid errors and uncorrectable ECC errors become ``gpu.xid`` / ``gpu.ecc`` events.

A GPU that fails reports it before the job does: the driver raises an Xid (79:
fallen off the bus, 48: double-bit ECC, 63/64: row remapping, ...) and NVML
delivers it as an event (``nvmlEventTypeXidCriticalError``,
``nvmlEventTypeDoubleBitEccError``). Both are detection sources
(:data:`chaoskit.measure.DETECT_KINDS`).

NVML comes from ``nvidia-ml-py`` (``pip install 'chaoskit[gpu]'``), imported only
here and only when some node has GPUs. The probe starts only where the inventory
says a node has GPUs (``Node.gpus > 0``) **and** NVML loads and initialises;
otherwise it is not started and says nothing.

:class:`NvmlProbe` reads NVML in the controller's process: this machine's GPUs,
for the nodes whose transport is local (the controller is the node).
:class:`RemoteNvmlProbe` reads every other GPU node's own GPUs through its agent
(:class:`~chaoskit.cluster.transports.api.GpuEventStreamer`: the agent's ``nvml``
stream loads ``libnvidia-ml.so.1`` with ctypes there, stdlib only); each event
keeps the node's time, corrected by its measured clock offset. A node where NVML
does not load says so once in ``errors`` and is not asked again.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from chaoskit.cluster.inventory import Node
from chaoskit.cluster.transports.api import GpuEventStreamer, NvmlBatch
from chaoskit.cluster.transports.local import LocalTransport
from chaoskit.core.errors import InfraError
from chaoskit.observe.events import EventBus, make_event

__all__ = ["NvmlProbe", "RemoteNvmlProbe", "WAIT_MS", "import_nvml"]

WAIT_MS = 200
"""How long one ``nvmlEventSetWait`` blocks: the probe's reaction time to ``stop``."""


class NvmlProbe(threading.Thread):
    """Wait on NVML's event set of this machine's GPUs; publish each Xid and uncorrectable ECC event."""

    def __init__(self, bus: EventBus, nvml: Any, nodes: dict[str, Any]) -> None:
        super().__init__(daemon=True, name="chaoskit-nvml")
        self.bus, self.nvml, self.nodes = bus, nvml, nodes
        self.stop_event = threading.Event()
        self.errors: list[str] = []
        self.events = 0
        self.mask = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
        self.event_set = nvml.nvmlEventSetCreate()
        self.devices = 0
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            try:
                supported = nvml.nvmlDeviceGetSupportedEventTypes(handle) & self.mask
                if supported:
                    nvml.nvmlDeviceRegisterEvents(handle, supported, self.event_set)
                    self.devices += 1
            except nvml.NVMLError as exc:  # a device without event support (or not ours to watch) is skipped
                self.errors.append(f"GPU {index}: {exc}")

    @classmethod
    def for_nodes(cls, bus: EventBus, nodes: list[Node]) -> "NvmlProbe | None":
        """The probe for this machine's GPUs, or ``None`` when no local node has GPUs, NVML is not installed
        (``chaoskit[gpu]``) or does not initialise (no driver), or no device takes events."""
        local = {n.name: n.conn for n in nodes if n.gpus > 0 and isinstance(n.conn, LocalTransport)}
        if not local:
            return None
        try:
            pynvml = import_nvml()
            pynvml.nvmlInit()
        except Exception:  # noqa: BLE001 - ImportError, or NVMLError when there is no driver: not started
            return None
        try:
            probe = cls(bus, pynvml, local)
        except Exception:  # noqa: BLE001 - NVML answered but cannot watch: not started, says nothing
            pynvml.nvmlShutdown()
            return None
        if probe.devices == 0:
            probe._close()
            return None
        return probe

    def run(self) -> None:
        nvml = self.nvml
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        try:
            while not self.stop_event.is_set():
                try:
                    data = wait(self.event_set, WAIT_MS)
                except nvml.NVMLError as exc:
                    if getattr(exc, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                        continue
                    self.errors.append(str(exc))
                    self.stop_event.wait(1.0)
                    continue
                self._publish(data, time.time())
        finally:
            self._close()

    def _publish(self, data: Any, ts: float) -> None:
        nvml = self.nvml
        try:
            device = int(nvml.nvmlDeviceGetIndex(data.device))
        except Exception:  # noqa: BLE001 - the device may be gone (Xid 79): say so, keep the event
            device = None
        node = self._node_of(device)
        where = f"GPU {device}" if device is not None else "a GPU"
        if data.eventType & nvml.nvmlEventTypeXidCriticalError:
            xid = int(data.eventData)
            event = make_event("gpu.xid", ts, node=node, rank=None, device=device, xid=xid, source="nvml",
                               who="NVML", why=f"Xid {xid} on {where}")
        else:
            event = make_event("gpu.ecc", ts, node=node, rank=None, device=device, errors="uncorrectable",
                               source="nvml", who="NVML", why=f"uncorrectable (double-bit) ECC error on {where}")
        self.events += 1
        self.bus.publish(event)

    def _node_of(self, device: int | None) -> str:
        """The node the device belongs to: the one local GPU node, else the node whose worker uses the device."""
        names = list(self.nodes)
        if len(names) == 1 or device is None:
            return names[0]
        for name, transport in self.nodes.items():
            try:
                procs = transport.processes()
            except Exception:  # noqa: BLE001
                continue
            for p in procs:
                visible = [v for v in p.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip().isdigit()]
                local = int(p.env.get("LOCAL_RANK", "0")) if p.env.get("LOCAL_RANK", "0").isdigit() else 0
                uses = int(visible[local]) if local < len(visible) else local
                if p.is_worker and uses == device:
                    return name
        return names[0]

    def _close(self) -> None:
        try:
            self.nvml.nvmlEventSetFree(self.event_set)
        except Exception:  # noqa: BLE001
            pass
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=2)


RETRY_S = 2.0
"""How long a node's ``nvml`` stream waits before starting again after its connection dropped."""


class RemoteNvmlProbe(threading.Thread):
    """Each GPU node's own NVML, read by its agent (one ``nvml`` stream per node, started again after a drop):
    publish ``gpu.xid`` and ``gpu.ecc`` for the node, at the node's time of the event."""

    def __init__(self, bus: EventBus, transports: dict[str, Any], retry_s: float = RETRY_S) -> None:
        super().__init__(daemon=True, name="chaoskit-nvml-nodes")
        self.bus, self.transports, self.retry_s = bus, transports, retry_s
        self.stop_event = threading.Event()
        self.errors: list[str] = []
        self.events = 0
        self.gpus: dict[str, list[tuple[int, str | None]]] = {}
        """node -> the GPUs its NVML watches (index, PCI bus id), once its stream started."""
        self.started = {name: threading.Event() for name in transports}
        self._streams: dict[str, Any] = {}
        self._threads = [threading.Thread(target=self._follow, args=(name,), daemon=True, name=f"chaoskit-nvml-{name}")
                         for name in transports]

    @classmethod
    def for_nodes(cls, bus: EventBus, nodes: list[Node]) -> "RemoteNvmlProbe | None":
        """The probe for the nodes with GPUs (``gpus > 0``) whose agent can read NVML there, or ``None``."""
        remote = {n.name: n.conn for n in nodes
                  if n.gpus > 0 and not isinstance(n.conn, LocalTransport) and isinstance(n.conn, GpuEventStreamer)}
        return cls(bus, remote) if remote else None

    def start(self) -> None:
        super().start()
        for t in self._threads:
            t.start()

    def run(self) -> None:
        self.stop_event.wait()

    def _follow(self, node: str) -> None:
        transport = self.transports[node]
        while not self.stop_event.is_set():
            try:
                stream = transport.nvml(lambda batch: self._batch(node, batch))
            except InfraError as exc:
                self._note(f"{node}: {exc.message}")
                self.stop_event.wait(self.retry_s)
                continue
            self._streams[node] = stream
            while not stream.done.wait(1.0):
                if self.stop_event.is_set():
                    stream.cancel()
                    return
            if stream.error:
                self._note(f"{node}: {stream.error}")
                if "NVML is not on this node" in stream.error or "no GPU of this node" in stream.error:
                    return  # nothing to read there: said once, not asked again
            self.stop_event.wait(self.retry_s)

    def _batch(self, node: str, batch: NvmlBatch) -> None:
        if batch.started:
            self.gpus[node] = list(batch.gpus or [])
            self.started[node].set()
        clock = getattr(self.transports[node], "clock", None)
        extra = {"ts_uncertainty": clock.error_s} if getattr(clock, "error_s", None) else {}
        for ts, device, pci, kind, data in batch.events:
            where = f"GPU {device}" if device is not None else "a GPU"
            fields = {"pci": pci} if pci else {}
            if kind == "xid":
                event = make_event("gpu.xid", ts, node=node, rank=None, device=device, xid=data, source="nvml",
                                   who="NVML (on the node)", why=f"Xid {data} on {where}", **fields, **extra)
            else:
                event = make_event("gpu.ecc", ts, node=node, rank=None, device=device, errors="uncorrectable",
                                   source="nvml", who="NVML (on the node)",
                                   why=f"uncorrectable (double-bit) ECC error on {where}", **fields, **extra)
            self.events += 1
            self.bus.publish(event)

    def _note(self, message: str) -> None:
        if not self.errors or self.errors[-1] != message:
            self.errors.append(message)

    def stop(self) -> None:
        self.stop_event.set()
        for stream in list(self._streams.values()):
            stream.cancel()
        for t in self._threads:
            t.join(timeout=3)
        self.join(timeout=2)


def import_nvml():
    """nvidia-ml-py's ``pynvml`` module (heavy, optional, and only for GPU nodes: imported here, when used).

    NVRx pulls in the deprecated ``pynvml`` package, which installs nothing of its own but an import hook that
    warns (FutureWarning) on every ``import pynvml`` and then lets nvidia-ml-py's module load: the module is the
    right one, so that one warning, and no other, is kept out of the run's output."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The pynvml package is deprecated", category=FutureWarning)
        import pynvml
    return pynvml
