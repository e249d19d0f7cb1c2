"""Network faults on a node's NIC: link down, blackhole, degrade, partition.

Each is a lasting fault: the node's watchdog (a lease) is armed with the exact
revert command before the fault is injected, so a controller that dies or loses
its connection still ends with a restored node. Reverts are idempotent
(reverting what is already gone is harmless) and verified afterwards.

Every value that reaches the node's command line is validated first: interface
names against :data:`~chaoskit.core.shell.IFNAME_RE`, addresses with
:mod:`ipaddress`, rates and percentages against strict patterns. The transport
then quotes each argv element (or passes argv without any shell at all).

Interfaces are named by role (``data``, ``mgmt``: the inventory maps them to
devices) or by device name. tc faults own the root qdisc handle
:data:`QDISC_HANDLE`; partitions own an nftables table ``inet chaoskit_<fault>``.
"""

from __future__ import annotations

import ipaddress
import re
import sys
import time
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from chaoskit.cluster.fanout import fan_out
from chaoskit.cluster.inventory import Node
from chaoskit.cluster.kernel import netem_available
from chaoskit.cluster.power import run_power_command
from chaoskit.cluster.selectors import (
    NodeTarget,
    TargetSpec,
    node_targets,
    select_nodes,
)
from chaoskit.cluster.transports.api import Transport
from chaoskit.cluster.transports.docker import network_argv, networks_of
from chaoskit.core.durations import Duration, PositiveDuration
from chaoskit.core.errors import InfraError, OutcomeUnknown, ScenarioError
from chaoskit.core.limits import MAX_RATE_BITS
from chaoskit.core.models import IfName
from chaoskit.core.shell import check_ifname, shell_quote
from chaoskit.faults.api import Action, Fault, FaultContext, FaultSpec, Injection, NodeView
from chaoskit.faults.node_tool import until_reverted

__all__ = [
    "LinkDownFault",
    "BlackholeFault",
    "DegradeFault",
    "PartitionFault",
    "QDISC_HANDLE",
]

QDISC_HANDLE = "c4a0:"
COMMAND_TIMEOUT_S = 10.0
VERIFY_S = 5.0
RECONNECT_MARGIN_S = 15.0
OWN_LINK_TIMEOUT_S = 1.0
RATE_RE = r"^[0-9]{1,15}(\.[0-9]{1,9})?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$"


"""Exit 0 when the node's kernel has sch_netem (loaded, built in, or loadable); run with the node's python."""


# -- specs ------------------------------------------------------------------------------


class _NicSpec(FaultSpec):
    interface: IfName = Field("data", description="Interface role from the inventory (data, mgmt) or a device name.")
    duration: PositiveDuration = Field(..., description="How long the fault lasts; the node reverts it by itself after that.")


class LinkDownSpec(_NicSpec):
    """Take an interface down (``ip link set DEV down``), then up again after ``duration``."""

    kind: Literal["network.link_down"]


class BlackholeSpec(_NicSpec):
    """Drop every packet leaving an interface (a tc ``blackhole`` root qdisc) for ``duration``."""

    kind: Literal["network.blackhole"]


class DegradeSpec(_NicSpec):
    """Slow a link down: ``rate`` with tc ``tbf``; ``delay``, ``jitter``, ``loss``, ``corrupt`` need ``netem``."""

    kind: Literal["network.degrade"]
    rate: str | None = Field(None, description="Bandwidth cap, e.g. 10mbit, 1gbit.")
    delay: Duration | None = Field(None, description="Added one-way latency (netem).")
    jitter: Duration | None = Field(None, description="Latency variation around delay (netem).")
    loss: float | None = Field(None, gt=0, le=100, description="Packet loss in percent (netem).")
    corrupt: float | None = Field(None, gt=0, le=100, description="Corrupted packets in percent (netem).")

    @field_validator("rate")
    @classmethod
    def _rate(cls, v: str | None) -> str | None:
        if v is None:
            return v
        shown = repr(v) if len(v) <= 40 else repr(v[:37] + "...")
        if not re.fullmatch(RATE_RE, v):
            raise ValueError(f"invalid rate {shown}: a number with a unit such as 10mbit, 500kbit, 1gbit")
        if not 0 < _rate_bits(v) <= MAX_RATE_BITS:
            raise ValueError(f"rate {shown} is out of range: more than 0 and at most {MAX_RATE_BITS / 1e12:g}tbit")
        return v

    @field_validator("delay", "jitter")
    @classmethod
    def _non_negative(cls, v: float | None) -> float | None:
        if v is not None and not 0 < v <= 60:
            raise ValueError("must be between 0 and 60 seconds")
        return v

    @model_validator(mode="after")
    def _something(self) -> "DegradeSpec":
        if all(x is None for x in (self.rate, self.delay, self.loss, self.corrupt)):
            raise ValueError("give at least one of rate, delay, loss, corrupt")
        if self.jitter is not None and self.delay is None:
            raise ValueError("jitter needs delay")
        return self

    @property
    def needs_netem(self) -> bool:
        return any(x is not None for x in (self.delay, self.jitter, self.loss, self.corrupt))


