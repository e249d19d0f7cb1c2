"""Inventory files: a real cluster (or the netns lab) described in YAML; the format and its checks.

:mod:`chaoskit.cluster.inventory_file` builds the nodes and their transports from one; this module
imports no transport, so ``chaoskit validate`` checks inventories without loading them.

Validated like scenarios: pydantic models with ``extra="forbid"`` are the single
source of truth, and every error reads ``file:line:col: message`` (the loader of
:mod:`chaoskit.core.yaml_source` keeps the positions). Every value that can reach a
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

Reaching the nodes: a site's nodes often sit behind a bastion and accept only a
non-root user with sudo::

    name: site
    ssh:
      user: ops                     # not root, so become: sudo is the default
      become: sudo                  # chaoskit's agent runs under `sudo -n`: password-less sudo (NOPASSWD) needed
      key: ~/.ssh/chaoskit
      known_hosts: ./known_hosts    # the nodes' and the bastion's host keys
      jump: gw                      # every node through the bastion gw (OpenSSH's ProxyJump); a node may say jump: none
    bastions:
      - name: gw
        address: bastion.example.org
        ssh: {user: ops, port: 2222} # over the top-level ssh: settings (its own jump: chains bastions)
    nodes:
      - {name: gpu01, address: 10.0.0.11}
      - {name: gpu02, address: gpu02}   # a Host alias of ~/.ssh/config

``ssh.config`` (default ``~/.ssh/config`` when it exists; ``none`` for no config) is
read with OpenSSH's rules: when an address matches a ``Host`` entry, its HostName,
User, Port, IdentityFile and ProxyJump (a host looked up in the same config) apply,
except where the inventory sets the value itself. The bastion's host key is verified
against ``known_hosts`` like a node's. ``become`` other than sudo or none, a ``jump``
no bastion answers to, and a bastion named like a node are refused here.

Power commands run **on the controller** (they talk to a BMC or a PDU, never to
the node itself), as argv without a shell; ``status`` exits 0 when the node is on.
Relative paths are relative to the inventory file.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from chaoskit.cluster.inventory import InterfaceSpec, PowerCommands, SshSettings
from chaoskit.cluster.policy import SitePolicy, load_policy_file, narrowest, site_policy, with_origin
from chaoskit.cluster.ssh_paths import config_problems, inside, ssh_roots
from chaoskit.cluster.transports.registry import inventory_transports
from chaoskit.cluster.xid import normalize_pci
from chaoskit.core.errors import ScenarioError, SourcePos, did_you_mean
from chaoskit.core.trusted import untrusted_program
from chaoskit.core.models import NAME_RE, NAME_RULE, StrictModel, check_each
from chaoskit.core.shell import check_address, check_path
from chaoskit.core.yaml_source import SourceMap, load_yaml, validation_errors

__all__ = [
    "InventoryFile",
    "NodeSpec",
    "LoadedInventory",
    "load_inventory_file",
    "looks_like_inventory",
    "validate_inventory_data",
]

class NodeSpec(StrictModel):
    """One node of the cluster."""

    name: str = Field(..., pattern=NAME_RE, description="Unique node name, used by selectors.")
    address: str = Field(..., description="Where the controller reaches it (IP or host name).")
    transport: str = Field("ssh", json_schema_extra=lambda schema: schema.update(enum=inventory_transports()), description=(
        "How chaoskit reaches it: one of the transports that make an inventory's node (chaoskit.cluster.transports: "
        "ssh, or ray, a ChaosAgent actor, which needs ray: at the top level)."))
    ssh: SshSettings | None = Field(None, description="Overrides of the top-level ssh settings.")
    labels: dict[str, str] = Field(default_factory=dict, description="Selector labels, e.g. {rack: r1, role: worker}.")
    interfaces: dict[str, InterfaceSpec] = Field(default_factory=dict, description="NICs by role: data, mgmt, ...")
    gpus: int = Field(0, ge=0, le=1024)
    gpu_pci: list[str] = Field(default_factory=list, max_length=1024, description=(
        "PCI bus ids of the node's GPUs in index order (0000:3b:00.0, as nvidia-smi --query-gpu=pci.bus_id or lspci "
        "write them): where nvidia-smi cannot be asked, gpu.xid names a device by them and the kernel-log probe "
        "attributes an Xid line to the node that owns its id."))
    power: PowerCommands | None = None
    processes: Literal["all", "netns"] = Field(
        "all", description="Which processes belong to the node: all on the host, or those in the agent's network namespace (labs)."
    )
    workdir: str | None = Field(None, description=(
        "Node-side folder for chaoskit's files (leases, the watchdog, faults' state). Default: /run/chaoskit when "
        "chaoskit runs as root there (sudo), else ~/.local/state/chaoskit of the SSH user. Made 0700 when missing; "
        "refused unless it is a real folder (not a link) of the user chaoskit runs as that nobody else can write, "
        "under folders only root or that user can change."))

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        return check_address(v)

    @field_validator("transport")
    @classmethod
    def _transport(cls, v: str) -> str:
        known = inventory_transports()
        if v not in known:
            raise ValueError(f"unknown transport {v!r}{did_you_mean(v, known)}: an inventory's node is reached by "
                             f"{' or '.join(known)}")
        return v

    @field_validator("labels", mode="before")
    @classmethod
    def _labels(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        out = {}
        for key, value in v.items():
            check_each((str(key), str(value)), NAME_RE, "label", NAME_RULE)
            out[str(key)] = str(value)
        return out

    @field_validator("gpu_pci")
    @classmethod
    def _gpu_pci(cls, v: list[str]) -> list[str]:
        for item in v:
            normalize_pci(str(item))  # ValueError names the bad id
        if len({normalize_pci(i) for i in v}) != len(v):
            raise ValueError("a PCI bus id is listed twice")
        return [str(i) for i in v]

    @field_validator("interfaces")
    @classmethod
    def _roles(cls, v: dict[str, InterfaceSpec]) -> dict[str, InterfaceSpec]:
        return check_each(v, NAME_RE, "interface role")

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith("/"):
            raise ValueError("workdir must be an absolute path on the node")
        return check_path(v)


class BastionSpec(StrictModel):
    """A bastion (jump host): nodes whose ``ssh.jump`` names it are reached through it."""

    name: str = Field(..., pattern=NAME_RE, description="Unique name, given by ssh.jump; not a node's name.")
    address: str = Field(..., description="Where the controller reaches it (IP, host name or ssh config alias).")
    ssh: SshSettings | None = Field(
        None, description="Over the top-level ssh settings (their jump and become excepted); its own jump chains bastions."
    )

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        return check_address(v)


class InventoryFile(StrictModel):
    """An inventory: a name, SSH defaults, the bastions and the nodes."""

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
    bastions: list[BastionSpec] = Field(
        default_factory=list, description="Jump hosts, named by ssh.jump; one connection each, shared by its nodes."
    )
    nodes: list[NodeSpec] = Field(default_factory=list, description="The nodes (may be empty with ray:).")
    policy: SitePolicy | str | None = Field(None, description=(
        "The site policy (what drills on this cluster may do: fault kinds, path roots, the agent's Python, node "
        "limits), inline or a file (relative to the inventory) that only its owner can write."))

    @field_validator("policy")
    @classmethod
    def _policy_file(cls, v: "SitePolicy | str | None") -> "SitePolicy | str | None":
        return check_path(v) if isinstance(v, str) else v

    @field_validator("ray")
    @classmethod
    def _ray(cls, v: str | None) -> str | None:
        if v is None or v == "auto":
            return v
        host, sep, port = v.rpartition(":")
        if not sep or not (port.isascii() and port.isdigit() and len(port) <= 5) or not 0 < int(port) < 65536:
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

    def ssh_for_bastion(self, bastion: BastionSpec) -> SshSettings:
        """A bastion's effective SSH settings: its own over the top-level ones, whose jump (the
        nodes' route) and become (no command runs on a bastion) do not apply."""
        base = self.ssh.model_copy(update={"jump": None, "become": None})
        base.__pydantic_fields_set__.difference_update({"jump", "become"})
        if bastion.ssh is None:
            return base
        return base.model_copy(update={k: getattr(bastion.ssh, k) for k in bastion.ssh.model_fields_set})


