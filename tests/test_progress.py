"""A run's progress as structured events (issue 53, item 1): the terminal prints each event as the line it always
printed, and the game day's board takes its phase from the same events, not from the terminal's text."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from chaoskit.core.progress import Progress, ProgressFeed, TerminalProgress
from chaoskit.gameday import _Board, _BoardFeed

pytestmark = pytest.mark.beside  # its fast tests touch nothing the machine shares (tests/conftest.py, LANES)


def _console(width: int = 60) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, color_system=None, force_terminal=False, width=width, highlight=False), buf


def test_the_terminal_prints_each_event_as_one_line_with_its_seconds() -> None:
    console, buf = _console()
    TerminalProgress(console)(Progress("injected", "[bold red]inject[/bold red] process.kill -> n1/rank1 (step 60)", 12.3456,
                                       {"fault_kind": "process.kill"}))
    TerminalProgress(console)(Progress("sample", "[bold]sample 1 of 3[/bold]"))
    TerminalProgress(console)(Progress("verdict", "", 40.0, {"verdict": "pass"}))  # no line of its own
    long = "reverted net.delay on " + ", ".join(f"n{i}" for i in range(20))  # longer than the terminal: not wrapped
    TerminalProgress(console)(Progress("reverted", long, 1.0))
    assert buf.getvalue().splitlines() == ["  12.35s  inject process.kill -> n1/rank1 (step 60)", "sample 1 of 3",
                                           f"   1.00s  {long}"]


def test_a_feed_hands_every_subscriber_the_same_event_and_refuses_an_unknown_stage() -> None:
    seen: list[Progress] = []
    also: list[Progress] = []
    feed = ProgressFeed(0.0, [seen.append, None, also.append])
    feed("steady state: step 20 reached", "steady", step=20)
    feed("a note")
    assert seen == also and [(e.stage, e.data) for e in seen] == [("steady", {"step": 20}), ("note", {})]
    with pytest.raises(ValueError, match="unknown progress stage"):
        feed("x", "no-such-stage")


def test_the_game_day_board_takes_its_phase_from_the_event_not_from_text() -> None:
    board = _Board([{"index": 1, "scenario": "kill-rank", "status": None}])
    console, buf = _console(width=120)

    class Live:  # what the board prints above: rich.live.Live's console
        pass

    live = Live()
    live.console = console
    feed = _BoardFeed(board, live, "kill-rank")
    feed(Progress("detected", "detected 0.12s after the fault by process \\[exit 137]", 30.5, {"after_s": 0.12}))
    assert board.phase == "detected 0.12s after the fault by process [exit 137]"
    feed(Progress("verdict", "", 31.0, {"verdict": "pass"}))  # no line: the board keeps its phase
    assert board.phase == "detected 0.12s after the fault by process [exit 137]"
    assert buf.getvalue().splitlines() == ["kill-rank: 30.50s  detected 0.12s after the fault by process [exit 137]"]
