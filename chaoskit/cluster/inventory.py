"""The nodes a run may touch, and what chaoskit knows of each. Nothing outside the inventory is ever acted on.

A :class:`Node` carries everything a fault may need: its transport, labels, NICs
by role, power commands and SSH settings. The models of those parts
(:class:`InterfaceSpec`, :class:`PowerCommands`, :class:`SshSettings`) are the
inventory file's syntax too (:mod:`chaoskit.cluster.inventory_file` loads it).
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from chaoskit.core.durations import Duration
from chaoskit.core.errors import InfraError
from chaoskit.core.models import NAME_RE, IfName, StrictModel, check_match
from chaoskit.core.shell import SAFE_TOKEN_RE, USER_RE, check_path

if TYPE_CHECKING:  # pragma: no cover
    from chaoskit.cluster.transports.api import Transport

__all__ = ["Node", "Inventory", "InterfaceSpec", "PowerCommands", "SshSettings"]

_TOKENS = {"user": (USER_RE, "user name"), "python": (SAFE_TOKEN_RE, "python command")}
"""The SSH settings' values that reach a command line as they are: the pattern of each, and its name."""


class SshSettings(StrictModel):
    """How to reach a node over SSH. At top level: defaults for every node; per node: overrides.

    A value set here wins over the OpenSSH client config (``config``), which fills in only
    what the inventory leaves unset (HostName, User, Port, IdentityFile, ProxyJump)."""

    user: str = Field("root", description="Login user; commands run under `sudo -n` unless it is root (see become).")
    port: int = Field(22, ge=1, le=65535)
    key: str | None = Field(None, description="Private key file (relative to the inventory file).")
    known_hosts: str | None = Field(None, description="known_hosts file the host keys are verified against.")
    trust_on_first_use: bool = Field(False, description="Accept an unknown host key once and pin it into known_hosts.")
    become: Literal["sudo", "none"] | None = Field(
        None,
        description="sudo: chaoskit's agent and every command run under `sudo -n` (needs password-less sudo); "
        "none: as the login user; default: sudo unless user is root.",
    )
    jump: str | None = Field(
        None, pattern=NAME_RE,
        description="Name of a bastion (top-level bastions:) to connect through, like OpenSSH's ProxyJump; "
        "none: connect directly.",
    )
    config: str | None = Field(
        None,
        description="OpenSSH client config whose Host entries turn an address that is an alias into HostName, User, "
        "Port, IdentityFile and ProxyJump; default ~/.ssh/config when it exists; none: read no config.",
    )
    python: str = Field("python3", description="Python 3 on the node, for chaoskit's agent and lease watchdog.")
    connect_timeout: Duration = Field(10.0, description="Connect, banner and auth timeout.")
    command_timeout: Duration = Field(30.0, description="Default deadline of one command.")

    @field_validator("become", mode="before")
    @classmethod
    def _become(cls, v: Any) -> Any:
        if v is not None and v not in ("sudo", "none"):
            raise ValueError(f"only 'sudo' (or 'none') is supported, not {v!r}")
        return v

    @field_validator("user", "python")
    @classmethod
    def _tokens(cls, v: str, info: ValidationInfo) -> str:
        return check_match(v, *_TOKENS[info.field_name])

    @field_validator("key", "known_hosts", "config")
    @classmethod
    def _paths(cls, v: str | None) -> str | None:
        return None if v is None else check_path(v)


class InterfaceSpec(StrictModel):
    """One NIC of a node by role (``data``, ``mgmt``): its device name and, optionally, its address."""

    name: IfName = Field(..., description="Device name on the node, e.g. eth0, ib0.")
    address: str | None = Field(None, description="The node's address on this network (used by partitions).")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v

    @field_validator("address")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        if v is None:
            return None
        try:
            return str(ipaddress.ip_address(v))
        except ValueError:
            raise ValueError(f"invalid interface address {v!r}: an IP address") from None


