"""The runner only runs (issue 53, item 1): what is particular to a fault kind, a launch or a transport is asked of
the object (``Fault.uses_inproc_channel``, ``Injection.oom_cgroup``, ``LaunchSpec.checkpoints``,
``Transport.has_own_clock``...), never decided in ``runner.py`` by a name. A new kind, launch or transport then
needs no edit there."""

from __future__ import annotations

import re

from chaoskit.cluster.transports.registry import transport_names
from chaoskit.core.launches import LAUNCHES
from chaoskit.faults.registry import FAULTS
from tests.conftest import ROOT

RUNNER = ROOT / "chaoskit" / "runner.py"


def test_the_runner_names_no_fault_kind_launch_or_transport() -> None:
    text = RUNNER.read_text()
    kinds = FAULTS.names()
    families = {k.split(".")[0] for k in kinds}
    named = [k for k in kinds if re.search(rf"[\"']{re.escape(k)}[\"']", text)]
    named += [f + "." for f in families if re.search(rf"[\"']{re.escape(f)}\.", text)]
    named += [n for n in transport_names() if re.search(rf"[\"']{re.escape(n)}[\"']", text)]
    # a launch name is also a common word ("command" is a key of the dry run's plan): a comparison is what counts
    named += [m.group(0) for m in re.finditer(r"launch\s*(?:==|!=|in)\s*[\"'(\[]", text)]
    named += [m.group(0) for m in re.finditer(r"isinstance\([^)]*Transport\)", text)]
    named += [n for n in LAUNCHES if "-" in n and n in text]  # ray-train: never a word of anything else
    assert named == []
