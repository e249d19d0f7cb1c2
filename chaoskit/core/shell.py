"""Values that may reach a command line on a node or the controller.

Every such value is validated against one of these strict patterns when its
input file is loaded, long before anything connects, and is then quoted with
:func:`shell_quote` anyway.
"""

from __future__ import annotations

import ipaddress
import re
import shlex

__all__ = [
    "IFNAME_RE", "SAFE_TOKEN_RE", "SAFE_PATH_RE", "USER_RE", "HOSTNAME_RE",
    "check_ifname", "check_address", "check_path", "shell_quote",
]

IFNAME_RE = r"^[A-Za-z][A-Za-z0-9_.-]{0,14}$"
"""A Linux interface name: at most 15 characters, no shell metacharacters."""
SAFE_TOKEN_RE = r"^[A-Za-z0-9_@%+=:,./-]+$"
"""One argv element of a power command: no spaces, quotes, ``$``, ``;``, ``|``, ``&``, redirections or globs."""
SAFE_PATH_RE = r"^~?[A-Za-z0-9_@%+=:,./-]+$"
USER_RE = r"^[a-z_][a-z0-9_.-]{0,31}$"
HOSTNAME_RE = r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"


def check_ifname(value: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(IFNAME_RE, value):
        raise ValueError(f"invalid interface name {value!r}: up to 15 letters, digits, '_', '.', '-', starting with a letter")
    return value


def check_address(value: str) -> str:
    """An IPv4/IPv6 address or a DNS name; nothing else reaches a shell."""
    if not isinstance(value, str):
        raise ValueError("address must be a string")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if re.fullmatch(HOSTNAME_RE, value):
        return value
    raise ValueError(f"invalid address {value!r}: an IP address or a host name")


def check_path(value: str) -> str:
    if not re.fullmatch(SAFE_PATH_RE, value):
        raise ValueError(f"invalid path {value!r}: letters, digits and _ @ % + = : , . / - only")
    return value


def shell_quote(argv: list[str]) -> str:
    """One command line from ``argv``, every element quoted."""
    return " ".join(shlex.quote(str(a)) for a in argv)