@dataclass
class LoadedInventory:
    path: Path
    model: InventoryFile
    source: Any  # SourceMap
    policy: SitePolicy | None = None
    """The site policy: this machine's (``/etc/chaoskit/policy.yaml``) narrowed by the inventory's own, read from
    ``policy:`` inline or from the file it names."""

    def error(self, message: str, *path: Any) -> ScenarioError:
        return ScenarioError(message, pos=self.source.at(path))


def load_inventory_file(path: str | Path) -> LoadedInventory:
    """Parse and validate an inventory file; raise :class:`ScenarioError` (``file:line:col``) at the first problem."""
    path = Path(path)
    data, smap = load_yaml(path, what="inventory")
    res = validate_inventory_data(path, data, smap)
    if isinstance(res, list):
        raise res[0]
    return res


def looks_like_inventory(data: Any) -> bool:
    """Whether a YAML document is an inventory rather than a scenario: a mapping with
    ``nodes:`` or ``ray:`` and no ``faults:``."""
    return isinstance(data, dict) and ("nodes" in data or "ray" in data) and "faults" not in data


def validate_inventory_data(path: Path, data: Any, smap: SourceMap) -> "LoadedInventory | list[ScenarioError]":
    """Validate an inventory already read by :func:`~chaoskit.core.yaml_source.load_yaml`:
    the loaded inventory, or every error found in it."""
    if not isinstance(data, dict):
        return [ScenarioError("an inventory must be a YAML mapping (name:, nodes:)", pos=smap.at(()))]
    try:
        model = InventoryFile.model_validate(data)
    except ValidationError as exc:
        return validation_errors(exc, data, smap, InventoryFile)
    loaded = LoadedInventory(path, model, smap)
    policy = _policy(loaded)
    if isinstance(policy, list):
        return policy
    machine = site_policy()  # this machine's, for every inventory: an inventory's own can only narrow it
    if isinstance(machine, list):
        return machine
    loaded.policy = narrowest(machine, policy) if machine is not None else policy
    seen: dict[str, int] = {}
    errors = []
    for i, node in enumerate(model.nodes):
        if node.name in seen:
            errors.append(loaded.error(f"nodes.{i}.name: duplicate node name {node.name!r} (also nodes.{seen[node.name]})",
                                       "nodes", i, "name"))
        seen.setdefault(node.name, i)
    errors += _bastion_errors(loaded, seen)
    errors += _python_errors(loaded)
    errors += _ssh_path_errors(loaded)
    errors += _power_and_ray_errors(loaded)
    return sorted(errors, key=lambda e: (e.pos.line, e.pos.col) if e.pos else (0, 0)) or loaded


