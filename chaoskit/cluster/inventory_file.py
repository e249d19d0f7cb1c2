"""Inventory files: a real cluster (or the netns lab) described in YAML.

Validated like scenarios: pydantic models with ``extra="forbid"`` are the single
source of truth, and every error reads ``file:line:col: message`` (the loader of
:mod:`chaoskit.scenario.loader` keeps the positions). Every value that can reach a
shell (address, user, interface, paths, power commands) must match a strict
pattern, so ``eth0;reboot`` is refused here, long before anything connects.

Example::

    name: rack-a
    ssh: {user: root, key: ~/.ssh/chaoskit, known_hosts: ./known_hosts}   # defaults for every node
    nodes:
      - name: gpu01
        address: 10.0.0.11
        labels: {rack: r1, role: worker}
        interfaces: {data: {name: ib0, address: 10.1.0.11}, mgmt: eno1}
        gpus: 8
        power:
          off: ipmitool -I lanplus -H bmc-gpu01 -U admin -f /etc/chaoskit/ipmi.pw chassis power off
          on: ipmitool -I lanplus -H bmc-gpu01 -U admin -f /etc/chaoskit/ipmi.pw chassis power on
          status: /usr/local/bin/is-powered-on gpu01

Power commands run **on the controller** (they talk to a BMC or a PDU, never to
the node itself), as argv without a shell; ``status`` exits 0 when the node is on.
Relative paths are relative to the inventory file.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from chaoskit.cluster.inventory import Inventory, Node
from chaoskit.errors import ScenarioError, SourcePos
from chaoskit.faults.api import NAME_RE, StrictModel
from chaoskit.scenario.durations import Duration

__all__ = [
    "InventoryFile",
    "NodeSpec",
    "SshSettings",
    "InterfaceSpec",
    "PowerCommands",
    "InventoryNode",
    "LoadedInventory",
    "load_inventory",
    "load_inventory_file",
    "build_inventory",
    "IFNAME_RE",
    "SAFE_TOKEN_RE",
    "check_ifname",
    "check_address",
]

IFNAME_RE = r"^[A-Za-z][A-Za-z0-9_.-]{0,14}$"
"""A Linux interface name: at most 15 characters, no shell metacharacters."""
SAFE_TOKEN_RE = r"^[A-Za-z0-9_@%+=:,./-]+$"
"""One argv element of a power command: no spaces, quotes, ``$``, ``;``, ``|``, ``&``, redirections or globs."""
SAFE_PATH_RE = r"^~?[A-Za-z0-9_@%+=:,./-]+$"
USER_RE = r"^[a-z_][a-z0-9_.-]{0,31}$"
HOSTNAME_RE = r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"


def check_ifname(value: str) -> str:
    if not isinstance(value, str) or not re.match(IFNAME_RE, value):
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
    if re.match(HOSTNAME_RE, value):
        return value
    raise ValueError(f"invalid address {value!r}: an IP address or a host name")


def _check_path(value: str) -> str:
    if not re.match(SAFE_PATH_RE, value):
        raise ValueError(f"invalid path {value!r}: letters, digits and _ @ % + = : , . / - only")
    return value


class SshSettings(StrictModel):
    """How to reach a node over SSH. At top level: defaults for every node; per node: overrides."""

    user: str = Field("root", description="Login user; commands run under `sudo -n` unless it is root.")
    port: int = Field(22, ge=1, le=65535)
    key: str | None = Field(None, description="Private key file (relative to the inventory file).")
    known_hosts: str | None = Field(None, description="known_hosts file the host keys are verified against.")
    trust_on_first_use: bool = Field(False, description="Accept an unknown host key once and pin it into known_hosts.")
    sudo: bool | None = Field(None, description="Run commands with `sudo -n`; default: when user is not root.")
    python: str = Field("python3", description="Python 3 on the node, for chaoskit's agent and lease watchdog.")
    connect_timeout: Duration = Field(10.0, description="Connect, banner and auth timeout.")
    command_timeout: Duration = Field(30.0, description="Default deadline of one command.")

    @field_validator("user")
    @classmethod
    def _user(cls, v: str) -> str:
        if not re.match(USER_RE, v):
            raise ValueError(f"invalid user name {v!r}")
        return v

    @field_validator("key", "known_hosts")
    @classmethod
    def _paths(cls, v: str | None) -> str | None:
        return None if v is None else _check_path(v)

    @field_validator("python")
    @classmethod
    def _python(cls, v: str) -> str:
        if not re.match(SAFE_TOKEN_RE, v):
            raise ValueError(f"invalid python command {v!r}")
        return v


class InterfaceSpec(StrictModel):
    """One NIC of a node by role (``data``, ``mgmt``): its device name and, optionally, its address."""

    name: str = Field(..., description="Device name on the node, e.g. eth0, ib0.")
    address: str | None = Field(None, description="The node's address on this network (used by partitions).")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_ifname(v)

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
            if not isinstance(token, (str, int)) or not re.match(SAFE_TOKEN_RE, str(token)):
                raise ValueError(
                    f"unsafe argument {token!r}: letters, digits and _ @ % + = : , . / - only "
                    "(commands run without a shell; put anything fancier in a script)"
                )
        return [str(t) for t in v]


class NodeSpec(StrictModel):
    """One node of the cluster."""

    name: str = Field(..., pattern=NAME_RE, description="Unique node name, used by selectors.")
    address: str = Field(..., description="Where the controller reaches it (IP or host name).")
    transport: Literal["ssh", "ray"] = Field(
        "ssh", description="How chaoskit reaches it: ssh, or ray (a ChaosAgent actor; needs ray: at the top level)."
    )
    ssh: SshSettings | None = Field(None, description="Overrides of the top-level ssh settings.")
    labels: dict[str, str] = Field(default_factory=dict, description="Selector labels, e.g. {rack: r1, role: worker}.")
    interfaces: dict[str, InterfaceSpec] = Field(default_factory=dict, description="NICs by role: data, mgmt, ...")
    gpus: int = Field(0, ge=0, le=1024)
    power: PowerCommands | None = None
    processes: Literal["all", "netns"] = Field(
        "all", description="Which processes belong to the node: all on the host, or those in the agent's network namespace (labs)."
    )
    workdir: str | None = Field(None, description="Node-side directory for chaoskit's files (default /tmp/chaoskit-<user>).")

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        return check_address(v)

    @field_validator("labels", mode="before")
    @classmethod
    def _labels(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        out = {}
        for key, value in v.items():
            for item in (str(key), str(value)):
                if not re.match(NAME_RE, item):
                    raise ValueError(f"invalid label {item!r}: letters, digits, '.', '_', '-' only")
            out[str(key)] = str(value)
        return out

    @field_validator("interfaces")
    @classmethod
    def _roles(cls, v: dict[str, InterfaceSpec]) -> dict[str, InterfaceSpec]:
        for role in v:
            if not re.match(NAME_RE, role):
                raise ValueError(f"invalid interface role {role!r}")
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith("/"):
            raise ValueError("workdir must be an absolute path on the node")
        return _check_path(v)


class InventoryFile(StrictModel):
    """An inventory: a name, SSH defaults and the nodes."""

    name: str = Field(..., pattern=NAME_RE, description="Cluster name (runs are locked per cluster).")
    ssh: SshSettings = Field(default_factory=SshSettings, description="Defaults for every node.")
    ray: str | None = Field(
        None,
        description=(
            "auto (RAY_ADDRESS, or the Ray cluster started on this machine) or the Ray head's HOST:PORT. Nodes are "
            "discovered from Ray with their labels and reached through ChaosAgent actors; a node started with the "
            "resource chaoskit_node_<name> gets that name. Listed nodes with transport: ray add labels and power commands."
        ),
    )
    nodes: list[NodeSpec] = Field(default_factory=list, description="The nodes (may be empty with ray:).")

    @field_validator("ray")
    @classmethod
    def _ray(cls, v: str | None) -> str | None:
        if v is None or v == "auto":
            return v
        host, sep, port = v.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"ray: {v!r} is neither auto nor HOST:PORT")
        check_address(host)
        return v

    @model_validator(mode="after")
    def _nodes_or_ray(self) -> "InventoryFile":
        if not self.nodes and self.ray is None:
            raise ValueError("nodes: list at least one node, or set ray: auto to discover them from Ray")
        for node in self.nodes:
            if node.transport == "ray" and self.ray is None:
                raise ValueError(f"node {node.name} has transport: ray but the inventory has no ray: (auto or HOST:PORT)")
        return self

    def ssh_for(self, node: NodeSpec) -> SshSettings:
        """The node's effective SSH settings: its own keys over the top-level ones."""
        if node.ssh is None:
            return self.ssh
        return self.ssh.model_copy(update={k: getattr(node.ssh, k) for k in node.ssh.model_fields_set})


