"""The network-namespace lab: N nodes on this machine that chaoskit reaches over SSH.

Needs root. Each node is a network namespace with two interfaces, ``eth0`` on a
*data* bridge and ``eth1`` on a *mgmt* bridge, and its own OpenSSH server (its
own host key) listening in that namespace. The controller (this machine's root
namespace) has an address on the mgmt bridge only, so a NIC fault on ``data``
leaves SSH up, exactly like a cluster with a separate management network.

``up`` writes, under the lab's directory, a user key, a ``known_hosts`` file and
an ``inventory.yaml`` that chaoskit loads like any real cluster's. ``down``
leaves no namespace, link, bridge, qdisc, nft table or process behind.

Names: lab id ``ck<4 hex>``; namespaces ``<id>-n0``..; bridges ``<id>d``/``<id>m``;
host-side veths ``<id>d<i>``/``<id>m<i>``. Addresses: 10.77.<2k>.0/24 (data) and
10.77.<2k+1>.0/24 (mgmt, the controller is .254), with slot ``k`` picked so that
no route on this machine overlaps. Traffic never leaves these bridges.

Power: ``python -m chaoskit.lab.netns power off|on|status --dir DIR NODE`` is the
inventory's power command. *off* downs the node's links and kills every process
in its namespace; *on* "boots" it: network state reset (chaoskit qdiscs and nft
rules gone, links up) and sshd restarted; *status* exits 0 when the node is on.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaoskit.cluster.inventory_file import load_inventory
from chaoskit.cluster.xid import lab_pci
from chaoskit.core import procs
from chaoskit.core.errors import InfraError
from chaoskit.core.state import state_dir
from chaoskit.lab.guard import guard, guard_table, unguard
from chaoskit.lab import labdir
from chaoskit.lab.labdir import run_tool
from chaoskit.lab.admin import lab_main
from chaoskit.faults.network import QDISC_HANDLE

__all__ = ["NetnsLab", "netns_lab_dir", "require_netns_tools"]

SUBNET = "10.77"
SSH_PORT = 22
PRIVSEP_DIR = Path("/run/sshd")
PRIVSEP_MARK = ".made-by-chaoskit-netns-lab"
TOOLS = ("ip", "tc", "nft", "sshd", "ssh-keygen")
_SBIN = "/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin"


def netns_lab_dir() -> Path:
    return state_dir() / "lab" / "netns"


def require_netns_tools() -> dict[str, str]:
    """Paths of the tools the lab needs; :class:`InfraError` naming what is missing (or not root)."""
    if os.geteuid() != 0:
        raise InfraError("the netns lab needs root (network namespaces, bridges, sshd)", hint="run it with sudo")
    found = {name: shutil.which(name, path=os.environ.get("PATH", "") + ":" + _SBIN) for name in TOOLS}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise InfraError(
            f"the netns lab needs {', '.join(missing)}",
            hint="apt-get install -y iproute2 nftables openssh-server openssh-client",
        )
    return {k: v for k, v in found.items() if v}


@dataclass
class NetnsLab:
    lab_id: str
    directory: Path
    nodes: int
    spare: int = 0
    slot: int = 0
    sshd: str = "/usr/sbin/sshd"
    created: float = field(default_factory=time.time)

    # -- lifecycle ------------------------------------------------------------------------

    @classmethod
    def create(cls, nodes: int, spare: int = 0, directory: str | os.PathLike[str] | None = None) -> "NetnsLab":
        """Build the lab and return once every node's sshd answers. On failure nothing is left."""
        if nodes < 1 or spare < 0 or nodes + spare > 200:
            raise InfraError(f"a netns lab has 1..200 nodes (asked for {nodes} + {spare} spare)")
        tools = require_netns_tools()
        directory = Path(directory or netns_lab_dir()).resolve()
        labdir.claim(directory, "netns lab", 0o700)
        with _host_lock():  # two labs built at once must not pick the same id or subnet
            lab = cls(_new_lab_id(), directory, nodes, spare, _free_slot(), tools["sshd"])
            labdir.build_whole(lab._save, lab._build, lab.down)
        return lab

    @classmethod
    def load(cls, directory: str | os.PathLike[str] | None = None) -> "NetnsLab | None":
        data = labdir.load(Path(directory or netns_lab_dir()))
        return None if data is None else cls(**data)

    def down(self) -> None:
        """Kill every process of the lab, delete its namespaces and bridges, remove its directory."""
        for node in self.node_names():
            self._kill_node(node)
        self._kill_controller_side()
        for ns in self._namespaces():
            run_tool(["ip", "netns", "del", ns], check=False)
        for link in self._host_links():
            run_tool(["ip", "link", "del", link], check=False)
        self._forwarding("-D")
        self._guard(False)
        _remove_privsep_dir()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _forwarding(self, action: str) -> None:
        """Insert (``-I``) or delete (``-D``) an iptables rule that lets frames cross the lab's bridges.

        With br_netfilter loaded, bridged frames traverse iptables' FORWARD chain, and dockerd
        (which loads it) sets that chain's policy to DROP: without this rule the lab's nodes
        could not reach each other on a machine that runs docker. The rule matches only frames
        that enter and leave one of this lab's bridges, and ``down`` deletes it."""
        try:
            enabled = Path("/proc/sys/net/bridge/bridge-nf-call-iptables").read_text().strip() == "1"
        except OSError:
            enabled = False
        if (action == "-I" and not enabled) or shutil.which("iptables") is None:
            return
        for bridge in (self.data_bridge, self.mgmt_bridge):
            rule = ["FORWARD", "-i", bridge, "-o", bridge, "-m", "comment", "--comment", f"chaoskit lab {self.lab_id}", "-j", "ACCEPT"]
            if action == "-I":
                run_tool(["iptables", "-I", *rule])
            else:
                while run_tool(["iptables", "-D", *rule], check=False).returncode == 0:
                    pass

    @property
    def guard_table(self) -> str:
        return guard_table(self.lab_id)

    def _guard(self, on: bool, allow: list[tuple[str, int]] = ()) -> None:
        """Keep this machine's other users out of the lab's two /24s (on), but for the services in ``allow``
        (the Slurm lab's slurmctld), or stop (off): :mod:`chaoskit.lab.guard`."""
        if on:
            guard(self.guard_table, [f"{SUBNET}.{2 * self.slot}.0/24", f"{SUBNET}.{2 * self.slot + 1}.0/24"], allow)
        else:
            unguard(self.guard_table)

    def open_to_all(self, address: str, port: int) -> None:
        """Let every user of this machine reach ``address:port`` on the lab's networks (a service with a login
        of its own: the Slurm lab's slurmctld, whose clients authenticate with munge)."""
        self._guard(True, [(address, port)])

    # -- names and paths ------------------------------------------------------------------

    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(self.nodes + self.spare)]

    def index(self, node: str) -> int:
        names = self.node_names()
        if node not in names:
            raise InfraError(f"node {node!r} is not in netns lab {self.lab_id} ({', '.join(names)})")
        return names.index(node)

    def netns(self, node: str) -> str:
        return f"{self.lab_id}-{node}"

    @property
    def data_bridge(self) -> str:
        return f"{self.lab_id}d"

    @property
    def mgmt_bridge(self) -> str:
        return f"{self.lab_id}m"

    def data_address(self, node: str) -> str:
        return f"{SUBNET}.{2 * self.slot}.{self.index(node) + 1}"

    def mgmt_address(self, node: str) -> str:
        return f"{SUBNET}.{2 * self.slot + 1}.{self.index(node) + 1}"

    @property
    def controller_address(self) -> str:
        return f"{SUBNET}.{2 * self.slot + 1}.254"

    @property
    def key_path(self) -> Path:
        return self.directory / "id_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return self.directory / "known_hosts"

    @property
    def inventory_path(self) -> Path:
        return self.directory / "inventory.yaml"

    def node_dir(self, node: str) -> Path:
        return self.directory / "nodes" / node

    def exec_argv(self, node: str, argv: list[str]) -> list[str]:
        """``argv`` run inside the node's namespace, from the controller (e.g. a torchrun agent)."""
        return ["ip", "netns", "exec", self.netns(node), *argv]

    def power_argv(self, node: str, action: str) -> list[str]:
        return [sys.executable, "-m", "chaoskit.lab.netns", "power", action, "--dir", str(self.directory), node]

    def pids(self, node: str) -> list[int]:
        """Every process in the node's namespace."""
        res = run_tool(["ip", "netns", "pids", self.netns(node)], check=False)
        return [int(p) for p in res.stdout.split() if p.isdigit()]

    # -- inventory ------------------------------------------------------------------------

    def inventory_document(self) -> dict[str, Any]:
        nodes = []
        for i, node in enumerate(self.node_names()):
            nodes.append({
                "name": node,
                "address": self.mgmt_address(node),
                "labels": {"rack": f"r{i // 2}", "role": "worker" if i < self.nodes else "spare", "lab": "netns"},
                "interfaces": {
                    "data": {"name": "eth0", "address": self.data_address(node)},
                    "mgmt": {"name": "eth1", "address": self.mgmt_address(node)},
                },
                "gpus": 0,
                "gpu_pci": [lab_pci(self.lab_id, i)],  # emulated: gpu.xid writes its lines for this id, the kmsg probe reads them
                "processes": "netns",
                "workdir": str(self.node_dir(node) / "work"),
                "power": {a: self.power_argv(node, a) for a in ("off", "on", "status")},
            })
        return {
            "name": self.lab_id,
            # the nodes share this machine's file system: the agent and every helper run with the controller's
            # Python and what it has (mfusepy for storage.slow/storage.error: the system python3 has no FUSE binding)
            "ssh": {"user": "root", "port": SSH_PORT, "key": self.key_path.name, "known_hosts": self.known_hosts_path.name,
                    "python": sys.executable},
            "nodes": nodes,
        }

    def inventory(self, **kwargs: Any):
        """The lab's inventory with SSH transports (lazy: each connects on first use)."""
        return load_inventory(self.inventory_path, **kwargs)

    # -- power ----------------------------------------------------------------------------

    def power(self, node: str, action: str) -> bool:
        """``off``/``on``/``status``; return whether the node is on afterwards."""
        self.index(node)
        ns = self.netns(node)
        if action == "off":
            for dev in ("eth0", "eth1"):
                run_tool(["ip", "-n", ns, "link", "set", "dev", dev, "down"], check=False)
            self._kill_node(node)
            (self.node_dir(node) / "power").write_text("off\n")
            return False
        if action == "on":
            run_tool(["ip", "netns", "exec", ns, "nft", "flush", "ruleset"], check=False)
            for dev in ("eth0", "eth1"):
                run_tool(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root", "handle", QDISC_HANDLE], check=False)
            for dev in ("lo", "eth0", "eth1"):
                run_tool(["ip", "-n", ns, "link", "set", "dev", dev, "up"])
            if not self._sshd_alive(node):
                self._start_sshd(node)
                self._wait_ssh([node])
            (self.node_dir(node) / "power").write_text("on\n")
            return True
        if action == "status":
            res = run_tool(["ip", "-n", ns, "-o", "link", "show", "dev", "eth1"], check=False)
            return res.returncode == 0 and ",UP" in res.stdout and self._sshd_alive(node)
        raise ValueError(f"unknown power action {action!r}")

    def status(self) -> dict[str, Any]:
        return {
            "kind": "netns", "id": self.lab_id, "directory": str(self.directory),
            "inventory": str(self.inventory_path),
            "nodes": [
                {"name": n, "netns": self.netns(n), "address": self.mgmt_address(n),
                 "data_address": self.data_address(n), "on": self.power(n, "status"), "processes": len(self.pids(n))}
                for n in self.node_names()
            ],
        }

    # -- building -------------------------------------------------------------------------

    def _save(self, state: str) -> None:
        labdir.save(self.directory, asdict(self), state)

    def _build(self) -> None:
        d = self.directory
        run_tool(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"chaoskit-{self.lab_id}", "-f", str(self.key_path)])
        (d / "authorized_keys").write_text(Path(str(self.key_path) + ".pub").read_text())
        (d / "authorized_keys").chmod(0o600)
        for bridge in (self.data_bridge, self.mgmt_bridge):
            run_tool(["ip", "link", "add", "name", bridge, "type", "bridge"])
            run_tool(["ip", "link", "set", "dev", bridge, "up"])
        self._forwarding("-I")
        self._guard(True)
        run_tool(["ip", "addr", "add", f"{self.controller_address}/24", "dev", self.mgmt_bridge])
        if not PRIVSEP_DIR.exists():
            # sshd needs its privilege separation directory; mark it ours so `down` removes it.
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True)
            (PRIVSEP_DIR / PRIVSEP_MARK).touch()
        known = []
        for i, node in enumerate(self.node_names()):
            ns = self.netns(node)
            nd = self.node_dir(node)
            (nd / "work").mkdir(parents=True, exist_ok=True)
            run_tool(["ip", "netns", "add", ns])
            for role, dev, bridge, addr in (
                ("d", "eth0", self.data_bridge, self.data_address(node)),
                ("m", "eth1", self.mgmt_bridge, self.mgmt_address(node)),
            ):
                host_end = f"{self.lab_id}{role}{i}"
                run_tool(["ip", "link", "add", host_end, "type", "veth", "peer", "name", dev, "netns", ns])
                run_tool(["ip", "link", "set", "dev", host_end, "master", bridge, "up"])
                run_tool(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev])
            for dev in ("lo", "eth0", "eth1"):
                run_tool(["ip", "-n", ns, "link", "set", "dev", dev, "up"])
            key = nd / "ssh_host_ed25519_key"
            run_tool(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{self.lab_id}-{node}", "-f", str(key)])
            pub = Path(str(key) + ".pub").read_text().split()
            known.append(f"{self.mgmt_address(node)} {pub[0]} {pub[1]}\n")
            (nd / "sshd_config").write_text(self._sshd_config(node))
            (nd / "power").write_text("on\n")
            self._start_sshd(node)
        self.known_hosts_path.write_text("".join(known))
        self._wait_ssh(self.node_names())
        import yaml

        header = f"# chaoskit netns lab {self.lab_id}: generated by `chaoskit lab up --kind netns`; removed by `lab down`.\n"
        self.inventory_path.write_text(header + yaml.safe_dump(self.inventory_document(), sort_keys=False, width=200))

    def _sshd_config(self, node: str) -> str:
        nd = self.node_dir(node)
        return "\n".join([
            f"# sshd of chaoskit netns lab {self.lab_id}, node {node}",
            f"Port {SSH_PORT}",
            "ListenAddress 0.0.0.0",
            f"HostKey {nd / 'ssh_host_ed25519_key'}",
            f"PidFile {nd / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.directory / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            # The lab directory may sit under a world-writable /tmp; the key files are ours.
            "StrictModes no",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "MaxSessions 64",
            "MaxStartups 256:30:512",
            "LoginGraceTime 20",
            "LogLevel ERROR",
            # bash sources root's ~/.bashrc for every command sshd runs (Debian builds it with SSH_SOURCE_BASHRC)
            # unless it is a nested shell; SHLVL=1 makes it one. The lab's nodes are fresh nodes: this machine's
            # shell set-up (a pyenv init costs ~0.2 s of CPU per log-in, and a rehash lock left by a power-off
            # that killed a log-in mid-way stalls every later one for 60 s) is not theirs.
            "SetEnv SHLVL=1",
            "",
        ])

    def _start_sshd(self, node: str) -> None:
        nd = self.node_dir(node)
        (nd / "sshd.pid").unlink(missing_ok=True)
        run_tool(["ip", "netns", "exec", self.netns(node), self.sshd, "-f", str(nd / "sshd_config"), "-E", str(nd / "sshd.log")])

    def _sshd_alive(self, node: str) -> bool:
        try:
            pid = int((self.node_dir(node) / "sshd.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return False
        return procs.state(pid) not in (None, "Z")

    def _wait_ssh(self, nodes: list[str], timeout: float = 15.0) -> None:
        pending = list(nodes)
        end = time.time() + timeout
        while pending and time.time() < end:
            for node in list(pending):
                try:
                    with socket.create_connection((self.mgmt_address(node), SSH_PORT), timeout=0.5) as s:
                        s.settimeout(0.5)
                        if s.recv(4).startswith(b"SSH-"):
                            pending.remove(node)
                except OSError:
                    pass
            if pending:
                time.sleep(0.05)
        if pending:
            log = (self.node_dir(pending[0]) / "sshd.log")
            detail = log.read_text().strip()[-300:] if log.exists() else ""
            raise InfraError(f"sshd of node(s) {', '.join(pending)} did not answer within {timeout:g}s" + (f": {detail}" if detail else ""))

    # -- tearing down ---------------------------------------------------------------------

    def _kill_node(self, node: str, timeout: float = 5.0) -> None:
        end = time.time() + timeout
        while time.time() < end:
            pids = [p for p in self.pids(node) if p != os.getpid()]
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)

    def _kill_controller_side(self) -> None:
        """Processes on the controller started for this lab (power-fault watchdogs name its directory)."""
        labdir.kill_marked(str(self.directory), "chaoskit")

    def _namespaces(self) -> list[str]:
        res = run_tool(["ip", "netns", "list"], check=False)
        names = {line.split()[0] for line in res.stdout.splitlines() if line.strip()}
        return sorted(n for n in names if n.startswith(f"{self.lab_id}-"))

    def _host_links(self) -> list[str]:
        res = run_tool(["ip", "-o", "link", "show"], check=False)
        out = []
        for line in res.stdout.splitlines():
            parts = line.split(":", 2)
            if len(parts) < 2:
                continue
            name = parts[1].strip().split("@", 1)[0]
            if name.startswith(self.lab_id):
                out.append(name)
        # Bridges last: deleting a veth first keeps the bridge's port list short.
        return sorted(out, key=lambda n: n in (self.data_bridge, self.mgmt_bridge))


class _host_lock:
    """Held while a lab picks its id and subnet and builds, so two labs never pick the same.

    An abstract unix socket: nothing on disk, released when the holder exits or dies.
    """

    NAME = b"\0chaoskit-netns-lab-build"

    def __enter__(self) -> "_host_lock":
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        end = time.time() + 120
        while True:
            try:
                self.sock.bind(self.NAME)
                return self
            except OSError:
                if time.time() > end:
                    self.sock.close()
                    raise InfraError("another netns lab has been building for 2 minutes; giving up") from None
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def _new_lab_id() -> str:
    taken = run_tool(["ip", "-o", "link", "show"], check=False).stdout + run_tool(["ip", "netns", "list"], check=False).stdout
    for _ in range(100):
        lab_id = f"ck{secrets.token_hex(2)}"
        if lab_id not in taken:
            return lab_id
    raise InfraError("cannot find a free netns lab id")


def _free_slot() -> int:
    """A k such that 10.77.2k.0/24 and 10.77.2k+1.0/24 overlap no address or route here."""
    used = run_tool(["ip", "-4", "route", "show", "table", "all"], check=False).stdout + run_tool(["ip", "-4", "addr"], check=False).stdout
    for k in range(128):
        if f"{SUBNET}.{2 * k}." not in used and f"{SUBNET}.{2 * k + 1}." not in used:
            return k
    raise InfraError(f"no free /24 pair left in {SUBNET}.0.0/16 for a netns lab")


def _remove_privsep_dir() -> None:
    """Remove /run/sshd if a lab created it and no sshd (another lab's, the system's) still runs."""
    if not (PRIVSEP_DIR / PRIVSEP_MARK).exists():
        return
    if _sshd_running():
        return
    try:
        (PRIVSEP_DIR / PRIVSEP_MARK).unlink()
        PRIVSEP_DIR.rmdir()
    except OSError:
        pass


def _sshd_running() -> bool:
    """A live sshd anywhere on the machine (zombies waiting to be reaped do not count)."""
    return any(procs.name(pid) == "sshd" and procs.state(pid) not in (None, "Z") for pid in procs.pids())


def main(argv: list[str] | None = None) -> int:
    """``python -m chaoskit.lab.netns``: the lab's power commands, and up/down/status for debugging."""
    return lab_main(argv, "python -m chaoskit.lab.netns", "netns lab", lambda nodes, spare, directory: NetnsLab.create(nodes, spare, directory),
                    NetnsLab.load, lambda lab: lab.inventory_path)


if __name__ == "__main__":
    sys.exit(main())
