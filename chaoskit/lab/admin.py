"""``python -m chaoskit.lab.netns`` / ``chaoskit.lab.slurm``: a root lab's power commands (what its inventory's
``power:`` runs) and up/down/status for debugging, one command line for both labs."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

from chaoskit.core.errors import InfraError

__all__ = ["lab_main"]


def lab_main(argv: list[str] | None, prog: str, what: str, create: Callable[[int, int, Any], Any],
             load: Callable[[Any], Any], made: Callable[[Any], Any]) -> int:
    """Parse ``argv`` and act on the lab: ``create(nodes, spare, directory)`` and ``load(directory)`` make and find
    it, ``made(lab)`` is what ``up`` prints (the file the lab's users start from); ``what`` names it in errors."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--dir", dest="directory", default=None)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_power = sub.add_parser("power")
    p_power.add_argument("action", choices=["off", "on", "status"])
    p_power.add_argument("--dir", dest="directory", default=argparse.SUPPRESS)
    p_power.add_argument("node")
    p_up = sub.add_parser("up")
    p_up.add_argument("--nodes", type=int, default=2)
    p_up.add_argument("--spare", type=int, default=0)
    sub.add_parser("down")
    sub.add_parser("status")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "up":
            print(made(create(args.nodes, args.spare, args.directory)))
            return 0
        lab = load(args.directory)
        if lab is None:
            print(f"no {what} is up", file=sys.stderr)
            return 3
        if args.cmd == "down":
            lab.down()
            return 0
        if args.cmd == "status":
            print(json.dumps(lab.status(), indent=2))
            return 0
        on = lab.power(args.node, args.action)
        print("on" if on else "off")
        return 0 if on or args.action == "off" else 1
    except InfraError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