def _policy(loaded: LoadedInventory) -> "SitePolicy | None | list[ScenarioError]":
    """The inventory's policy: inline (validated again at its own lines) or from its file (trusted first)."""
    value = loaded.model.policy
    if value is None:
        return None
    if isinstance(value, str):
        file = Path(value).expanduser()
        file = file if file.is_absolute() else loaded.path.parent / file
        res = load_policy_file(file)
        if not isinstance(res, list):
            return with_origin(res, [f"{file} (named by inventory {loaded.path})"])
        if isinstance(res, list):
            where = loaded.source.at(("policy",))
            for err in res:
                if err.pos is None:
                    err.pos = where
                else:
                    err.message = f"{err.message} (policy of {where})"
        return res
    return with_origin(value, [f"inventory {loaded.path} (its policy:)"])


def _ssh_path_errors(loaded: LoadedInventory) -> list[ScenarioError]:
    """Every ssh.config, ssh.key and ssh.known_hosts inside the allowed roots, and no config that runs a command
    (:mod:`~chaoskit.cluster.ssh_paths`); a config's problem is at its own line, naming the inventory's."""
    model, base = loaded.model, loaded.path.parent
    policy = loaded.policy
    roots = ssh_roots(policy.ssh_roots if policy is not None else None, base)
    if not any(n.transport == "ssh" for n in model.nodes) and not model.bastions:
        return []
    places: list[tuple[SshSettings | None, tuple[Any, ...]]] = [(model.ssh, ("ssh",))]
    places += [(node.ssh, ("nodes", i, "ssh")) for i, node in enumerate(model.nodes)]
    places += [(b.ssh, ("bastions", j, "ssh")) for j, b in enumerate(model.bastions)]
    errors: list[ScenarioError] = []
    checked: set[str] = set()
    for ssh, at in places:
        if ssh is None:
            continue
        top = at == ("ssh",)
        for field in ("config", "key", "known_hosts"):
            value = getattr(ssh, field)
            if not top and field not in ssh.model_fields_set:
                continue
            dotted = ".".join(map(str, at + (field,)))
            if value is None or (field == "config" and value == "none"):  # the operator's own ~/.ssh/config: theirs
                continue
            else:
                full = Path(value).expanduser()
                path, where = str(full if full.is_absolute() else base / full), loaded.source.at(at + (field,))
            if path is None:
                continue
            if not inside(path, roots):
                errors.append(ScenarioError(f"{dotted}: {path} is outside the allowed roots ({', '.join(roots)}); "
                                            "chaoskit reads and writes SSH files there only (site policy ssh_roots)",
                                            pos=where))
                continue
            if field == "config" and path not in checked:
                checked.add(path)
                for file, line, col, message in config_problems(path, roots):
                    errors.append(ScenarioError(f"{message} ({dotted} of {where})", pos=SourcePos(file, line, col)))
    return errors


