"""The HTML report and the JUnit XML, built from run folders shaped like real ones.

The folders here are synthetic: timelines with the event kinds, fields and
rhythm of a real 3-node kill drill (see tests/test_gameday.py for the real
thing), measured by chaoskit's own ``measure_fault`` and ``slo_verdict``, so
each result.json is what the runner would have written for that timeline.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from chaoskit.coverage import Capabilities
from chaoskit.gameday import GAMEDAY_FILE, HISTORY_FILE, summarize
from chaoskit.measure import measure_fault, slo_verdict
from tests.conftest import ROOT, need, run_cli

ARTIFACTS = ROOT / "reports" / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]
T0 = 1_800_000_000.0
SLO = {"detection": 5.0, "reallocation": 30.0, "checkpoint_load": 30.0, "recovery": 60.0, "lost_steps": 25}
CAPS = Capabilities(frozenset({"process.kill", "process.hang"}), {"gpu": "no GPU here"})


# -- synthetic but realistic run folders ------------------------------------------------


def synth_events(*, kind: str = "process.kill", steps: int = 200, fault_step: int = 60, every: int = 25,
                 step_time: float = 0.05, ranks: int = 3, recover: bool = True, migrate_to: str | None = None,
                 t0: float = T0) -> list[dict]:
    """The timeline of a 3-node DDP job that loses rank 1 at ``fault_step``."""
    ev: list[dict] = []

    def add(ts: float, kind_: str, **fields) -> None:
        ev.append({"ts": round(ts, 6), "kind": kind_, **fields})

    def train(first: int, last: int, start: float, pids: dict[int, int], nodes: dict[int, str]) -> float:
        ts = start
        for s in range(first, last + 1):
            ts += step_time
            for r in range(ranks):
                add(ts + r * 0.002, "step", node=nodes[r], rank=r, pid=pids[r], step=s, loss=round(30 / s, 4), source="sdk")
            if s % every == 0:
                add(ts + 0.01, "ckpt.save.start", node=nodes[0], rank=0, pid=pids[0], step=s, source="sdk")
                add(ts + 0.012, "ckpt.save.end", node=nodes[0], rank=0, pid=pids[0], step=s, bytes=11551, source="sdk")
        return ts

    nodes = {r: f"n{r}" for r in range(ranks)}
    pids = {r: 4300 + r for r in range(ranks)}
    for r in range(ranks):
        add(t0 + r * 0.01, "worker.start", node=nodes[r], rank=r, pid=pids[r], restart_count=0, world_size=ranks, source="sdk")
        add(t0 + 2.2, "rendezvous.done", node=nodes[r], rank=r, pid=pids[r], world_size=ranks, source="sdk")
    t = train(1, fault_step, t0 + 4.0, pids, nodes)
    t_fault = t + 0.02
    add(t_fault, "fault.injected", node="n1", fault="f0", fault_kind=kind, targets=["n1/rank1"], source="chaoskit")
    add(t_fault + 0.01, "process.gone", node="n1", rank=1, pid=pids[1], source="procwatch")
    add(t_fault + 0.03, "detect", node="n2", rank=2, pid=pids[2], why="collective error", source="sdk")
    add(t_fault + 0.11, "worker.exit", node="n1", source="torchrun", who="torchrun agent", exitcode=-9, pid=pids[1])
    for r in (0, 2):
        add(t_fault + 0.6, "process.gone", node=nodes[r], rank=r, pid=pids[r], source="procwatch")
    if not recover:
        return sorted(ev, key=lambda e: e["ts"])
    new_nodes = dict(nodes)
    if migrate_to:
        new_nodes[1] = migrate_to
    new_pids = {r: 5400 + r for r in range(ranks)}
    restored = fault_step // every * every
    for r in range(ranks):
        add(t_fault + 2.3 + r * 0.01, "worker.start", node=new_nodes[r], rank=r, pid=new_pids[r], restart_count=int(r == 1), world_size=ranks, source="sdk")
        add(t_fault + 4.4, "rendezvous.done", node=new_nodes[r], rank=r, pid=new_pids[r], world_size=ranks, source="sdk")
        add(t_fault + 6.2 + r * 0.1, "ckpt.load.start", node=new_nodes[r], rank=r, pid=new_pids[r], source="sdk")
        add(t_fault + 6.21 + r * 0.1, "ckpt.load.end", node=new_nodes[r], rank=r, pid=new_pids[r], step=restored, bytes=11551, source="sdk")
    t = train(restored + 1, steps, t_fault + 6.45, new_pids, new_nodes)
    for r in range(ranks):
        add(t + 3.0, "process.gone", node=new_nodes[r], rank=r, pid=new_pids[r], source="procwatch")
    return sorted(ev, key=lambda e: e["ts"])


def synth_run(run_dir: Path, name: str = "kill-rank", *, slo: dict | None = None, write_result: bool = True,
              notes: list[str] | None = None, **kw) -> dict:
    """Write a run folder (events.jsonl, journal.jsonl and, unless told not to, result.json)."""
    slo = SLO if slo is None else slo
    events = synth_events(**kw)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    fault = next(e for e in events if e["kind"] == "fault.injected")
    (run_dir / "journal.jsonl").write_text(json.dumps({"ts": fault["ts"], "action": "injected", "fault_id": "f0", "kind": fault["fault_kind"]}) + "\n")
    m = measure_fault(events, fault["ts"])
    verdicts = slo_verdict(m, slo)
    final = max(e["step"] for e in events if e["kind"] == "step")
    checks = {"steady_state": {"pass": True, "step": 3}, "training_finished": {"pass": final >= kw.get("steps", 200), "final_step": final, "expected_step": kw.get("steps", 200)}}
    nodes = sorted({e["node"] for e in events if e.get("node")})
    result = {
        "scenario": name, "scenario_file": f"scenarios/{name}.yaml",
        "verdict": "pass" if all(v["pass"] for v in verdicts.values()) and all(c["pass"] for c in checks.values()) else "fail",
        "started_at": "2027-01-15T02:00:00.000Z", "ended_at": "2027-01-15T02:00:31.000Z", "duration_s": 31.0,
        "run_dir": str(run_dir), "cluster": {"kind": "process", "id": "lab-test", "nodes": [{"name": n, "labels": {}} for n in nodes]},
        "workload": {"launch": "reference", "steps": kw.get("steps", 200)},
        "faults": [{"kind": fault["fault_kind"], "fault": "f0", "node": "n1", "targets": ["n1/rank1"], "t_fault": fault["ts"]}],
        "phases": {k: m[k] for k in ("detection_s", "reallocation_s", "checkpoint_load_s", "startup_s", "recovery_s", "lost_steps",
                                    "restored_step", "last_step_before", "detected_by", "reasons")},
        "slo": verdicts, "checks": checks,
        "per_fault": [{"fault": "f0", "kind": fault["fault_kind"], "node": "n1", "targets": ["n1/rank1"], **m}],
        "final_step": final, "notes": notes or [],
    }
    if write_result:
        (run_dir / "result.json").write_text(json.dumps(result, indent=2))
    return result


def record_for(index: int, result: dict | None, *, file: str | None = None, status: str | None = None, error: dict | None = None) -> dict:
    """A game-day record as run_gameday keeps it."""
    name = result["scenario"] if result else Path(file or "x.yaml").stem
    kinds = [f["kind"] for f in result["faults"]] if result else []
    covers = {"process.kill": ["software.crash"], "process.hang": ["software.hang"]}.get(kinds[0], []) if kinds else []
    return {
        "index": index, "file": file or (result or {}).get("scenario_file", f"{name}.yaml"), "scenario": name,
        "dir": f"{index:02d}-{name}", "category": "software" if covers else "uncategorised", "covers": covers, "kinds": kinds,
        "injected_kinds": kinds, "status": "error" if error else status or (result or {}).get("verdict"),
        "verdict": (result or {}).get("verdict"), "exit_code": None, "started_at": "2027-01-15T02:00:00.000Z",
        "ended_at": "2027-01-15T02:00:31.000Z", "duration_s": 31.0 if result else 0.1,
        "phases": (result or {}).get("phases"), "slo": (result or {}).get("slo"), "checks": (result or {}).get("checks"),
        "notes": (result or {}).get("notes", []), "error": error,
    }


def synth_gameday(gd_dir: Path, records: list[dict], *, history: list[dict] | None = None) -> dict:
    summary = summarize(gd_dir.name, records, CAPS, started=T0, ended=T0 + 120)
    gd_dir.mkdir(parents=True, exist_ok=True)
    (gd_dir / GAMEDAY_FILE).write_text(json.dumps(summary, indent=2))
    if history is not None:
        (gd_dir.parent / HISTORY_FILE).write_text("".join(json.dumps(h) + "\n" for h in history))
    return summary


@pytest.fixture
def mixed_gameday(tmp_path: Path) -> Path:
    """Four scenarios: a pass (rank moved to a spare node), an SLO failure, a run that
    crashed half way, and one that could not start."""
    gd = tmp_path / "gameday-mixed"
    ok = synth_run(gd / "01-kill-rank", "kill-rank", migrate_to="n3")
    slow = synth_run(gd / "02-hang-rank", "hang-rank", kind="process.hang", slo={**SLO, "detection": 0.01})
    crashed = synth_run(gd / "03-kill-crash", "kill-crash", write_result=False, recover=False)
    (gd / "04-broken").mkdir(parents=True)
    err = {"type": "ScenarioError", "message": "broken.yaml:3:1: unknown key 'faultz'", "hint": None}
    (gd / "04-broken" / "error.json").write_text(json.dumps(err))
    records = [record_for(1, ok), record_for(2, slow), record_for(3, crashed,
               error={"type": "InfraError", "message": "the training job ended before step 60", "hint": "see logs"}),
               record_for(4, None, file="scenarios/broken.yaml", error=err)]
    records[3]["dir"] = "04-broken"
    history = [{"started_at": f"2027-01-{d:02d}T02:00:00.000Z", "plain": p, "weighted": w, "passed": 2, "scenarios": 3}
               for d, p, w in ((12, 0.0714, 0.1336), (13, 0.0714, 0.1336), (14, 0.1429, 0.1504))]
    synth_gameday(gd, records, history=history)
    res = run_cli("report", gd)
    assert res.code == 0, res.stderr
    return gd


# -- the page in a real browser -----------------------------------------------------------


def _playwright():
    """Playwright's sync API driving Debian's chromium; skip (fail under CI) saying what to install."""
    need(CHROMIUM.exists(), "Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        need(False, "playwright (pip install -e '.[dev]'; never 'playwright install': the browser comes from apt)")
    return sync_playwright


TABS = ("overview", "health", "checkpoint", "migration", "coverage")


def test_report_works_in_a_browser_offline(mixed_gameday: Path) -> None:
    sync_playwright = _playwright()
    index = mixed_gameday / "index.html"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    requests, problems = [], []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.goto(index.as_uri())
            assert page.title() == "chaoskit game day: gameday-mixed"
            for tab in TABS:
                page.click(f"#tab-{tab}")
                assert page.get_attribute(f"#tab-{tab}", "aria-selected") == "true"
                for other in TABS:
                    assert page.is_visible(f"#panel-{other}") == (other == tab), (tab, other)
                page.screenshot(path=str(ARTIFACTS / f"report-{tab}.png"), full_page=True)
            # The per-scenario tabs follow the scenario picker.
            page.click("#tab-migration")
            assert page.is_visible("#scenario")
            page.select_option("#scenario", "s1")
            panel = page.locator("#panel-migration [data-scn=s1]")
            assert panel.is_visible() and not page.locator("#panel-migration [data-scn=s2]").is_visible()
            assert "1 migrated to another node" in panel.inner_text()
            box = panel.locator("svg").bounding_box()
            assert box and box["width"] > 300 and box["height"] > 50
            page.screenshot(path=str(ARTIFACTS / "report-migration-s1.png"), full_page=True)
            page.click("#tab-health")
            page.select_option("#scenario", "s3")
            health = page.locator("#panel-health [data-scn=s3]")
            assert health.is_visible() and "did not finish" in health.inner_text()
            page.click("#tab-coverage")
            assert not page.is_visible("#scenario")  # the picker only shows on per-scenario tabs
            assert page.locator("#panel-coverage svg circle").count() == 2 * 3  # the trend: plain and weighted dots
        finally:
            browser.close()
    assert problems == []
    outside = [u for u in requests if not u.startswith("file://")]
    assert outside == [], f"requests left file://: {outside}"
    assert requests == [index.as_uri()]


# -- content -------------------------------------------------------------------------------


def test_report_is_self_contained(mixed_gameday: Path) -> None:
    html = (mixed_gameday / "index.html").read_text()
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert re.findall(r"""(?:src|href)\s*=\s*["'](?!#)""", html) == []
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html
    assert "@import" not in html and "url(" not in html


