"""NVIDIA Xid lines: the driver's own format, the codes chaoskit writes, and how a line is read back.

The driver logs a GPU error to the kernel log as::

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.

(``PCI:DDDD:BB:DD``: the device's PCI domain, bus and device, no function.) Site health checks (NHC-style
scripts, gpud, NVSentinel's syslog monitor) match exactly that shape, so ``gpu.xid`` writes it unchanged and
adds its marker at the end (:data:`MARKER`), which :func:`parse_xid` reads as ``injected``: chaoskit's own
probes never take a drill's line for a real failure, and a person reading ``dmesg`` sees what it was.

Shared by ``faults/gpu.py`` (which writes lines) and ``observe/kmsg.py`` (which reads them), and by the
catalog (``coverage.py``), which maps the codes to fault classes.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

__all__ = ["XID_MESSAGES", "FATAL", "SOFTWARE", "MEMORY", "MARKER", "XidLine", "format_xid", "parse_xid",
           "normalize_pci", "PCI_RE", "lab_pci"]

XID_MESSAGES: dict[int, str] = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f1c_c0000000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_READ",
    43: "Ch 00000008, engmask 00000101, intr 10000000",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to mark a row for remapping, reset gpu to retry.",
    74: "NVLink: fatal error detected on link 0(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
}
"""The codes ``gpu.xid`` writes, each with the text the driver logs for it (NVIDIA's Xid catalog): 13 graphics
engine exception, 31 GPU memory page fault, 43 GPU stopped processing (the three an application's own bug
raises), 48 double-bit ECC, 63/64 row remapping recorded/failed, 74 NVLink error, 79 fallen off the bus,
94/95 contained/uncontained ECC error."""

FATAL = frozenset({48, 64, 74, 79, 95})
"""Codes after which the device is not fit for work until a reset or a repair: what a health check drains a
node for (63 asks for a reset at the next chance, 94 was contained to the application, 13/31/43 are the
application's own)."""
SOFTWARE = frozenset({13, 31, 43})
"""Codes an application raises (a bad kernel, an illegal address, a hung context): the catalog's "Driver or
CUDA error" class."""
MEMORY = frozenset({48, 63, 64, 94, 95})
"""Codes of the GPU's memory (ECC, row remapping): the catalog's "GPU memory" class; the rest of the fatal
ones (74, 79) are the "GPU" class."""

MARKER = "(chaoskit drill {token}: injected, not a hardware fault)"
"""Put at the end of every line ``gpu.xid`` writes; ``token`` names the drill's fault."""
_MARKED = re.compile(r"\(chaoskit drill (?P<token>[0-9a-f]{8,32}): injected, not a hardware fault\)")

PCI_RE = r"(?:[0-9A-Fa-f]{4}|[0-9A-Fa-f]{8}):[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
"""A PCI bus id as nvidia-smi (``00000000:3B:00.0``), lspci (``0000:3b:00.0``) or the Xid line (``0000:3b:00``) writes it."""
_LINE = re.compile(r"NVRM: Xid \(PCI:(?P<pci>" + PCI_RE + r")\): (?P<code>\d{1,4})(?:, pid=(?P<pid>[^,]*), name=(?P<name>[^,]*))?, ?(?P<message>.*)")


@dataclass(frozen=True)
class XidLine:
    pci: str
    """Normalised (:func:`normalize_pci`): ``0000:3b:00``."""
    code: int
    pid: str | None
    name: str | None
    message: str
    """The driver's text, the marker left out."""
    injected: bool
    token: str | None
    """The marker's token (the drill's fault) when injected."""

    @property
    def fatal(self) -> bool:
        return self.code in FATAL


def normalize_pci(text: str) -> str:
    """``DDDD:BB:DD`` in lower case (domain, bus, device; no function), as the Xid line names a device, from any
    of the forms :data:`PCI_RE` takes. ValueError for anything else."""
    if not re.fullmatch(PCI_RE, text.strip()):
        raise ValueError(f"not a PCI bus id: {text!r} (e.g. 0000:3b:00.0)")
    domain, bus, rest = text.strip().split(":")
    device = rest.split(".")[0]
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}"


def format_xid(pci: str, code: int, token: str, pid: int | None = None, name: str | None = None) -> str:
    """The driver's line for ``code`` on the device ``pci``, with chaoskit's marker (``token``) at the end.
    ``pid``/``name``: the process the driver names (the driver writes ``'<unknown>'`` when it has none)."""
    if code not in XID_MESSAGES:
        raise ValueError(f"Xid {code} is not one chaoskit writes (it writes {', '.join(map(str, sorted(XID_MESSAGES)))})")
    if not re.fullmatch(r"[0-9a-f]{8,32}", token):
        raise ValueError(f"not a marker token: {token!r}")
    proc = f"pid={int(pid)}" if pid is not None else "pid='<unknown>'"
    comm = re.sub(r"[^A-Za-z0-9_.:/-]", "_", name or "")[:15] or "'<unknown>'"
    return (f"NVRM: Xid (PCI:{normalize_pci(pci)}): {code}, {proc}, name={comm}, {XID_MESSAGES[code]} "
            + MARKER.format(token=token))


def parse_xid(message: str) -> XidLine | None:
    """The Xid in one kernel log message (the record's text, without the ``/dev/kmsg`` prefix), or ``None``."""
    m = _LINE.search(message)
    if m is None:
        return None
    text = m["message"]
    marked = _MARKED.search(text)
    if marked:
        text = (text[: marked.start()] + text[marked.end():]).strip()
    return XidLine(normalize_pci(m["pci"]), int(m["code"]), m["pid"], m["name"], text.strip(),
                   marked is not None, marked["token"] if marked else None)


def lab_pci(lab_id: str, index: int) -> str:
    """The emulated PCI bus id of the GPU of node number ``index`` of lab ``lab_id`` (the labs have no GPUs): a
    PCI domain ``cXXX`` drawn from the lab's id (no machine here has such a domain; two labs on one kernel have
    different ones), bus ``index``; so a lab's Xid line names one node of one lab."""
    if not 0 <= index < 256:
        raise ValueError(f"a lab node index is 0-255, not {index}")
    domain = 0xC000 | (int(hashlib.sha256(lab_id.encode()).hexdigest()[:3], 16))
    return f"{domain:04x}:{index:02x}:00.0"
