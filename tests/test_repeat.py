"""``chaoskit run --repeat N``: samples, their distribution, and SLOs judged on it.

The statistics are checked against numbers worked by hand; the end-to-end test runs a real kill-rank drill twice
on the process lab (torchrun, gloo) and judges percentile SLOs on what it measured.
"""

from __future__ import annotations

import json
import math

import pytest

from chaoskit.distribution import bootstrap_median_ci, distribution, percentile, slo_on_distribution, summarize
from chaoskit.repeat import summarize_samples
from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)


def test_percentiles_interpolate_between_ranks_as_numpy_does():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 95) == pytest.approx(4.8)  # rank 3.8: 4 + 0.8 * (5 - 4)
    assert percentile(xs, 100) == 5.0 and percentile(xs, 0) == 1.0
    assert percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_the_median_interval_is_reproducible_and_holds_the_median():
    xs = [5.6, 6.1, 7.5, 5.9, 6.4, 6.0, 7.1]
    lo, hi = bootstrap_median_ci(xs)
    assert (lo, hi) == bootstrap_median_ci(xs)  # fixed seed: the same samples give the same interval
    assert min(xs) <= lo <= percentile(xs, 50) <= hi <= max(xs)
    assert bootstrap_median_ci([6.0]) is None


def test_a_phase_not_observed_is_counted_and_fails_every_slo_on_it():
    d = summarize([1.0, None, 3.0])
    assert d["n"] == 3 and d["missing"] == 1 and d["p50"] == 2.0 and d["samples"] == [1.0, None, 3.0]
    dist = {"recovery_s": d}
    verdict = slo_on_distribution(dist, {"recovery": {"p50": 100.0}})
    assert verdict["recovery"]["pass"] is False and "1 of 3 samples" in verdict["recovery"]["reason"]


def test_plain_limits_hold_for_every_sample_and_percentiles_for_the_percentile():
    dist = distribution([{"recovery_s": v, "lost_steps": s} for v, s in ((5.0, 10), (6.0, 10), (9.0, 30))])
    assert slo_on_distribution(dist, {"recovery": 8.0})["recovery"]["pass"] is False  # the 9 s sample misses it
    assert slo_on_distribution(dist, {"recovery": {"p50": 8.0}})["recovery"]["pass"] is True
    assert slo_on_distribution(dist, {"recovery": {"p95": 8.0}})["recovery"]["pass"] is False  # p95 = 8.7
    lost = slo_on_distribution(dist, {"lost_steps": {"p50": 10}, "recovery": None})
    assert lost["lost_steps"]["pass"] is True and "recovery" not in lost


def _sample(d, recovery, checks_pass=True, status="pass"):
    return {"dir": d, "status": status, "exit_code": 0, "checks_pass": checks_pass, "slo_pass": True,
            "phases": {"recovery_s": recovery, "detection_s": 0.1}}


def test_a_repeat_fails_on_a_sample_whose_checks_failed_or_a_missing_sample():
    ok = summarize_samples("k", "k.yaml", 2, [_sample("a", 5.0), _sample("b", 6.0)], {"recovery": 60.0}, started=0)
    assert ok["verdict"] == "pass" and ok["distribution"]["recovery_s"]["n"] == 2
    assert summarize_samples("k", "k.yaml", 2, [_sample("a", 5.0), _sample("b", 6.0, checks_pass=False)], {},
                             started=0)["verdict"] == "fail"
    assert summarize_samples("k", "k.yaml", 3, [_sample("a", 5.0), _sample("b", 6.0)], {}, started=0)["verdict"] == "fail"