def test_report_shows_each_scenario_and_its_state(mixed_gameday: Path) -> None:
    html = (mixed_gameday / "index.html").read_text()
    # one overview card per scenario, and each per-scenario tab has a section for each
    assert len(re.findall(r'<div class="card" id="s\d+">', html)) == 4
    for tab in ("health", "checkpoint", "migration"):
        panel = html.split(f'id="panel-{tab}"')[1].split("</section>")[0]
        assert len(re.findall(r'data-scn="s\d"', panel)) == 4
    # the crashed run: measured from its events, no verdict, and said so
    assert "The run did not finish: result.json is missing" in html
    # the scenario that could not start shows its error
    assert "unknown key &#39;faultz&#39;" in html
    # the SLO failure is visible with the failing phase
    assert "FAIL" in html and "phase over its SLO" in html
    # coverage: the pass covers software.crash (56 of 419); the hang failed its SLO
    assert "1/18" in html and "13.4%" in html
    failed_row = html.split("<b>software.hang</b>")[1].split("</tr>")[0]
    assert "failed" in failed_row and "hang-rank (fail)" in failed_row


def test_report_escapes_what_it_shows(tmp_path: Path) -> None:
    evil = "<script>alert(1)</script>"
    synth_run(tmp_path / "run", "kill-rank", notes=[f"note {evil}"])
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    result["phases"]["detected_by"] = f"sdk on n2/rank2: {evil}"
    (tmp_path / "run" / "result.json").write_text(json.dumps(result))
    res = run_cli("report", tmp_path / "run")
    assert res.code == 0 and res.stdout.strip() == str(tmp_path / "run" / "report.html")
    html = (tmp_path / "run" / "report.html").read_text()
    assert evil not in html
    assert "note &lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_report_of_a_run_that_crashed_half_way(tmp_path: Path) -> None:
    run = tmp_path / "run"
    synth_run(run, write_result=False)
    with open(run / "events.jsonl", "a") as fh:
        fh.write('{"ts": 1800000099.1, "kind": "st')  # the process died mid-line
    res = run_cli("report", run)
    assert res.code == 0, res.stderr
    html = (run / "report.html").read_text()
    assert "The run did not finish" in html
    # what the events allow is still measured: detection 0.03 s, 10 steps lost
    assert "0.030s" in html and "10 steps" in html
    assert "rolled back to step 50" in html


