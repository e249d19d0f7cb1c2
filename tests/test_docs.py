"""The README a newcomer reads first, and the docs it points to: every link resolves, and the table of fault
kinds is the registry's own."""

from __future__ import annotations

import re

import pytest

from chaoskit.faults.registry import fault_kinds_markdown, readme_with_fault_kinds
from tests.conftest import ROOT

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _docs():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_of_the_readme_and_the_docs_resolves():
    broken = []
    for doc in _docs():
        for target in LINK.findall(doc.read_text()):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            if not (doc.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_the_readmes_fault_kinds_are_the_registrys():
    """Adding a fault kind adds its row here: `make readme` writes the table under '## Fault kinds'."""
    readme = (ROOT / "README.md").read_text()
    assert fault_kinds_markdown() in readme and readme_with_fault_kinds(readme) == readme, (
        "README's fault kinds table differs from fault_kinds_markdown(): run `make readme`")


def test_make_readme_rewrites_only_the_fault_kinds_table():
    readme = (ROOT / "README.md").read_text()
    stale = readme.replace("| `process.kill` |", "| `process.killed` |")
    assert stale != readme and readme_with_fault_kinds(stale) == readme


def test_the_readme_stays_short_enough_to_read_in_five_minutes():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
