"""The JSON Schema's duration pattern and the parser agree (issue 53): an editor using ``chaoskit.schema.json``
accepts what ``chaoskit validate`` accepts, and the other way round (``abort_after: 1d`` was refused by the
schema's old pattern, which lacked ``d``)."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

from chaoskit.core.durations import SCHEMA_PATTERN, parse_duration
from chaoskit.core.limits import MAX_DURATION_S
from tests.conftest import ROOT

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

_SCHEMA = re.compile(SCHEMA_PATTERN)


@settings(max_examples=300, deadline=None)
@given(st.from_regex(SCHEMA_PATTERN, fullmatch=True))
def test_every_duration_the_schema_admits_the_parser_reads(text):
    try:
        seconds = parse_duration(text, maximum=float("inf"))
    except ValueError as exc:  # only a value too long to be a duration a person wrote may be refused
        assert len(text) > 64, (text, exc)
    else:
        assert seconds >= 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(["ms", "s", "m", "h", "d"]),
                          st.one_of(st.none(), st.integers(0, 999))), min_size=1, max_size=4))
def test_every_duration_the_parser_reads_the_schema_admits(parts):
    text = "".join(f"{n}{'.' + str(f) if f is not None else ''}{u}" for n, f, u in parts)
    try:
        parse_duration(text)
    except ValueError:
        return  # too long (over 30 days): refused by the parser, and not the pattern's business
    assert _SCHEMA.fullmatch(text), text


def test_the_committed_schema_uses_the_parsers_pattern():
    schema = (ROOT / "chaoskit.schema.json").read_text()
    assert json.dumps(SCHEMA_PATTERN)[1:-1] in schema
    assert _SCHEMA.fullmatch("1d") and parse_duration("1d") == 86400.0 <= MAX_DURATION_S