def test_run_report_comes_from_the_runs_files_alone(tmp_path: Path) -> None:
    """What the drill's machine could not run is recorded in result.json when it ran; the report,
    rebuilt anywhere later, shows that and not what the machine rendering it can do."""
    run = tmp_path / "run"
    result = synth_run(run)
    result["capabilities"] = {"kinds": ["process.kill"], "missing": {"gpu": "no GPU on the drill machine"}}
    (run / "result.json").write_text(json.dumps(result))
    res = run_cli("report", run)
    assert res.code == 0, res.stderr
    html = (run / "report.html").read_text()
    assert "no GPU on the drill machine" in html
    assert "cluster process lab-test" in html


def test_node_clocks_and_each_phases_uncertainty_are_shown(tmp_path: Path) -> None:
    """A run over nodes with clocks of their own: each node's measured offset, and each phase's ± (its two
    ends read on different machines' clocks) next to the phase."""
    run = tmp_path / "run"
    result = synth_run(run)
    result["clocks"] = {"n1": {"offset_s": 7.5012, "uncertainty_s": 0.0007}, "n0": {"offset_s": -4.0, "uncertainty_s": 0.0009}}
    result["phases"]["uncertainty_s"] = {"detection": 0.0016, "reallocation": 0.0, "checkpoint_load": None, "recovery": 0.0007}
    (run / "result.json").write_text(json.dumps(result))
    assert run_cli("report", run).code == 0
    html = (run / "report.html").read_text()
    assert "+7501.2ms" in html and "± 0.7ms" in html and "-4000.0ms" in html
    detection = result["phases"]["detection_s"]
    assert f"{detection:.3f}s ± 1.6ms" in html