class PowerCommands(StrictModel):
    """Commands run on the controller to switch a node off and on (e.g. ipmitool against its BMC)."""

    off: list[str] | None = Field(None, description="Power the node off.")
    on: list[str] | None = Field(None, description="Power it back on; without it a power-off needs allow_irreversible.")
    status: list[str] | None = Field(None, description="Exit 0 when the node is on.")
    timeout: Duration = Field(60.0, description="Deadline of each power command.")

    @model_validator(mode="before")
    @classmethod
    def _yaml_booleans(cls, v: Any) -> Any:
        # YAML 1.1 reads a bare `off:` / `on:` key as a boolean.
        if isinstance(v, dict):
            return {({True: "on", False: "off"}.get(k, k) if isinstance(k, bool) else k): val for k, val in v.items()}
        return v

    @field_validator("off", "on", "status", mode="before")
    @classmethod
    def _argv(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                v = shlex.split(v)
            except ValueError as exc:
                raise ValueError(f"cannot split command: {exc}") from None
        if v is None:
            return v
        if not isinstance(v, list) or not v:
            raise ValueError("a command is a non-empty list of arguments (or one string)")
        for token in v:
            if not isinstance(token, (str, int)) or not re.fullmatch(SAFE_TOKEN_RE, str(token)):
                raise ValueError(
                    f"unsafe argument {token!r}: letters, digits and _ @ % + = : , . / - only "
                    "(commands run without a shell; put anything fancier in a script)"
                )
        return [str(t) for t in v]


@dataclass
class Node:
    """One node: its name, address, labels, the transport that reaches it, and what network and power faults need."""

    name: str
    address: str = "127.0.0.1"
    transport: str = "local"
    labels: dict[str, str] = field(default_factory=dict)
    gpus: int = 0
    conn: "Transport | None" = None
    gpu_pci: tuple[str, ...] = ()
    """The PCI bus ids of the node's GPUs, in index order (``0000:3b:00.0``): what an Xid line names a device by.
    The labs give each node one emulated id (:func:`chaoskit.cluster.xid.lab_pci`)."""
    interfaces: dict[str, InterfaceSpec] = field(default_factory=dict)
    """NICs by role (``data``, ``mgmt``)."""
    power: PowerCommands | None = None
    """Commands run on the controller to switch the node off and on; ``None`` when it has none."""
    ssh: SshSettings | None = None
    processes: str = "all"
    """Which processes belong to the node: ``all`` on the host, or ``netns`` (those in the agent's namespace)."""
    workdir: str | None = None
    scheduler: Any = None
    """How to reach the Slurm that manages this node (a :class:`chaoskit.cluster.slurm.SlurmAccess`), when one does;
    the node's Slurm name is its name. Scheduler faults (``slurm.drain``, ``slurm.requeue``) act through it."""

    def matches(self, labels: dict[str, str] | None) -> bool:
        return all(self.labels.get(k) == str(v) for k, v in (labels or {}).items())

    def interface(self, role_or_name: str) -> InterfaceSpec:
        """The NIC for a role (``data``) or, when no role has that name, a device given by name."""
        if role_or_name in self.interfaces:
            return self.interfaces[role_or_name]
        for spec in self.interfaces.values():
            if spec.name == role_or_name:
                return spec
        if role_or_name in ("data", "mgmt"):
            raise InfraError(
                f"node {self.name} has no {role_or_name!r} interface in the inventory",
                hint=f"add interfaces: {{{role_or_name}: {{name: eth0}}}} to node {self.name}",
            )
        return InterfaceSpec(name=role_or_name)


@dataclass
class Inventory:
    """An ordered set of nodes with unique names."""

    name: str
    nodes: list[Node]
    shared: list[Any] = field(default_factory=list)
    """Connections several nodes share (the bastions they are reached through); closed with them."""
    policy: Any = None
    """The cluster owners' :class:`~chaoskit.cluster.policy.SitePolicy` (``None``: none set)."""

    def __post_init__(self) -> None:
        self._by_name = {n.name: n for n in self.nodes}

    def __getitem__(self, name: str) -> Node:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def close(self) -> None:
        """Drop every node's connection (a run's end); a later command would reconnect."""
        for node in self.nodes:
            if node.conn is not None:
                node.conn.close()
        for conn in self.shared:
            conn.close()

    def select(self, names: list[str] | None = None, labels: dict[str, str] | None = None) -> list[Node]:
        """Nodes named in ``names`` (all when ``None``) that carry every label in ``labels``."""
        chosen = self.nodes if names is None else [self._by_name[n] for n in names if n in self._by_name]
        return [n for n in chosen if n.matches(labels)]
