"""The environment chaoskit gives a job it starts, and what a scenario's ``workload.env`` may change of it.

One table per concern, stdlib only (the scenario model validates with it; :mod:`chaoskit.workloads.launch` sets
the variables; ``--dry-run`` shows them with :data:`WHY`):

- :data:`OWNED`: names chaoskit sets itself and a scenario may not change: the ``CHAOSKIT_*`` variables carry the
  job's scope mark (``CHAOSKIT_SCOPE``: the only processes a fault may act on), its node, its events file and its
  checkpoint folder; a recovery stack's launcher variables are the stack's (its ``owned_env``, :mod:`chaoskit.stacks`).
- :data:`GUARDED`: names that change what code a process loads (``LD_PRELOAD``, ``PYTHONPATH``,
  ``PYTHONSTARTUP``, ...). A scenario is written by somebody other than whoever runs it (a game day's folder, a CI
  job), and the job may run as root, so they are refused unless the site policy's ``env`` names them.
"""

from __future__ import annotations

import fnmatch
import re

__all__ = ["ENV_NAME_RE", "MAX_ENV_VARS", "MAX_ENV_VALUE", "OWNED_PREFIX", "GUARDED", "WHY",
           "SHARE_STORE_VAR", "SCOPE_VAR", "check_env_name", "check_env_value", "owned_by", "guarded"]

ENV_NAME_RE = r"[A-Za-z_][A-Za-z0-9_]{0,127}"
"""A variable's name: a shell's (letters, digits, ``_``, not a digit first), at most 128 characters."""
MAX_ENV_VARS = 64
MAX_ENV_VALUE = 4096
"""The longest value, in characters (a path list, a flag string); a longer one is refused, never cut."""

OWNED_PREFIX = "CHAOSKIT_"
GUARDED = ("LD_*", "PYTHON*")
"""Names (shell-style patterns) a scenario sets or unsets only where the site policy's ``env`` allows them."""

SHARE_STORE_VAR = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"

SCOPE_VAR = "CHAOSKIT_SCOPE"
"""The job's scope mark: the only processes a fault may act on carry it (the node's agent checks)."""

WHY: dict[str, str] = {
    "PYTHONUNBUFFERED": "every line reaches chaoskit when printed (the timeline's timestamps)",
    "OMP_NUM_THREADS": "one thread per worker: the lab's nodes share this machine's cores",
    "TMPDIR": "ft_launcher's sockets in a private folder, not under guessable names in /tmp",
    "TORCH_CPP_LOG_LEVEL": "the Wrapper's store waits warn from c10d twice a second per rank, every one expected",
}
"""Why chaoskit sets a variable of its own, as ``--dry-run`` says (the store's reason is the recovery stack's)."""


def owned_by(name: str, recovery: str, recovery_owned: tuple[str, ...] = ()) -> str | None:
    """Who owns ``name`` when it is chaoskit's under ``recovery``, whose stack sets ``recovery_owned`` (a scenario may
    not set or unset it), else ``None``."""
    if name.upper().startswith(OWNED_PREFIX):
        return "chaoskit (its scope mark CHAOSKIT_SCOPE, node, events file and checkpoint folder are CHAOSKIT_*)"
    if name in recovery_owned:
        return f"chaoskit under recovery: {recovery}"
    return None


def guarded(name: str, allowed: list[str] | None) -> bool:
    """Whether ``name`` is one of :data:`GUARDED` that the policy's ``env`` patterns (``allowed``) do not name."""
    if not any(fnmatch.fnmatchcase(name, p) for p in GUARDED):
        return False
    return not any(fnmatch.fnmatchcase(name, p) for p in allowed or ())


def check_env_value(value: object) -> str | None:
    """One ``workload.env`` value as the job gets it: a string (a YAML number as written) of at most
    :data:`MAX_ENV_VALUE` characters with no NUL, or ``None`` (unset). ``ValueError`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError("a value is a string (quote 'true', 'false'), a number, or null to unset the variable")
    text = value if isinstance(value, str) else str(value)
    if len(text) > MAX_ENV_VALUE:
        raise ValueError(f"a value of {len(text)} characters; at most {MAX_ENV_VALUE}")
    if "\x00" in text:
        raise ValueError("a value holds a NUL character, which no environment can carry")
    return text


def check_env_name(name: object) -> str:
    """A ``workload.env`` name: a shell's (:data:`ENV_NAME_RE`), not chaoskit's own ``CHAOSKIT_*``. ``ValueError``
    otherwise."""
    if not isinstance(name, str) or not re.fullmatch(ENV_NAME_RE, name):
        raise ValueError(f"invalid variable name {name!r}: letters, digits and _, not a digit first, at most 128")
    if name.upper().startswith(OWNED_PREFIX):
        raise ValueError(f"{name} is chaoskit's own (CHAOSKIT_*: the job's scope mark CHAOSKIT_SCOPE, its node, "
                         "events file and checkpoint folder): a scenario may not set or unset it")
    return name