def test_report_shows_the_slowdown_of_a_straggler(tmp_path: Path) -> None:
    """node.slow's measures (result.json["slowdown"]) get a table of their own; a run without them shows none."""
    run = tmp_path / "run"
    result = synth_run(run)
    result["slowdown"] = {"step_time_before_s": 0.052, "step_time_during_s": 0.21, "step_time_after_s": 0.053,
                          "throughput_lost_pct": 75.2, "recovery_after_revert_s": None,
                          "reasons": {"recovery_after_revert_s": "the step time never came back within 1.25x of before"}}
    (run / "result.json").write_text(json.dumps(result))
    res = run_cli("report", run)
    assert res.code == 0, res.stderr
    html = (run / "report.html").read_text()
    assert "<h3>Slowdown</h3>" in html and "75.2 %" in html and "0.210 s" in html and "0.052 s" in html
    assert "never came back within 1.25x" in html
    plain = tmp_path / "plain"
    synth_run(plain)
    assert run_cli("report", plain).code == 0 and "<h3>Slowdown</h3>" not in (plain / "report.html").read_text()


def test_a_failed_check_says_what_was_expected_and_what_was_seen(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from chaoskit.report.summary import render_result

    run = tmp_path / "run"
    result = synth_run(run)
    result["checks"]["training_finished"] = {"pass": False, "final_step": 150, "expected_step": 200}
    result["verdict"] = "fail"
    (run / "result.json").write_text(json.dumps(result))
    expected = "training_finished: expected the job to reach step 200, it stopped at step 150"
    assert run_cli("report", run).code == 0
    assert expected in (run / "report.html").read_text()
    out = io.StringIO()
    render_result(Console(file=out, width=200), result)
    assert f"check failed: {expected}" in out.getvalue()


def test_report_of_a_folder_without_a_run_is_bad_input(tmp_path: Path) -> None:
    res = run_cli("report", tmp_path)
    assert res.code == 2
    assert "no gameday.json, result.json or events.jsonl" in res.stderr


def test_twenty_scenario_report_stays_under_one_megabyte(tmp_path: Path) -> None:
    gd = tmp_path / "gameday-20"
    records = []
    for i in range(1, 21):
        kind = "process.hang" if i % 3 == 0 else "process.kill"
        # longer jobs than the shipped scenarios: 400 steps, 4 ranks
        result = synth_run(gd / f"{i:02d}-drill-{i}", f"drill-{i}", kind=kind, steps=400, ranks=4, fault_step=60 + i, t0=T0 + i * 100)
        records.append(record_for(i, result))
    synth_gameday(gd, records)
    res = run_cli("report", gd)
    assert res.code == 0, res.stderr
    html = (gd / "index.html").read_text()
    assert len(re.findall(r'<div class="card" id="s\d+">', html)) == 20
    assert (gd / "index.html").stat().st_size < 1_000_000


# -- JUnit -----------------------------------------------------------------------------------


def test_junit_of_a_mixed_gameday(mixed_gameday: Path, tmp_path: Path) -> None:
    from junitparser import Error, Failure, JUnitXml

    from chaoskit.report.junit import write_junit

    summary = json.loads((mixed_gameday / GAMEDAY_FILE).read_text())
    path = write_junit(summary, tmp_path / "junit.xml")
    xml = JUnitXml.fromfile(str(path))
    suites = list(xml)
    assert len(suites) == 1
    suite = suites[0]
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (4, 1, 2, 0)
    cases = {c.name: c for c in suite}
    assert set(cases) == {"kill-rank", "hang-rank", "kill-crash", "broken"}
    assert cases["kill-rank"].classname == "software" and cases["kill-rank"].is_passed
    [failure] = cases["hang-rank"].result
    assert isinstance(failure, Failure)
    assert failure.message.startswith("verdict fail: detection ")
    assert "verdict: FAIL" in failure.text and "detection" in failure.text and "<= 0.01s" in failure.text
    assert isinstance(cases["kill-crash"].result[0], Error)
    assert isinstance(cases["broken"].result[0], Error) and cases["broken"].classname == "uncategorised"
    props = {p.name: p.value for p in suite.properties()}
    assert props["coverage.classes"] == "1/18"
    assert float(props["coverage.weighted"]) == pytest.approx(56 / 419, abs=1e-4)


def test_report_of_a_gameday_that_died_half_way(tmp_path: Path) -> None:
    gd = tmp_path / "gameday-died"
    first = synth_run(gd / "01-kill-rank", "kill-rank")
    later = record_for(2, None, file="scenarios/hang-rank.yaml", status=None)
    later["status"] = None  # gameday.json was last written before this one ran
    summary = summarize(gd.name, [record_for(1, first), later], CAPS, started=T0, finished=False)
    (gd / GAMEDAY_FILE).write_text(json.dumps(summary))
    res = run_cli("report", gd)
    assert res.code == 0, res.stderr
    html = (gd / "index.html").read_text()
    assert "This game day did not finish: gameday.json was last written after 1 of 2 scenarios" in html
    assert "The game day stopped before this scenario ran." in html
    assert '<span class="badge not-run">not run</span>' in html