@dataclass
class InventoryNode(Node):
    """A :class:`~chaoskit.cluster.inventory.Node` with what network and power faults need."""

    interfaces: dict[str, InterfaceSpec] = field(default_factory=dict)
    power: PowerCommands | None = None
    ssh: SshSettings | None = None
    processes: str = "all"
    workdir: str | None = None

    def interface(self, role_or_name: str) -> InterfaceSpec:
        """The NIC for a role (``data``) or, when no role has that name, a device given by name."""
        if role_or_name in self.interfaces:
            return self.interfaces[role_or_name]
        for spec in self.interfaces.values():
            if spec.name == role_or_name:
                return spec
        if role_or_name in ("data", "mgmt"):
            from chaoskit.errors import InfraError

            raise InfraError(
                f"node {self.name} has no {role_or_name!r} interface in the inventory",
                hint=f"add interfaces: {{{role_or_name}: {{name: eth0}}}} to node {self.name}",
            )
        return InterfaceSpec(name=role_or_name)


@dataclass
class LoadedInventory:
    path: Path
    model: InventoryFile
    source: Any  # SourceMap

    def error(self, message: str, *path: Any) -> ScenarioError:
        return ScenarioError(message, pos=self.source.at(path))


def load_inventory_file(path: str | Path) -> LoadedInventory:
    """Parse and validate an inventory file; raise :class:`ScenarioError` (``file:line:col``) at the first problem."""
    from pydantic import ValidationError

    from chaoskit.scenario import _to_error
    from chaoskit.scenario.loader import load_yaml

    path = Path(path)
    data, smap = load_yaml(path)
    if not isinstance(data, dict):
        raise ScenarioError("an inventory must be a YAML mapping (name:, nodes:)", pos=SourcePos(str(path), 1, 1))
    try:
        model = InventoryFile.model_validate(data)
    except ValidationError as exc:
        raise _to_error(exc.errors(include_url=False)[0], data, smap) from None
    loaded = LoadedInventory(path, model, smap)
    seen: dict[str, int] = {}
    for i, node in enumerate(model.nodes):
        if node.name in seen:
            raise loaded.error(f"nodes.{i}.name: duplicate node name {node.name!r} (also nodes.{seen[node.name]})", "nodes", i, "name")
        seen[node.name] = i
    return loaded


