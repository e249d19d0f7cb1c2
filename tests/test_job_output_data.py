"""Job output is data (issue 31): what a job writes into the SDK's event file, or into the events a run keeps, never
ends a probe or a report. A bad line is counted, dropped, and reported once."""

from __future__ import annotations

import json
import math
import time

import pytest

from chaoskit.observe.events import EventBus, read_events
from chaoskit.observe.probes import SdkLogProbe, sdk_event
from tests.conftest import wait_until

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

BAD = [
    ('{"ts": 1.0, "kind": "step", "step": ' + "9" * 5000 + "}", "digits"),      # killed the probe before
    ("[" * 100_000 + "]" * 100_000, "deep"),                                     # RecursionError before
    ('{"ts": NaN, "kind": "step", "step": 3}', "finite"),                      # broke the HTML report before
    ('{"ts": Infinity, "kind": "step", "step": 3}', "finite"),
    ('{"ts": 1.0, "kind": "step", "step": NaN}', "whole number"),
    ('{"ts": 1e999, "kind": "step", "step": 3}', "finite"),
    ('{"ts": 1.0, "kind": "step", "step": 1.5}', "whole number"),
    ('{"ts": 1.0, "kind": "step", "step": true}', "whole number"),
    ('{"ts": 1.0, "kind": "step", "a": ' + "[" * 40 + "]" * 40 + "}", "deeper"),
    ('"just a string"', "object"),
    ('{"kind": "step", "step": 3}', "ts"),
    ("not json at all", "Expecting"),
]


def test_each_bad_line_is_no_event_and_says_why():
    for line, says in BAD:
        event, why = sdk_event(line)
        assert event is None and why and says.lower() in why.lower(), (line[:60], why)
    event, why = sdk_event('{"ts": 2.5, "kind": "step", "step": 7, "rank": 0}')
    assert why is None and event == {"ts": 2.5, "kind": "step", "step": 7, "rank": 0}
    # the job's own values may be any float: a loss gone NaN or infinite is what the loss watch is for
    event, why = sdk_event('{"ts": 2.5, "kind": "step", "step": 8, "rank": 1, "loss": NaN, "grad_norm": Infinity}')
    assert why is None and math.isnan(event["loss"]) and event["grad_norm"] == math.inf


def test_the_sdk_probe_survives_every_bad_line_and_reports_them_once(tmp_path):
    path = tmp_path / "sdk-events.jsonl"
    good = [json.dumps({"ts": time.time(), "kind": "step", "step": i, "rank": 0}) for i in (1, 2)]
    raw = (good[0] + "\n").encode() + b"".join(line.encode() + b"\n" for line, _ in BAD)
    raw += b'{"ts": 1.0, "kind": "step", "note": "\xff\xfe invalid utf-8"}\n'  # decoded with replacement: still data
    raw += (good[1] + "\n").encode()
    path.write_bytes(raw)
    bus = EventBus()
    probe = SdkLogProbe(bus, path)
    probe.start()
    try:
        assert wait_until(lambda: bus.last_step == 2, 10), bus.events  # the line after every bad one still arrives
    finally:
        probe.stop()
    assert probe.is_alive() is False
    assert [e.get("step") for e in bus.events if e["kind"] == "step"] == [1, None, 2]
    assert probe.bad == len(BAD)
    [note] = probe.errors
    assert f"{len(BAD)} line(s) of sdk-events.jsonl were no event and were dropped" in note


def test_the_html_report_renders_whatever_the_events_file_holds(tmp_path):
    from chaoskit.report.html import write_run_report

    run = tmp_path / "run"
    run.mkdir()
    t = time.time()
    lines = [json.dumps({"ts": t, "kind": "step", "step": 1, "node": "n0"}).encode(),
             b'{"ts": NaN, "kind": "step", "step": 2, "node": "n0"}',
             b'{"ts": ' + str(t + 1).encode() + b', "kind": "step", "step": NaN, "node": "n0"}',
             b'{"ts": 1.0, "kind": "step", "step": ' + b"9" * 5000 + b"}",
             b"\xff\xfe not utf-8",
             b"[" * 50_000,
             b'{"ts": ' + str(t + 1.5).encode() + b', "kind": "step", "step": 2, "node": "n0", "loss": NaN}',
             json.dumps({"ts": t + 2, "kind": "step", "step": 3, "node": "n0"}).encode()]
    (run / "events.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    assert [e["step"] for e in read_events(run / "events.jsonl")] == [1, 2, 3]
    out = write_run_report(run)
    assert out.is_file() and "<html" in out.read_text()
