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


NAMED = re.compile(r"LocalTransport|SSHTransport|Docker|torchrun|torchft|nvrx|slurm|Slurm|ray|inproc\.|mem\.oom|sbatch")
"""A transport's class, a launcher, a recovery stack, a scheduler or a kind's family, as issue 53's "done when" greps
for them (``ray`` inside another word, ``array``, counts too: the runner has no need of one)."""


def test_the_runner_names_no_launcher_scheduler_or_transport_class_anywhere() -> None:
    """Comments included: what a job, a stack or a transport does of its own is said beside it (the job's
    ``Job.folders``, ``Job.found_where``; the session's ``RunContext.controller``), not in the runner."""
    hits = [f"runner.py:{n}: {line.strip()}" for n, line in enumerate(RUNNER.read_text().splitlines(), 1)
            if NAMED.search(line)]
    assert hits == []


def test_the_runner_builds_no_probe_transport_or_record_of_its_own() -> None:
    """The session (``chaoskit/session.py``) holds the lock, journal, leases and marker; the probe set
    (``chaoskit/probeset.py``) the probes; the runner imports neither a transport nor a probe class, and reads no
    attribute that a stage may or may not have made."""
    text = RUNNER.read_text()
    imports = re.findall(r"^from (chaoskit\.[\w.]+) import", text, flags=re.M)
    assert [m for m in imports if m.startswith(("chaoskit.cluster.transports", "chaoskit.observe.", "chaoskit.safety."))
            and m != "chaoskit.observe.events" and m != "chaoskit.observe.presets"] == []
    assert re.findall(r"getattr\(self\b", text) == []
    assert "cluster.transports.local" not in text and "read_proc" not in text