def build_inventory(loaded: LoadedInventory, *, trust_on_first_use: bool | None = None) -> Inventory:
    """Nodes with their SSH transports (not connected yet: each connects on first use;
    :func:`chaoskit.cluster.transports.ssh.connect_all` connects them all at once).

    With ``ray:`` the live Ray nodes are discovered too (a GCS query, no driver):
    listed ``transport: ray`` nodes take theirs, and unlisted ones are added."""
    from chaoskit.cluster.transports.ssh import SSHTransport

    base = loaded.path.resolve().parent
    nodes: list[Node] = []
    discovered: dict[str, tuple[dict[str, str], Any]] = {}
    if loaded.model.ray is not None:
        from chaoskit.cluster.transports.ray import discover_nodes

        discovered = {name: (labels, conn) for name, labels, conn in discover_nodes(loaded.model.ray)}
    for i, spec in enumerate(loaded.model.nodes):
        if spec.transport == "ray":
            if spec.name not in discovered:
                raise loaded.error(f"nodes.{i}.name: no live Ray node is named {spec.name!r} (found: "
                                   f"{', '.join(sorted(discovered)) or 'none'})", "nodes", i, "name")
            labels, conn = discovered.pop(spec.name)
            nodes.append(InventoryNode(
                name=spec.name, address=spec.address, transport="ray", labels={**labels, **spec.labels}, gpus=spec.gpus,
                conn=conn, interfaces=dict(spec.interfaces), power=spec.power, processes=spec.processes, workdir=spec.workdir,
            ))
            continue
        ssh = loaded.model.ssh_for(spec)
        conn = SSHTransport(
            spec.name,
            spec.address,
            user=ssh.user,
            port=ssh.port,
            key_file=_resolve(base, ssh.key),
            known_hosts=_resolve(base, ssh.known_hosts),
            trust_on_first_use=ssh.trust_on_first_use if trust_on_first_use is None else trust_on_first_use,
            sudo=ssh.sudo,
            python=ssh.python,
            workdir=spec.workdir,
            process_scope=spec.processes,
            connect_timeout=ssh.connect_timeout,
            command_timeout=ssh.command_timeout,
        )
        nodes.append(InventoryNode(
            name=spec.name, address=spec.address, transport=spec.transport, labels=dict(spec.labels),
            gpus=spec.gpus, conn=conn, interfaces=dict(spec.interfaces), power=spec.power, ssh=ssh,
            processes=spec.processes, workdir=spec.workdir,
        ))
    for name, (labels, conn) in discovered.items():  # Ray's nodes the file does not list
        if name not in {n.name for n in nodes}:
            nodes.append(InventoryNode(name=name, address="", transport="ray", labels=labels, conn=conn))
    return Inventory(loaded.model.name, nodes)


def load_inventory(path: str | Path, **kwargs: Any) -> Inventory:
    """:func:`load_inventory_file` then :func:`build_inventory`."""
    return build_inventory(load_inventory_file(path), **kwargs)


def _resolve(base: Path, value: str | None) -> str | None:
    if value is None:
        return None
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else base / p)
