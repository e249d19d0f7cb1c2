"""What an inventory's SSH settings may point root at on this machine (issue 31).

An inventory's author writes ``ssh.config``, ``ssh.key`` and ``ssh.known_hosts``; chaoskit reads and
writes them as the operator (root in CI). So:

- the files lie inside the allowed roots: the site policy's ``ssh_roots``, else the operator's
  ``~/.ssh`` and the inventory's own folder (:func:`ssh_roots`);
- an OpenSSH client config may not run anything: ``Match exec``, ``ProxyCommand``, ``LocalCommand``
  and ``KnownHostsCommand`` are refused at their line, and so is an ``Include`` of a file outside
  the roots (the included files are checked the same way), :func:`config_problems`. paramiko runs
  ``Match exec`` through ``invoke`` while it answers a lookup, before any host key is checked. (The
  operator's own ``~/.ssh/config``, read when the inventory names no config, is theirs: not checked);
- trust on first use appends to a known_hosts file inside the roots only, never through a link,
  never creating a folder, and only to a regular file the operator owns (:func:`append_known_host`).

Stdlib only.
"""

from __future__ import annotations

import glob
import os
import posixpath
import re
import shlex
from pathlib import Path

from chaoskit.core.trusted import UntrustedFile, open_checked

__all__ = ["ssh_roots", "inside", "config_problems", "read_config", "append_known_host", "FORBIDDEN"]

FORBIDDEN = {"proxycommand": "runs a command", "localcommand": "runs a command",
             "knownhostscommand": "runs a command"}
"""Client config keywords that run a program on this machine, as root."""
_MAX_DEPTH = 8
_DIRECTIVE = re.compile(r"^([A-Za-z]+)(?:\s*=\s*|\s+)(.*)$")


def ssh_roots(policy_roots: list[str] | None, inventory_dir: Path) -> list[str]:
    """The folders SSH files may lie in: the policy's, else ``~/.ssh`` and the inventory's folder."""
    if policy_roots is not None:
        return list(policy_roots)
    return [os.path.realpath(os.path.expanduser("~/.ssh")), os.path.realpath(inventory_dir)]


def inside(path: str, roots: list[str]) -> bool:
    """Whether ``path`` (its links resolved: where it really is) lies inside one of ``roots``."""
    try:
        real = os.path.realpath(path)
    except (ValueError, OSError):  # a NUL byte, a loop: nowhere inside
        return False
    for root in roots:
        r = os.path.realpath(root).rstrip("/") or "/"
        if real == r or real.startswith(r.rstrip("/") + "/"):
            return True
    return False


def config_problems(path: str, roots: list[str], _depth: int = 0, _seen: set[str] | None = None
                    ) -> list[tuple[str, int, int, str]]:
    """``(file, line, col, message)`` for each directive of the OpenSSH client config at ``path`` (and the
    files it includes) that would run a command or read outside ``roots``; empty when none. Each file is read once,
    through :func:`~chaoskit.core.trusted.open_checked`."""
    return read_config(path, roots, _depth, _seen)[1]


def read_config(path: str, roots: list[str] | None, _depth: int = 0, _seen: set[str] | None = None
                ) -> tuple[str, list[tuple[str, int, int, str]]]:
    """The OpenSSH client config at ``path``, opened once (:func:`~chaoskit.core.trusted.open_checked`: a regular file
    inside ``roots``, ``None``: anywhere), and the problems of :func:`config_problems` found in *that* text: what is
    checked is what the caller hands paramiko (``SSHConfig.from_text``), never a second read of the path."""
    seen = set() if _seen is None else _seen
    try:
        with open_checked(path, roots=roots, what="ssh config") as checked:
            data = checked.read(1 << 20)
            real = checked.real
    except OSError as exc:
        return "", [(path, 1, 1, str(exc) if isinstance(exc, UntrustedFile) else
                     f"cannot read the ssh config: {exc.strerror}")]
    if real in seen or _depth > _MAX_DEPTH:
        return "", [] if real in seen else [(path, 1, 1, f"Include nests more than {_MAX_DEPTH} deep")]
    seen.add(real)
    text = data.decode("utf-8", errors="replace")
    return text, ([] if roots is None else _text_problems(path, text, roots, _depth, seen))


def _text_problems(path: str, text: str, roots: list[str], _depth: int, seen: set[str]) -> list[tuple[str, int, int, str]]:
    problems = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        col = len(raw) - len(raw.lstrip()) + 1
        m = _DIRECTIVE.match(line)
        key, value = (m.group(1).lower(), m.group(2).strip()) if m else (line.lower(), "")
        if key in FORBIDDEN and value.lower() != "none":
            problems.append((path, number, col, f"{key_name(key)} {FORBIDDEN[key]} as the operator; chaoskit refuses "
                                                "a config that does (use ProxyJump, or ssh.jump and bastions:)"))
        elif key == "match":
            try:
                words = [w.lower().lstrip("!") for w in shlex.split(value)]
            except ValueError:
                words = [w.lower().lstrip("!") for w in value.split()]
            if "exec" in words:
                problems.append((path, number, col, "Match exec runs a command as the operator (paramiko runs it "
                                                    "while it reads the config); chaoskit refuses a config that does"))
        elif key == "include":
            try:
                patterns = shlex.split(value)
            except ValueError:
                patterns = value.split()
            for pattern in patterns:
                if any(ord(c) < 0x20 or c == "\x7f" for c in pattern):
                    problems.append((path, number, col, f"Include {pattern!r} is not a path"))
                    continue
                full = os.path.expanduser(pattern)
                if not full.startswith("/"):  # OpenSSH: relative to ~/.ssh for a user's config
                    full = os.path.join(os.path.expanduser("~/.ssh"), full)
                full = posixpath.normpath(full)
                if not inside(full if not glob.has_magic(full) else os.path.dirname(full), roots):
                    problems.append((path, number, col, f"Include {pattern} names files outside the allowed roots "
                                                        f"({', '.join(roots)})"))
                    continue
                for included in sorted(glob.glob(full)):
                    if not inside(included, roots):
                        problems.append((path, number, col, f"Include {pattern} reaches {included}, outside the "
                                                            f"allowed roots ({', '.join(roots)})"))
                    elif os.path.isfile(included):
                        problems += read_config(included, roots, _depth + 1, seen)[1]
    return problems


def key_name(key: str) -> str:
    return {"proxycommand": "ProxyCommand", "localcommand": "LocalCommand",
            "knownhostscommand": "KnownHostsCommand"}.get(key, key)


def append_known_host(path: str, line: str, roots: list[str] | None) -> None:
    """Append ``line`` to the known_hosts file ``path``: inside ``roots`` (``None``: not checked), in a folder
    that exists, never through a link, to a regular file the operator owns (made 0600 if absent). The folders on the
    way are walked from ``/`` with ``openat`` (:func:`~chaoskit.core.trusted.open_checked`), so the roots are checked
    on the very folder the file is written in: a parent swapped for a link after the check is never written through.
    ``OSError``/``PermissionError`` with the reason otherwise."""
    try:
        checked = open_checked(path, append=True, roots=roots, what="known_hosts")
    except FileNotFoundError:
        raise PermissionError(f"known_hosts folder {os.path.dirname(os.path.abspath(path))} does not exist; trust on "
                              "first use creates no folder") from None
    except UntrustedFile as exc:
        raise PermissionError(str(exc)) from None
    with checked:
        os.write(checked.fd, line.encode())
