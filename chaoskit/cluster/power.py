"""Commands run on the controller for a node: its power commands (a BMC, a PDU, a lab or an engine).

A power command may carry a password (``ipmitool -P ...``): it runs as given, and is written
down (messages, plans, the journal) only through :func:`chaoskit.core.secrets.redact_argv`."""

from __future__ import annotations

import shutil
import subprocess

from chaoskit.core.errors import InfraError
from chaoskit.core.secrets import redact_argv
from chaoskit.core.shell import shell_quote
from chaoskit.core.trusted import untrusted_file

__all__ = ["run_power_command"]


def run_power_command(argv: list[str], timeout: float, node: str) -> subprocess.CompletedProcess[str]:
    """Run a power command on the controller, without a shell, with a hard deadline: its program looked up once and
    run by that path, and only when root alone can change it (an author's own script would run as root)."""
    program = argv[0] if "/" in argv[0] else shutil.which(argv[0])
    if program is None:
        raise InfraError(f"power command for node {node}: {argv[0]}: not found on the controller")
    problem = untrusted_file(program)
    if problem:
        raise InfraError(f"power command for node {node} not run: {problem}")
    try:
        return subprocess.run([program, *argv[1:]], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise InfraError(f"power command for node {node}: {argv[0]}: not found on the controller") from None
    except subprocess.TimeoutExpired:
        raise InfraError(f"power command for node {node} did not finish within {timeout:g}s: "
                         f"{shell_quote(redact_argv(argv))}") from None