class PartitionSpec(FaultSpec):
    """Cut the target nodes off from their peers: nftables rules in a chaoskit-owned table
    drop traffic both ways between the two groups (rules on the target side only)."""

    kind: Literal["network.partition"]
    peers: TargetSpec | None = Field(
        None, description="The other side (nodes/labels); default: every other node of the inventory."
    )
    interface: IfName = Field("data", description="Which of the peers' addresses to cut (interface role), e.g. data.")
    duration: PositiveDuration = Field(..., description="How long the partition lasts.")
    method: Literal["nft", "disconnect"] = Field(
        "nft",
        description=(
            "nft: drop the peers' traffic with nftables rules on the target nodes. disconnect: docker nodes "
            "only: disconnect the container from its networks through the engine (it loses every peer at once, "
            "as when a switch port dies), then connect it back with its address and names (the engine names the "
            "NIC anew, e.g. eth1; chaoskit finds docker NICs by address)."
        ),
    )

    @field_validator("peers")
    @classmethod
    def _node_selectors(cls, v: TargetSpec | None) -> TargetSpec | None:
        if v is not None and any(x is not None for x in (v.ranks, v.pid, v.process, v.count, v.percent)):
            raise ValueError("peers selects nodes: use nodes and labels only")
        return v

    @model_validator(mode="after")
    def _disconnect_has_no_peers(self) -> "PartitionSpec":
        if self.method == "disconnect" and self.peers is not None:
            raise ValueError("method: disconnect cuts the node off from every peer on its networks; peers: needs method: nft")
        return self


# -- faults -----------------------------------------------------------------------------


