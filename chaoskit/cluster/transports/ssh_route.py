"""How the SSH transport reaches a node: OpenSSH client config aliases and bastions (ProxyJump).

- :func:`host_config` reads an OpenSSH client config (``~/.ssh/config``) with
  ``paramiko.SSHConfig`` and answers what it says about one host: HostName,
  User, Port, IdentityFile, ProxyJump. It parses the text its caller read and checked.
- :func:`parse_jumps` splits a ProxyJump value (``[user@]host[:port]``, comma
  separated, the first hop nearest to the controller).
- :class:`Bastions` holds the bastions of one inventory: one connection each,
  shared by every node behind it, created on first use when a config's
  ProxyJump names one, and closed with the inventory.

paramiko is imported only when a config is read, never at import time.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any, Callable

from chaoskit.core.errors import InfraError
from chaoskit.core.shell import USER_RE, check_address

__all__ = ["host_config", "parse_jumps", "Bastions"]

_JUMP_RE = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<host>\[[^\]\s]+\]|[^:@\s]+)(?::(?P<port>\d{1,5}))?$")


def host_config(text: str, path: str, alias: str) -> dict[str, Any]:
    """What the OpenSSH client config ``text`` (the file ``path``, as the caller read and checked it) says about
    ``alias``: any of ``hostname``, ``user``, ``port`` (int), ``identityfile`` (the first, ``~`` expanded),
    ``proxyjump``. paramiko parses the text given (``SSHConfig.from_text``), never the file again.

    Values are checked like the inventory's own (a config is input too); a bad one raises
    :class:`InfraError` naming the file and the host."""
    try:
        import paramiko
    except ImportError:
        raise InfraError("the SSH transport needs paramiko", hint="pip install 'chaoskit[ssh]'") from None
    try:
        entry = paramiko.SSHConfig.from_text(text).lookup(alias)
    except (OSError, paramiko.SSHException, ValueError) as exc:
        raise InfraError(f"cannot read the ssh config {path}: {exc}", hint="fix it, or set ssh.config: none") from None
    out: dict[str, Any] = {}
    try:
        if entry.get("hostname") and entry["hostname"] != alias:
            out["hostname"] = check_address(entry["hostname"])
        if "user" in entry:
            if not re.fullmatch(USER_RE, entry["user"]):
                raise ValueError(f"invalid user name {entry['user']!r}")
            out["user"] = entry["user"]
        if "port" in entry:
            port = int(entry["port"])
            if not 0 < port < 65536:
                raise ValueError(f"invalid port {entry['port']!r}")
            out["port"] = port
        if entry.get("identityfile"):
            out["identityfile"] = os.path.expanduser(entry["identityfile"][0])
        if entry.get("proxyjump"):
            out["proxyjump"] = entry["proxyjump"]
    except ValueError as exc:
        raise InfraError(f"ssh config {path}, Host {alias}: {exc}") from None
    return out


def parse_jumps(value: str) -> list[tuple[str | None, str, int | None]]:
    """``[user@]host[:port][,...]`` as (user, host, port) hops, nearest to the controller first;
    ``none`` is no hop."""
    if value.strip().lower() == "none":
        return []
    hops = []
    for part in value.split(","):
        m = _JUMP_RE.match(part.strip())
        if m is None:
            raise InfraError(f"cannot read ProxyJump {value!r}: expected [user@]host[:port], comma separated")
        host = m["host"].strip("[]")
        try:
            check_address(host)
        except ValueError as exc:
            raise InfraError(f"ProxyJump {value!r}: {exc}") from None
        hops.append((m["user"], host, int(m["port"]) if m["port"] else None))
    return hops


class Bastions:
    """The bastions of one inventory, by name: one connection each, shared by the nodes behind them.

    Thread-safe: nodes connecting in parallel get the same bastion object, whose own
    lock serialises (re)connecting it."""

    def __init__(self) -> None:
        self._by_key: dict[Any, Any] = {}
        self._lock = threading.Lock()

    def add(self, key: Any, bastion: Any) -> Any:
        with self._lock:
            return self._by_key.setdefault(key, bastion)

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        """The bastion under ``key``, made by ``make()`` the first time."""
        with self._lock:
            if key not in self._by_key:
                self._by_key[key] = make()
            return self._by_key[key]

    def __getitem__(self, key: Any) -> Any:
        return self._by_key[key]

    def close(self) -> None:
        with self._lock:
            bastions = list(self._by_key.values())
        for bastion in bastions:
            bastion.close()