def test_percentile_slos_are_validated_at_their_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: s\nfaults: [{kind: process.kill, target: {ranks: [1]}}]\nslo:\n  recovery: {p96: 60s}\n")
    res = run_cli("validate", bad)
    assert res.code == 2 and "bad.yaml:4:" in res.stdout + res.stderr, res.stdout + res.stderr
    empty = tmp_path / "empty.yaml"
    empty.write_text("name: s\nfaults: [{kind: process.kill, target: {ranks: [1]}}]\nslo:\n  recovery: {}\n")
    res = run_cli("validate", empty)
    assert res.code == 2 and "name at least one of p50" in res.stdout + res.stderr
    res = run_cli("run", ROOT / "scenarios" / "kill-rank.yaml", "--repeat", "5000", "--out", tmp_path / "r")
    assert res.code == 2 and "--repeat 5000 is out of range" in res.stdout + res.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_kill_rank_twice_gives_a_distribution_judged_by_percentiles(tmp_path):
    """Two real kill-rank drills back to back on a 2-node process lab; the SLOs on p95 are judged on the samples,
    and the same samples pass or fail as the limit falls above or below their p95. Two samples are a distribution
    already (p95 between them, a bootstrap interval); a third only repeats the same drill (issue 52)."""
    from tests.conftest import need_torch

    need_torch()
    scenario = tmp_path / "kill-rank.yaml"
    text = (ROOT / "scenarios" / "kill-rank.yaml").read_text()
    # the kill at step 30, after the checkpoint of step 25 (saved before step 26 can run), and 60 steps: each sample
    # still resumes from a checkpoint and trains to its end, 35 steps fewer each (issue 52); the 30 steps after the
    # kill's step are the window its injection lands in, as the 90-step form had (the job must still be running)
    text = text.replace("steps: 200", "steps: 60").replace("at: {step: 60}", "at: {step: 30}")
    text = text.replace("recovery: 60s", "recovery: {p95: 60s}")
    assert "at: {step: 30}" in text
    # two nodes, not three: a third of each sample's torch start-ups less, and the distribution is the same kind
    text = text.replace("\ncluster: lab ", "\ncluster: {kind: process, nodes: 2} ")
    assert "nodes: 2" in text
    scenario.write_text(text)
    out = tmp_path / "rep"
    res = run_cli("run", scenario, "--repeat", "2", "--out", out, "--json")
    assert res.code == 0, res.stdout[-3000:] + res.stderr[-3000:]
    r = res.json
    assert r["kind"] == "chaoskit.repeat" and r["verdict"] == "pass" and r["completed"] == 2
    assert [s["dir"] for s in r["samples"]] == ["sample-01", "sample-02"]
    for s in r["samples"]:
        sample = json.loads((out / s["dir"] / "result.json").read_text())
        assert sample["verdict"] == "pass" and sample["phases"]["recovery_s"] == s["phases"]["recovery_s"]
    rec = r["distribution"]["recovery_s"]
    assert rec["n"] == 2 and rec["missing"] == 0 and len(rec["samples"]) == 2
    assert rec["p50"] <= rec["p95"] <= rec["max"] and rec["ci95"][0] <= rec["p50"] <= rec["ci95"][1]
    assert r["slo"]["recovery"]["pass"] and r["slo"]["recovery"]["percentiles"]["p95"]["limit"] == 60.0
    assert r["distribution"]["lost_steps"]["p50"] is not None
    # the same samples against a p95 limit just under and just over what they measured
    p95 = rec["p95"]
    under = summarize_samples("k", "k", 2, r["samples"], {"recovery": {"p95": p95 * 0.99}}, started=0)
    over = summarize_samples("k", "k", 2, r["samples"], {"recovery": {"p95": p95 * 1.01}}, started=0)
    assert under["verdict"] == "fail" and over["verdict"] == "pass"
    page = (out / "report.html").read_text()
    assert "Distribution over 2 of 2 samples" in page and page.count('class="sample"') >= 2 * 5
    assert "<script src" not in page and "http://" not in page.split("Content-Security-Policy")[0]
    assert math.isclose(rec["max"], max(rec["samples"]))


@pytest.mark.slow
def test_repeats_that_stop_early_write_what_ran_and_why(tmp_path):
    """A sample that cannot run (its fault finds no process: exit 3) stops the repeats; result.json still says
    what ran and why it stopped."""
    from tests.conftest import need_torch

    need_torch()
    scenario = tmp_path / "no-target.yaml"
    scenario.write_text(
        "name: no-target\ncluster: {kind: process, nodes: 2}\n"
        "workload: {launch: reference, steps: 60, step_time: 50ms, checkpoint_every: 25}\n"
        "faults:\n  - {kind: process.kill, target: {process: 'no-such-process-here'}, at: {step: 20}}\n"
        "safety: {max_nodes: 1, abort_after: 2m}\n")
    out = tmp_path / "rep"
    res = run_cli("run", scenario, "--repeat", "3", "--out", out)
    assert res.code == 3, res.stdout[-3000:] + res.stderr[-3000:]
    r = json.loads((out / "result.json").read_text())
    assert r["verdict"] == "fail" and [s["dir"] for s in r["samples"]] == ["sample-01"]
    assert r["stopped"]["early"] and r["stopped"]["after"] == 1
    assert r["stopped"]["why"].startswith("sample-01: ") and "no process matches" in r["stopped"]["why"]