class _NodeFault(Fault):
    """What every network fault shares: node targets, a lease first, idempotent verified reverts."""

    target_type = "node"
    lasting: ClassVar[bool] = True
    tools: ClassVar[tuple[str, ...]] = ("ip",)

    # What a subclass provides -------------------------------------------------------------

    def effect(self, ctx: FaultContext, target: NodeTarget, fault_id: str) -> tuple[list[str], list[str], str, dict[str, Any]]:
        """(inject argv, revert argv, label, detail) for one node."""
        raise NotImplementedError

    # The verbs ------------------------------------------------------------------------

    def needs(self) -> tuple[str, ...]:
        return self.tools

    def unfit(self, node: Node) -> str | None:
        if node.conn is not None and not node.conn.has_own_network:
            return (f"{self.kind} needs a node with a network stack of its own; node {node.name} shares this "
                    "machine's (a process-lab node)")
        return None

    def preflight(self, ctx: FaultContext, targets: list[NodeTarget]) -> None:
        """Raise before anything is armed: unreachable node, missing tool, unknown interface."""
        for t in targets:
            transport = _transport(ctx, t)
            for tool in self.tools:
                res = transport.run([tool, "-V"] if tool != "nft" else ["nft", "--version"], COMMAND_TIMEOUT_S)
                if res.returncode != 0:
                    raise InfraError(f"{tool} does not work on node {t.node}: {res.stderr.strip()}")
            for device in self.devices(t):
                res = transport.run(["ip", "link", "show", "dev", device], COMMAND_TIMEOUT_S)
                if res.returncode != 0:
                    raise InfraError(f"node {t.node} has no interface {device!r}: {res.stderr.strip()}")

    def devices(self, target: NodeTarget) -> list[str]:
        return [_device(target, self.spec.interface)]

    def plan(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[Action]:
        out = []
        for i, t in enumerate(node_targets(ctx.inventory, targets)):
            inject, revert, label, _ = self.effect(ctx, t, f"{self.fault_id}.{i}")
            d = self.spec.duration
            out.append(Action(t.node, f"arm lease: watchdog runs '{shell_quote(revert)}' after {d:g}s or a stale lease", label))
            out.append(Action(t.node, shell_quote(inject), label))
            out.append(Action(t.node, f"after {d:g}s: {shell_quote(revert)}", label))
        return out

    def inject(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[Injection]:
        """Every target node at once (a bounded fan-out, each node with its own deadlines), so a slow or silent
        node delays no other. When one fails, the others that took the fault are reverted too (their leases
        released, or left to their watchdogs where a node cannot be reached) and the first failure is raised."""
        done = fan_out({str(i): (lambda i=i, t=t: self._inject_one(ctx, i, t)) for i, t in enumerate(targets)})
        results = [done[str(i)] for i in range(len(targets))]
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is None:
            return results  # type: ignore[return-value]
        for inj in results:
            if isinstance(inj, Injection) and not inj.detail.get("connection_lost"):
                self._undo(ctx, ctx.transport(inj.node), inj.fault_id, inj.detail["revert"])
        raise failed

    def _inject_one(self, ctx: FaultContext, i: int, t: NodeTarget) -> Injection:
        fid = f"{self.fault_id}.{i}"
        transport = _transport(ctx, t)
        inject, revert, label, detail = self.effect(ctx, t, fid)
        ctx.arm(transport, fid, self.kind, revert, self.spec.duration, target=label)
        own_link = _cuts_own_connection(t, self.devices(t))
        t_sent = time.time()
        try:
            # No answer can come back over a link the command takes down: don't wait long for one.
            res = transport.run(inject, OWN_LINK_TIMEOUT_S if own_link else COMMAND_TIMEOUT_S)
        except OutcomeUnknown:
            if not own_link:
                self._undo(ctx, transport, fid, revert)
                raise
            # The fault took the very link this connection uses: it is in effect, and the
            # node's watchdog (armed above) brings the link back when its time is up.
            return Injection(fid, self.kind, t.node, [label], t_sent, {**detail, "revert": revert, "connection_lost": True})
        except InfraError:
            self._undo(ctx, transport, fid, revert)
            raise
        if res.returncode != 0:
            self._undo(ctx, transport, fid, revert)
            raise InfraError(f"{self.kind} on node {t.node} failed: {shell_quote(inject)}: {res.stderr.strip() or res.stdout.strip()}")
        ts = res.finished_at or time.time()
        return Injection(fid, self.kind, t.node, [label], ts, {**detail, "revert": revert})

    def revert(self, ctx: FaultContext, injection: Injection) -> None:
        """Run the revert; a non-zero exit means it was already reverted, which :meth:`verify` confirms.

        When the fault cut the controller's own connection, the node is unreachable until its
        watchdog restores the link: keep trying for the lease's TTL plus a margin.
        """
        transport = ctx.transport(injection.node)
        patience = 0.0
        if injection.detail.get("connection_lost"):
            patience = (ctx.leases.ttl if ctx.leases is not None else 15.0) + RECONNECT_MARGIN_S
        deadline = time.time() + patience
        while True:
            try:
                transport.run(injection.detail["revert"], COMMAND_TIMEOUT_S)
                return
            except InfraError:
                if time.time() >= deadline:
                    raise
                time.sleep(0.5)

    def verify(self, ctx: FaultContext, injection: Injection) -> str | None:
        transport = ctx.transport(injection.node)
        return until_reverted(lambda: self.check_reverted(transport, injection.detail["revert"]), VERIFY_S)

    def _undo(self, ctx: FaultContext, transport: Any, fid: str, revert: list[str]) -> None:
        """The inject failed after the lease was armed: revert now, or let the watchdog do it within the TTL."""
        leases = ctx.leases
        try:
            transport.run(revert, COMMAND_TIMEOUT_S)
        except InfraError:
            if leases is not None:
                leases.abandon(fid)  # unreachable: stop renewing, so its watchdog reverts within the TTL
            return
        if leases is not None:
            leases.release(fid)


class LinkDownFault(_NodeFault):
    kind = "network.link_down"
    covers = ("network.nic",)
    Spec = LinkDownSpec

    def effect(self, ctx, target, fault_id):
        dev = _device(target, self.spec.interface)
        return (["ip", "link", "set", "dev", dev, "down"], ["ip", "link", "set", "dev", dev, "up"],
                f"{target.node}:{dev}", {"device": dev})

    @classmethod
    def journaled_revert(cls, revert, node=None):
        if len(revert) != 6 or revert[:4] != ["ip", "link", "set", "dev"] or revert[5] != "up":
            raise ValueError("not a network.link_down revert chaoskit arms (ip link set dev DEV up)")
        return ["ip", "link", "set", "dev", check_ifname(revert[4]), "up"]

    @classmethod
    def check_reverted(cls, transport, revert, node=None):
        dev = check_ifname(revert[4])
        res = transport.run(["ip", "-o", "link", "show", "dev", dev], COMMAND_TIMEOUT_S)
        if res.returncode != 0:
            return f"interface {dev} not found: {res.stderr.strip()}"
        flags = res.stdout.split("<", 1)[-1].split(">", 1)[0].split(",")
        return None if "UP" in flags else f"interface {dev} is still down"

    @classmethod
    def leftovers(cls, view: NodeView) -> list[str]:
        """The inventory's interfaces of the node (every one but ``lo`` where it names none) that are down."""
        named = {spec.name for spec in view.node.interfaces.values()}
        out = []
        for line in _own_network_lines(view, ["ip", "-o", "link", "show"]):
            parts = line.split(":", 2)
            if len(parts) < 3:
                continue
            dev = parts[1].strip().split("@", 1)[0]
            flags = parts[2].split("<", 1)[-1].split(">", 1)[0].split(",")
            if (dev in named if named else dev != "lo") and "UP" not in flags:
                out.append(f"link {dev} is down")
        return out


class _QdiscFault(_NodeFault):
    tools = ("ip", "tc")

    def qdisc(self) -> list[str]:
        raise NotImplementedError

    def effect(self, ctx, target, fault_id):
        dev = _device(target, self.spec.interface)
        inject = ["tc", "qdisc", "add", "dev", dev, "root", "handle", QDISC_HANDLE, *self.qdisc()]
        revert = ["tc", "qdisc", "del", "dev", dev, "root", "handle", QDISC_HANDLE]
        return inject, revert, f"{target.node}:{dev}", {"device": dev}

    @classmethod
    def journaled_revert(cls, revert, node=None):
        if len(revert) != 8 or revert[:4] != ["tc", "qdisc", "del", "dev"] or revert[5:] != ["root", "handle", QDISC_HANDLE]:
            raise ValueError(f"not a {cls.kind} revert chaoskit arms (tc qdisc del dev DEV root handle {QDISC_HANDLE})")
        return ["tc", "qdisc", "del", "dev", check_ifname(revert[4]), "root", "handle", QDISC_HANDLE]

    @classmethod
    def check_reverted(cls, transport, revert, node=None):
        dev = check_ifname(revert[4])
        res = transport.run(["tc", "qdisc", "show", "dev", dev], COMMAND_TIMEOUT_S)
        if res.returncode != 0:
            return f"cannot read the qdiscs of {dev}: {res.stderr.strip()}"
        left = [line for line in res.stdout.splitlines() if f" {QDISC_HANDLE} " in f"{line} "]
        return f"chaoskit qdisc still on {dev}: {left[0].strip()}" if left else None

    @classmethod
    def leftovers(cls, view: NodeView) -> list[str]:
        """Every qdisc with chaoskit's handle (``network.blackhole``, ``network.degrade``), on any interface."""
        out = []
        for line in _own_network_lines(view, ["tc", "qdisc", "show"]):
            words = line.split()
            if QDISC_HANDLE in words and "dev" in words:
                dev = words[words.index("dev") + 1] if words.index("dev") + 1 < len(words) else "?"
                out.append(f"qdisc {QDISC_HANDLE} on {dev}: {line.strip()}")
        return out


class BlackholeFault(_QdiscFault):
    kind = "network.blackhole"
    covers = ("network.link",)
    Spec = BlackholeSpec

    def qdisc(self) -> list[str]:
        return ["blackhole"]


class DegradeFault(_QdiscFault):
    kind = "network.degrade"
    covers = ("network.degraded",)
    Spec = DegradeSpec

    def qdisc(self) -> list[str]:
        s = self.spec
        if not s.needs_netem:
            burst = max(16384, int(_rate_bits(s.rate) / 8 / 100))  # 10 ms worth of bytes, at least 16 KiB
            return ["tbf", "rate", s.rate, "burst", str(burst), "latency", "50ms"]
        args = ["netem"]
        if s.delay is not None:
            args += ["delay", _ms(s.delay)] + ([_ms(s.jitter)] if s.jitter is not None else [])
        if s.loss is not None:
            args += ["loss", f"{s.loss:g}%"]
        if s.corrupt is not None:
            args += ["corrupt", f"{s.corrupt:g}%"]
        if s.rate is not None:
            args += ["rate", s.rate]
        return args

    def needs(self):
        return (*super().needs(), "netem") if self.spec.needs_netem else super().needs()

    def preflight(self, ctx, targets):
        super().preflight(ctx, targets)
        if self.spec.needs_netem:
            for t in targets:
                if not netem_available(_transport(ctx, t), t.info.ssh.python if t.info.ssh else "python3"):
                    raise InfraError(
                        f"netem is not available on node {t.node}: its kernel has no sch_netem, "
                        "so delay, jitter, loss and corrupt cannot be injected",
                        hint="load it (modprobe sch_netem) or build the kernel with CONFIG_NET_SCH_NETEM; "
                        "rate alone works with tbf",
                    )

    def inject(self, ctx, targets):
        if self.spec.needs_netem:
            self.preflight(ctx, targets)
        return super().inject(ctx, targets)


class PartitionFault(_NodeFault):
    kind = "network.partition"
    covers = ("network.partition",)
    Spec = PartitionSpec
    tools = ("nft",)

    # method: disconnect -- the engine takes the container off its networks; the commands and the
    # lease's watchdog run on the controller, as for power.

    def _disconnect(self) -> bool:
        return self.spec.method == "disconnect"

    def needs(self):
        return () if self._disconnect() else super().needs()

    def unfit(self, node: Node) -> str | None:
        if self._disconnect() and node.conn is not None and node.conn.container is None:
            return f"{self.kind} with method: disconnect needs a docker node; {node.name} is not a container"
        return super().unfit(node)

    def _container(self, ctx: FaultContext, target: Any) -> str:
        transport = ctx.transport(target.node)
        container = transport.container
        if container is None:
            raise InfraError(f"{self.kind} with method: disconnect needs a docker node; {target.node} is reached by "
                             f"{type(transport).__name__}", hint="use method: nft (the default) on other nodes")
        return container

    def _disconnect_commands(self, ctx: FaultContext, target: Any) -> tuple[list[str], list[str], str, dict[str, Any]]:
        container = self._container(ctx, target)
        nets = networks_of(container)
        if not nets:
            raise InfraError(f"container {container} of node {target.node} is on no network")
        back = [f"{name}={n['ip']}={','.join(n['aliases'])}" for name, n in sorted(nets.items())]
        return (network_argv("disconnect", container, sorted(nets)), network_argv("connect", container, back),
                f"{target.node}|{','.join(sorted(nets))}", {"container": container, "networks": sorted(nets)})

    def preflight(self, ctx, targets):
        if not self._disconnect():
            return super().preflight(ctx, targets)
        for t in targets:
            self._disconnect_commands(ctx, t)

    def plan(self, ctx, targets):
        if not self._disconnect():
            return super().plan(ctx, targets)
        out = []
        d = self.spec.duration
        for t in node_targets(ctx.inventory, targets):
            container = self._container(ctx, t)
            out.append(Action(t.node, f"arm lease on the controller: watchdog reconnects {container} after {d:g}s or a stale lease", t.node))
            out.append(Action(t.node, f"on the controller: disconnect {container} from its networks (docker engine)", t.node))
            out.append(Action(t.node, f"after {d:g}s, on the controller: connect it back, same address and aliases", t.node))
        return out

    def inject(self, ctx, targets):
        if not self._disconnect():
            return super().inject(ctx, targets)
        out = []
        for i, t in enumerate(targets):
            fid = f"{self.fault_id}.{i}"
            inject, revert, label, detail = self._disconnect_commands(ctx, t)
            ctx.arm(ctx.controller(t.node), fid, self.kind, revert, self.spec.duration, target=label, on="controller")
            res = run_power_command(inject, COMMAND_TIMEOUT_S, t.node)
            ts = time.time()
            if res.returncode != 0:
                run_power_command(revert, COMMAND_TIMEOUT_S, t.node)
                ctx.leases.release(fid)
                raise InfraError(f"{self.kind}: disconnecting node {t.node} failed: {res.stderr.strip() or res.stdout.strip()}")
            out.append(Injection(fid, self.kind, t.node, [label], ts, {**detail, "revert": revert, "on": "controller"}))
        return out

    def revert(self, ctx, injection):
        if injection.detail.get("on") != "controller":
            return super().revert(ctx, injection)
        res = run_power_command(injection.detail["revert"], COMMAND_TIMEOUT_S, injection.node)
        if res.returncode != 0:
            raise InfraError(f"reconnecting node {injection.node} failed: {res.stderr.strip() or res.stdout.strip()}")

    def verify(self, ctx, injection):
        if injection.detail.get("on") != "controller":
            return super().verify(ctx, injection)
        return until_reverted(lambda: self.check_reverted(ctx.controller(injection.node), injection.detail["revert"]), VERIFY_S)

    def devices(self, target):
        return []

    def peers(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[Node]:
        chosen = {t.node for t in targets}
        spec = self.spec.peers
        nodes = select_nodes(ctx.inventory, spec) if spec is not None else ctx.inventory.nodes
        peers = [n for n in nodes if n.name not in chosen]
        if not peers:
            raise ScenarioError(f"{self.kind}: no peer node is left on the other side of the partition")
        return peers

    def peer_addresses(self, ctx: FaultContext, targets: list[NodeTarget]) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        out = []
        for node in self.peers(ctx, targets):
            iface = node.interfaces.get(self.spec.interface)
            address = iface.address if iface is not None and iface.address else node.address
            try:
                out.append(ipaddress.ip_address(address))
            except ValueError:
                raise InfraError(
                    f"{self.kind} needs the IP address of node {node.name} on {self.spec.interface!r}; "
                    f"{address!r} is a host name",
                    hint=f"add interfaces: {{{self.spec.interface}: {{name: ..., address: ...}}}} to node {node.name}",
                ) from None
        return out

    def effect(self, ctx, target, fault_id):
        table = _table(fault_id)
        addresses = self.peer_addresses(ctx, [target])
        rules = [f"add table inet {table}",
                 f"add chain inet {table} input {{ type filter hook input priority -300 ; policy accept ; }}",
                 f"add chain inet {table} output {{ type filter hook output priority -300 ; policy accept ; }}"]
        for family in ("ip", "ip6"):
            group = [str(a) for a in addresses if (a.version == 4) == (family == "ip")]
            if group:
                members = ", ".join(group)
                rules.append(f"add rule inet {table} input {family} saddr {{ {members} }} drop")
                rules.append(f"add rule inet {table} output {family} daddr {{ {members} }} drop")
        label = f"{target.node}|{','.join(n.name for n in self.peers(ctx, [target]))}"
        return ["nft", " ; ".join(rules)], ["nft", "delete", "table", "inet", table], label, {"table": table, "peers": [str(a) for a in addresses]}

    @classmethod
    def journaled_revert(cls, revert, node=None):
        """``nft delete table inet chaoskit_<fault id>``, or (``method: disconnect``) the engine's reconnect of
        one container to its networks with their addresses and aliases."""
        if len(revert) == 5 and revert[:4] == ["nft", "delete", "table", "inet"] and _TABLE.fullmatch(revert[4]):
            return ["nft", "delete", "table", "inet", revert[4]]
        if (len(revert) >= 7 and revert[0] == sys.executable and revert[1:5] == ["-m", "chaoskit.cluster.transports.docker", "network", "connect"]
                and _NAME.fullmatch(revert[5]) and all(_reconnect_ok(a) for a in revert[6:])):
            return network_argv("connect", revert[5], revert[6:])
        raise ValueError("not a network.partition revert chaoskit arms (its own nft table, or the engine's reconnect)")

    @classmethod
    def check_reverted(cls, transport, revert, node=None):
        if len(revert) > 4 and revert[2] == "chaoskit.cluster.transports.docker":  # method: disconnect, on the controller
            status = [*revert[:4], "status", *revert[5:]]
            res = transport.run(status, COMMAND_TIMEOUT_S)
            return None if res.returncode == 0 else (res.stderr.strip() or f"{revert[5]} is still disconnected")
        table = revert[4]
        if not re.match(r"^chaoskit_[A-Za-z0-9_]+$", table):
            raise ValueError(f"not a chaoskit table: {table!r}")
        res = transport.run(["nft", "list", "tables"], COMMAND_TIMEOUT_S)
        if res.returncode != 0:
            return f"cannot list nft tables: {res.stderr.strip()}"
        return f"nft table inet {table} is still there" if f"table inet {table}" in res.stdout.splitlines() else None

    @classmethod
    def leftovers(cls, view: NodeView) -> list[str]:
        """Every nft table named ``chaoskit_*`` (a partition's, with its chains and rules)."""
        out = []
        for line in _own_network_lines(view, ["nft", "list", "tables"]):
            words = line.split()
            if len(words) == 3 and words[0] == "table" and _TABLE.fullmatch(words[2]):
                out.append(f"nft table {words[1]} {words[2]}")
        return out


# -- helpers ----------------------------------------------------------------------------


def _transport(ctx: FaultContext, target: NodeTarget) -> Transport:
    transport = ctx.transport(target.node)
    if transport is None:
        raise InfraError(f"node {target.node} has no transport")
    if not transport.has_own_network:
        raise InfraError(
            f"network faults need a node with a network stack of its own; node {target.node} is a process-lab node",
            hint="use the netns lab (chaoskit lab up --kind netns) or an SSH inventory",
        )
    return transport


def _own_network_lines(view: NodeView, argv: list[str]) -> list[str]:
    """The lines ``argv`` prints on the audited node; none on a node without a network stack of its own (a
    process-lab node shares this machine's, and no network fault acts there)."""
    if not view.transport.has_own_network:
        return []
    return (view.run(argv) or "").splitlines()


def _cuts_own_connection(target: NodeTarget, devices: list[str]) -> bool:
    """Whether one of ``devices`` carries the address the controller reaches the node at."""
    address = target.info.address
    return any(spec.name in devices and spec.address == address for spec in target.info.interfaces.values())


def _device(target: NodeTarget, interface: str) -> str:
    return check_ifname(target.info.interface(interface).name)


def _table(fault_id: str) -> str:
    return "chaoskit_" + re.sub(r"[^A-Za-z0-9_]", "_", fault_id)


_TABLE = re.compile(r"chaoskit_[A-Za-z0-9_]{1,200}")
"""A table :func:`_table` names."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""A container, network or alias name as the docker engine allows them."""


def _reconnect_ok(item: str) -> bool:
    """``NAME=IP=ALIAS,ALIAS`` as :meth:`PartitionFault._disconnect_commands` writes it for a reconnect."""
    parts = item.split("=")
    if len(parts) != 3 or not _NAME.fullmatch(parts[0]):
        return False
    try:
        if parts[1]:  # a network that gave the container no address reconnects without one
            ipaddress.ip_address(parts[1])
    except ValueError:
        return False
    return all(_NAME.fullmatch(a) for a in parts[2].split(",") if a)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:g}ms"


def _rate_bits(rate: str) -> float:
    m = re.fullmatch(r"([0-9.]+)([a-z]+)", rate)
    assert m is not None
    value, unit = float(m.group(1)), m.group(2)
    scale = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
             "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}[unit]
    return value * scale
