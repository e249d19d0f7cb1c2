"""Secrets kept out of what a run leaves: password-like arguments of commands are redacted.

Power commands (``ipmitool -P <password>``, ``--password=...``, ``IPMI_PASSWORD=... cmd``) are
run as given, but every copy written down (the journal, result.json, events, error messages,
the report) shows ``***`` in place of the secret. Options that take a secret as the next
argument: ``-P`` (ipmitool, mysql-style), ``--password``/``--passwd``/``--pass``/``--token``/
``--secret`` and, for the tools where it is a password (:data:`P_IS_PASSWORD`: ``sshpass``, ``racadm``,
``redfishtool``, ``ilorest``...), ``-p`` (elsewhere ``-p`` is mostly a port); ``-u``/``--user`` of curl and wget
(``user:password``: the part after the colon). A ``KEY=value`` argument whose key says password, passwd, secret
or token is redacted too.
"""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["REDACTED", "redact_argv", "redact_text", "redact_value"]

REDACTED = "***"

_NEXT_IS_SECRET = {"-P", "--password", "--passwd", "--pass", "--token", "--secret", "--api-key", "--apikey"}
_LONG_WITH_VALUE = re.compile(r"^(--(?:password|passwd|pass|token|secret|api-key|apikey))=(.+)$", re.IGNORECASE)
# A key is matched whole, then looked into (a pattern with the secret word between two open repetitions
# backtracks quadratically on a long run of letters).
_KEY_VALUE = re.compile(r"^([A-Za-z0-9_.-]+)=(.+)$", re.DOTALL)
_SECRET_KEY = re.compile(r"password|passwd|secret|token|apikey|api_key", re.IGNORECASE)
_GLUED_P = re.compile(r"^-P(.+)$")
P_IS_PASSWORD = frozenset({"sshpass", "racadm", "redfishtool", "ilorest", "ipmiutil", "rfpower", "onecli"})
"""Power tools whose ``-p`` is a password, not a port."""
_USER_PASS = frozenset({"curl", "wget"})
# In free text (an error message quoting a command line): the same shapes, separated by blanks.
_TEXT = re.compile(
    r"(?P<opt>(?<![\w-])(?:-P|--password|--passwd|--pass|--token|--secret|--api-key|--apikey)|(?<=sshpass )-p|(?<=racadm )-p|(?<=redfishtool )-p|(?<=ilorest )-p)"
    r"(?P<sep>[ =]*)(?P<val>'[^']*'|\"[^\"]*\"|\S+)"
    r"|(?P<key>(?<![\w.-])[A-Za-z0-9_.-]+)=(?P<kval>'[^']*'|\"[^\"]*\"|\S+)",
    re.IGNORECASE,
)


def redact_argv(argv: list[Any]) -> list[str]:
    """``argv`` with every password-like value replaced by ``***`` (the command as it may be written down)."""
    out: list[str] = []
    secret_next = user_next = False
    program = os.path.basename(str(argv[0])) if argv else ""
    for raw in argv:
        arg = str(raw)
        if secret_next:
            out.append(REDACTED)
            secret_next = False
            continue
        if arg in _NEXT_IS_SECRET or (arg == "-p" and program in P_IS_PASSWORD):
            out.append(arg)
            secret_next = True
            continue
        if user_next:
            user, colon, _ = arg.partition(":")
            out.append(f"{user}:{REDACTED}" if colon else arg)
            user_next = False
            continue
        if arg in ("-u", "--user") and program in _USER_PASS:
            out.append(arg)
            user_next = True
            continue
        m = _LONG_WITH_VALUE.match(arg) or _KEY_VALUE.match(arg)
        if m and (m.re is _LONG_WITH_VALUE or _SECRET_KEY.search(m.group(1))):
            out.append(f"{m.group(1)}={REDACTED}")
        elif arg.startswith("-p") and len(arg) > 2 and program in P_IS_PASSWORD:
            out.append(f"-p{REDACTED}")
        elif _GLUED_P.match(arg) and program.startswith("ipmitool"):
            out.append(f"-P{REDACTED}")
        else:
            out.append(arg)
    return out


def redact_text(text: str) -> str:
    """Free text (an error message, a quoted command line) with password-like values replaced by ``***``."""
    def sub(m: re.Match[str]) -> str:
        if m.group("opt"):
            return f"{m.group('opt')}{m.group('sep')}{REDACTED}"
        if not _SECRET_KEY.search(m.group("key")):
            return m.group(0)
        return f"{m.group('key')}={REDACTED}"
    return _TEXT.sub(sub, text)


def redact_value(value: Any) -> Any:
    """A JSON-like value with every command line (a list of strings) and every string redacted."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, list):
        if value and all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
            return redact_argv(value) if any(isinstance(v, str) for v in value) else value
        return [redact_value(v) for v in value]
    if isinstance(value, tuple):
        return redact_value(list(value))
    if isinstance(value, dict):
        return {k: redact_value(v) for k, v in value.items()}
    return value