def _power_and_ray_errors(loaded: LoadedInventory) -> list[ScenarioError]:
    """A node's power commands run on this machine as the operator: each program only root can change (and one the
    policy's power_programs names, where it names any); ray: joins a Ray cluster as a driver: one the policy names."""
    model, policy = loaded.model, loaded.policy
    errors = []
    for i, node in enumerate(model.nodes):
        if node.power is None:
            continue
        for action in ("off", "on", "status"):
            argv = getattr(node.power, action)
            if not argv:
                continue
            where = ("nodes", i, "power", action)
            program = str(argv[0])
            found = program if "/" in program else shutil.which(program)
            if policy is not None and policy.power_programs is not None and (
                    found is None or found not in policy.power_programs):
                errors.append(loaded.error(f"nodes.{i}.power.{action}: the site policy lets power commands run only "
                                           f"{', '.join(policy.power_programs) or 'nothing'}, not {program!r}", *where))
                continue
            # absent on this machine: checked again when it runs (run_power_command)
            problem = untrusted_program(program) if found is not None and os.path.exists(found) else None
            if problem:
                errors.append(loaded.error(f"nodes.{i}.power.{action}: {problem}", *where))
    if model.ray is not None and policy is not None and policy.ray_addresses is not None \
            and model.ray not in policy.ray_addresses:
        errors.append(loaded.error(f"ray: the site policy lets chaoskit join only the Ray clusters "
                                   f"{', '.join(policy.ray_addresses) or '(none)'}, not {model.ray!r}", "ray"))
    return errors


def _python_errors(loaded: LoadedInventory) -> list[ScenarioError]:
    """With a policy naming the agent's Pythons, every node's ``ssh.python`` must be one of them."""
    policy, model = loaded.policy, loaded.model
    if policy is None or policy.python is None:
        return []
    allowed = ", ".join(policy.python)
    errors = []
    places: list[tuple[SshSettings | None, tuple[Any, ...]]] = [(model.ssh, ("ssh",))]
    places += [(node.ssh, ("nodes", i, "ssh")) for i, node in enumerate(model.nodes)]
    for ssh, at in places:
        if ssh is None or (at != ("ssh",) and "python" not in ssh.model_fields_set):
            continue
        if ssh.python not in policy.python:
            dotted = ".".join(map(str, at + ("python",)))
            errors.append(loaded.error(f"{dotted}: the site policy lets the agent run only {allowed}, not {ssh.python!r} "
                                       "(an absolute, root-owned Python)", *at, "python"))
    return errors


def _bastion_errors(loaded: LoadedInventory, nodes: dict[str, int]) -> list[ScenarioError]:
    """Bastion names unique and unlike any node's; every ``jump`` names a bastion; no bastion reaches itself."""
    model = loaded.model
    errors = []
    bastions: dict[str, int] = {}
    for j, bastion in enumerate(model.bastions):
        where = f"bastions.{j}.name"
        if bastion.name == "none":
            errors.append(loaded.error(f"{where}: 'none' means no bastion in ssh.jump; name the bastion otherwise",
                                       "bastions", j, "name"))
        elif bastion.name in bastions:
            errors.append(loaded.error(f"{where}: duplicate bastion name {bastion.name!r} (also bastions.{bastions[bastion.name]})",
                                       "bastions", j, "name"))
        elif bastion.name in nodes:
            errors.append(loaded.error(f"{where}: {bastion.name!r} is also the name of a node (nodes.{nodes[bastion.name]}); "
                                       "a bastion and a node need different names", "bastions", j, "name"))
        bastions.setdefault(bastion.name, j)
    known = ", ".join(sorted(bastions)) if bastions else "none (the inventory has no bastions:)"
    jumps: list[tuple[SshSettings | None, tuple[Any, ...]]] = [(model.ssh, ("ssh",))]
    jumps += [(node.ssh, ("nodes", i, "ssh")) for i, node in enumerate(model.nodes)]
    jumps += [(bastion.ssh, ("bastions", j, "ssh")) for j, bastion in enumerate(model.bastions)]
    for ssh, at in jumps:
        if ssh is None or ssh.jump in (None, "none") or ssh.jump in bastions:
            continue
        dotted = ".".join(map(str, at + ("jump",)))
        errors.append(loaded.error(f"{dotted}: no bastion is named {ssh.jump!r}{did_you_mean(ssh.jump, bastions)}; known bastions: {known}", *at, "jump"))
    for j, bastion in enumerate(model.bastions):
        chain, hop = [bastion.name], bastion
        while hop.ssh is not None and hop.ssh.jump in bastions:
            hop = model.bastions[bastions[hop.ssh.jump]]
            chain.append(hop.name)
            if hop.name in chain[:-1]:
                if hop.name == bastion.name:
                    errors.append(loaded.error(f"bastions.{j}.ssh.jump: bastion {bastion.name} reaches itself "
                                               f"({' -> '.join(chain)})", "bastions", j, "ssh", "jump"))
                break
    return errors


