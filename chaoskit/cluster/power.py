"""Commands run on the controller for a node: its power commands (a BMC, a PDU, a lab or an engine).

A power command may carry a password (``ipmitool -P ...``): it runs as given, and is written
down (messages, plans, the journal) only through :func:`chaoskit.core.secrets.redact_argv`."""

from __future__ import annotations

import subprocess

from chaoskit.core.errors import InfraError
from chaoskit.core.secrets import redact_argv
from chaoskit.core.shell import shell_quote
from chaoskit.core.trusted import UntrustedFile, open_program

__all__ = ["run_power_command"]


def run_power_command(argv: list[str], timeout: float, node: str) -> subprocess.CompletedProcess[str]:
    """Run a power command on the controller, without a shell, with a hard deadline: its program looked up once,
    opened once, checked on what was opened (root alone can change it: an author's own script would run as root) and
    run as that file (``/proc/self/fd/N``), so a link swapped after the check changes nothing."""
    try:
        program = open_program(argv[0])
    except FileNotFoundError:
        raise InfraError(f"power command for node {node}: {argv[0]}: not found on the controller") from None
    except UntrustedFile as exc:
        raise InfraError(f"power command for node {node} not run: {exc}") from None
    with program:
        try:
            return subprocess.run([argv[0], *argv[1:]], executable=program.exec_path(), pass_fds=(program.fd,),
                                  capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise InfraError(f"power command for node {node}: {argv[0]}: not found on the controller") from None
        except subprocess.TimeoutExpired:
            raise InfraError(f"power command for node {node} did not finish within {timeout:g}s: "
                             f"{shell_quote(redact_argv(argv))}") from None
