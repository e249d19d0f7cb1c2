"""Bounded input: what no file may do to chaoskit (crash it, hang it, bloat it), each refused
with one ``file:line:col: message`` line and exit 2. The scenario-shaped cases live in
``tests/scenarios/bad/`` with their ``# expect:`` lines; these are the ones a file cannot hold."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from chaoskit.backends.api import ClusterBackend, ClusterHandle, ClusterSpec
from chaoskit.backends.registry import CLUSTERS
from chaoskit.core.durations import parse_duration
from chaoskit.core.errors import ScenarioError
from chaoskit.core.limits import MAX_FILE_BYTES
from chaoskit.core.yaml_source import load_yaml_text
from tests.conftest import ROOT, SCENARIOS, run_cli

KILL = "faults:\n  - kind: process.kill\n    target: {ranks: [0]}\n"


def _only_line(res) -> str:
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


def test_invalid_utf8_is_reported_at_the_line_and_column_of_the_byte(tmp_path: Path):
    f = tmp_path / "s.yaml"
    f.write_bytes(b"name: x\ndescription: caf\xc3\xa9 \xff\n" + KILL.encode())
    res = run_cli("validate", f)
    assert res.code == 2
    assert _only_line(res) == f"{f}:2:19: invalid UTF-8: byte 0xff (invalid start byte)"


def test_nul_is_reported_where_it_is(tmp_path: Path):
    f = tmp_path / "s.yaml"
    f.write_bytes(b"name: x\n" + KILL.encode() + b"    at: {step: 1\x00}\n")
    res = run_cli("validate", f)
    assert res.code == 2
    assert _only_line(res) == f"{f}:5:17: control character U+0000 (NUL) is not allowed in YAML"


def test_a_fifo_is_refused_by_its_type_without_blocking(tmp_path: Path):
    fifo = tmp_path / "s.yaml"
    os.mkfifo(fifo)
    start = time.monotonic()
    res = run_cli("validate", fifo)
    assert time.monotonic() - start < 5
    assert res.code == 2
    assert _only_line(res) == f"{fifo}:1:1: not a regular file (a FIFO); only a regular file is read"


@pytest.mark.parametrize("path, what", [("/dev/zero", "a character device"), ("/dev/null", "a character device")])
def test_devices_are_refused_by_their_type(path: str, what: str):
    res = run_cli("validate", "--inventory", path)
    assert res.code == 2
    assert _only_line(res) == f"{path}:1:1: not a regular file ({what}); only a regular file is read"


def test_a_file_over_the_size_limit_is_refused_after_reading_at_most_the_limit(tmp_path: Path):
    f = tmp_path / "big.yaml"
    f.write_text("name: big\ndescription: '" + "x" * MAX_FILE_BYTES + "'\n" + KILL)
    res = run_cli("validate", f)
    assert res.code == 2
    assert _only_line(res) == f"{f}:1:1: the file is larger than 1024 KiB, the limit for input files"


def test_a_name_too_long_for_the_file_system_is_one_positioned_line(tmp_path: Path):
    f = tmp_path / ("x" * 300 + ".yaml")
    res = run_cli("validate", f)
    assert res.code == 2
    assert _only_line(res) == f"{f}:1:1: cannot read this file: File name too long"


def test_a_plain_key_over_1024_characters_says_so(tmp_path: Path):
    f = tmp_path / "s.yaml"
    f.write_text("k" * 2000 + ": 1\n")
    res = run_cli("validate", f)
    assert res.code == 2
    assert _only_line(res) == (f"{f}:1:2001: YAML syntax error: mapping values are not allowed in this context "
                               "(a key is at most 1024 characters, on one line)")


def test_an_alias_bomb_is_refused_quickly_in_bounded_memory(tmp_path: Path):
    # 10**9 values once expanded: refused after counting past the limit, never built.
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    f = tmp_path / "bomb.yaml"
    f.write_text("\n".join(lines) + "\n")
    start = time.monotonic()
    res = run_cli("validate", f)
    assert time.monotonic() - start < 2
    assert res.code == 2
    assert _only_line(res).startswith(f"{f}:5:45: more than 100,000 values (aliases count as the values they repeat)")


def test_aliases_and_merge_keys_within_the_limits_keep_positions():
    text = "a: &t {nodes: [n9]}\nb: *t\nc: {<<: *t, extra: 1}\n"
    data, smap = load_yaml_text(text, "f.yaml", merge=True)
    assert data == {"a": {"nodes": ["n9"]}, "b": {"nodes": ["n9"]}, "c": {"nodes": ["n9"], "extra": 1}}
    for where in ("a", "b", "c"):  # an aliased value points at the text it came from
        assert str(smap.at((where, "nodes", 0))) == "f.yaml:1:16"
    assert str(smap.at(("c", "extra"))) == "f.yaml:3:20"
    with pytest.raises(ScenarioError, match="merge keys"):
        load_yaml_text(text, "f.yaml")  # scenarios and inventories take no merge keys


def test_durations_are_finite_bounded_and_ascii():
    for bad, says in [(math.nan, "not NaN"), (math.inf, "longer than 30 days"), (10**400, "(an integer of 1329 bits)"),
                      ("31d", "longer than 30 days"), ("1w", "invalid duration"), ("721h", "longer than 30 days"), ("٣٠s", "invalid duration"),
                      ("1" * 100 + "s", "invalid duration")]:
        with pytest.raises(ValueError, match=r".*" + says.replace("(", r"\(").replace(")", r"\)")):
            parse_duration(bad)
    assert parse_duration("720h") == 30 * 86400 and parse_duration(2592000) == 2592000


# -- compose files are named, then the scenario that pulled them in ---------------------------


def test_an_error_in_a_compose_file_names_it_then_the_scenario(tmp_path: Path):
    (tmp_path / "compose.yml").write_text("services:\n  n0:\n    image: x\n    ports: ['80:80']\n")
    sc = tmp_path / "s.yaml"
    sc.write_text("name: x\ncluster: {kind: docker, nodes: 1, compose: compose.yml}\n" + KILL)
    res = run_cli("validate", sc)
    assert res.code == 2
    line = _only_line(res)
    assert line.startswith(f"{tmp_path / 'compose.yml'}:4:5: services.n0.ports: chaoskit's docker lab does not read 'ports'")
    assert line.endswith(f"(cluster of {sc}:2:10)")


@pytest.mark.parametrize("body, where, message", [
    (b"services:\n  n0: &n\n    image: x\n    labels: [*n]\n", "4:14", "alias *n is inside the node it refers to (a loop)"),
    (b"services:\n  n0:\n    image: caf\xff\n", "3:15", "invalid UTF-8: byte 0xff"),
    (b"services: " + b"[" * 100 + b"]" * 100 + b"\n", "1:74", "nested more than 64 levels deep"),
    (b"services:\n  n0: {image: x, command: 'a \"b'}\n", "2:27", "services.n0.command: cannot split the command"),
    (b"services:\n  n0: {image: x, labels: 7}\n", "2:26", "services.n0.labels: a mapping, or a list of KEY=VALUE"),
])
def test_compose_files_get_the_same_limits_and_positions(tmp_path: Path, body: bytes, where: str, message: str):
    (tmp_path / "compose.yml").write_bytes(body)
    sc = tmp_path / "s.yaml"
    sc.write_text("name: x\ncluster: {kind: docker, nodes: 1, compose: compose.yml}\n" + KILL)
    res = run_cli("validate", sc)
    assert res.code == 2
    line = _only_line(res)
    assert line.startswith(f"{tmp_path / 'compose.yml'}:{where}: ") and message in line, line
    assert line.endswith(f"(cluster of {sc}:2:10)")


def test_the_shipped_compose_file_still_loads_with_its_merge_keys():
    res = run_cli("validate", SCENARIOS / "docker-nic-drop.yaml")
    assert res.code == 0, res.stderr


# -- inventories --------------------------------------------------------------------------


def test_validate_recognises_an_inventory_by_its_content(tmp_path: Path):
    good = tmp_path / "rack.yaml"
    good.write_text("name: rack\nnodes:\n  - {name: n1, address: 10.0.0.1, interfaces: {data: eth0}}\n")
    bad = tmp_path / "rack2.yaml"
    bad.write_text("name: rack\nnodes:\n  - {name: n1, address: 10.0.0.1, interfaces: {data: \"eth0\\n\"}}\n")
    res = run_cli("validate", good, bad)
    assert res.code == 2
    assert f"ok  {good} (inventory)" in res.stdout and "1 valid, 1 invalid" in res.stdout
    assert _only_line(res).startswith(f"{bad}:3:54: nodes.0.interfaces.data: invalid interface name 'eth0\\n'")


def test_validate_inventory_flag_checks_a_file_as_an_inventory(tmp_path: Path):
    f = tmp_path / "odd.yaml"
    f.write_text("name: odd\nssh: {user: 'root;id'}\n")
    res = run_cli("validate", "--inventory", f)
    assert res.code == 2
    assert _only_line(res) == f"{f}:2:13: ssh.user: invalid user name 'root;id'"


# -- validate DIR checks every file -------------------------------------------------------


class BrokenSpec(ClusterSpec):
    kind: Literal["broken"] = Field(..., description="broken: a backend whose preview fails (tests only).")


class BrokenBackend(ClusterBackend):
    """A plugin with a bug: its preview raises something chaoskit does not expect."""

    name = "broken"
    Spec = BrokenSpec
    summary = "a buggy plugin (tests only)"

    def preview(self, spec: BrokenSpec, base: Path) -> ClusterHandle:
        raise RuntimeError("plugin bug\nsecond line")


@pytest.fixture
def broken_backend():
    CLUSTERS.register("broken", BrokenBackend)
    yield BrokenBackend
    CLUSTERS.unregister("broken")


def test_validate_dir_checks_every_file_past_one_that_crashes(broken_backend, tmp_path: Path):
    good = (SCENARIOS / "kill-rank.yaml").read_text()
    (tmp_path / "a-good.yaml").write_text(good)
    (tmp_path / "b-crash.yaml").write_text("name: crash\ncluster: {kind: broken, nodes: 1}\n" + KILL)
    (tmp_path / "c-bad.yaml").write_text(good.replace("signal: SIGKILL", "signal: SIGNOPE"))
    (tmp_path / "d-good.yaml").write_text(good)
    res = run_cli("validate", tmp_path)
    assert res.code == 70
    assert res.stdout.splitlines() == [f"ok  {tmp_path / 'a-good.yaml'}", f"ok  {tmp_path / 'd-good.yaml'}", "2 valid, 2 invalid"]
    lines = res.stderr.strip().splitlines()
    assert lines[0] == f"{tmp_path / 'b-crash.yaml'}: internal error: RuntimeError: plugin bug second line"
    assert lines[1].startswith(f"{tmp_path / 'c-bad.yaml'}:17:13: faults.0.signal: unknown signal 'SIGNOPE'")
    assert lines[2].startswith("hint: an internal error is a chaoskit bug")


def test_every_bad_scenario_fails_with_a_positioned_line():
    res = run_cli("validate", ROOT / "tests" / "scenarios" / "bad")
    assert res.code == 2
    for line in res.stderr.strip().splitlines():
        assert line.split(":")[1].isdigit() and line.split(":")[2].isdigit(), line
