"""Fixtures that build a real network-namespace lab (root, ip, tc, nft, sshd).

Load them in a test module with::

    pytest_plugins = ["tests.netns_fixtures"]

(a plugin module, not ``import *``, so the session-scoped lab is built once for
every module that uses it). Outside CI a missing tool or missing root skips the
test with the reason; with ``CI`` set it fails, so CI never passes by skipping.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until, lab_fixture  # noqa: F401 - tests use fx().wait_until

IN_CI = bool(os.environ.get("CI"))


def require(ok: bool, reason: str) -> None:
    """Skip (outside CI) or fail (in CI) when ``ok`` is false."""
    if ok:
        return
    if IN_CI:
        pytest.fail(f"CI is set but {reason}", pytrace=False)
    pytest.skip(reason)


def netns_problem() -> str | None:
    """Why the netns lab cannot run here, or ``None``."""
    if os.geteuid() != 0:
        return "the netns lab needs root"
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    for tool in ("ip", "tc", "nft", "sshd", "ssh-keygen"):
        if shutil.which(tool, path=path) is None:
            return f"{tool} is not installed (apt-get install iproute2 nftables openssh-server)"
    try:
        import paramiko  # noqa: F401
    except ImportError:
        return "paramiko is not installed (pip install 'chaoskit[ssh]')"
    probe = f"ckprobe{os.getpid() % 10000}"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if res.returncode != 0:
        return f"cannot create a network namespace: {res.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def require_netns() -> None:
    problem = netns_problem()
    require(problem is None, problem or "")


def host_snapshot() -> dict[str, str]:
    """What a lab could leave behind on this machine, as text."""
    def out(*argv: str) -> str:
        return subprocess.run(list(argv), capture_output=True, text=True).stdout

    return {
        "netns": out("ip", "netns", "list"),
        "links": out("ip", "-o", "link", "show"),
        "qdiscs": out("tc", "qdisc", "show"),
        "nft": out("nft", "list", "tables"),
    }


def ns_run(lab, node: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run a command inside a lab node's namespace directly (not over SSH): the test's own eyes."""
    return subprocess.run(lab.exec_argv(node, list(argv)), capture_output=True, text=True, timeout=10)


def node_clean(lab, node: str) -> str | None:
    """``None`` when the node carries no chaoskit fault: links up, no chaoskit qdisc, no nft table."""
    for dev in ("eth0", "eth1"):
        res = ns_run(lab, node, "ip", "-o", "link", "show", "dev", dev)
        flags = res.stdout.split("<", 1)[-1].split(">", 1)[0].split(",")
        if "UP" not in flags:
            return f"{node}:{dev} is down"
        qd = ns_run(lab, node, "tc", "qdisc", "show", "dev", dev).stdout
        if "c4a0:" in qd:
            return f"{node}:{dev} still has {qd.strip()}"
    tables = ns_run(lab, node, "nft", "list", "tables").stdout
    if "chaoskit" in tables:
        return f"{node} still has nft {tables.strip()}"
    return None


@lab_fixture(scope="session")
def netns_lab(tmp_path_factory):
    """A 2-node netns lab for the whole session, torn down at the end."""
    require_netns()
    from chaoskit.lab.netns import NetnsLab

    lab = NetnsLab.create(2, directory=tmp_path_factory.mktemp("netns") / "lab")
    try:
        yield lab
    finally:
        lab.down()


@pytest.fixture(scope="session")
def lab_inventory(netns_lab):
    """The lab's inventory, every node connected over SSH with its agent running."""
    from tests.conftest import connected

    with connected(netns_lab.inventory()) as inventory:
        yield inventory


@pytest.fixture
def fault_ctx(lab_inventory, tmp_path):
    """A RunContext over the lab (journal + leases with a short TTL), closed after the test."""
    from tests.conftest import fault_context

    with fault_context(lab_inventory, tmp_path) as ctx:
        yield ctx


@pytest.fixture
def clean_lab(netns_lab):
    """Assert each test leaves every lab node without faults."""
    yield netns_lab
    for node in netns_lab.node_names():
        assert wait_until(lambda: node_clean(netns_lab, node) is None, 5), node_clean(netns_lab, node)


SITE_TAG = f"{os.getpid() % 100000:05d}"
"""Per test session: two sessions on one machine (CI jobs, engineers) must not share users or sudoers."""
SITE_USER = f"ckdrill{SITE_TAG}"
SITE_NOSUDO_USER = f"cknosudo{SITE_TAG}"
SITE_SUDOERS = Path(f"/etc/sudoers.d/chaoskit-test-{SITE_TAG}")


@dataclass
class Site:
    """A netns lab used as somebody else's cluster: nodes n0, n1 reached only through the bastion n2,
    as a non-root user with password-less sudo (``user``), or one whose sudo wants a password."""

    lab: Any
    directory: Path
    inventory_path: Path
    user: str
    key_path: Path
    nosudo_user: str
    nosudo_key_path: Path
    known_hosts: Path
    nodes: list[str]
    bastion: str = "n2"

    def address(self, node: str) -> str:
        return self.lab.mgmt_address(node)

    def inventory(self, **changes: Any) -> dict[str, Any]:
        """The site's inventory document (a copy), top-level ``ssh:`` updated with ``changes``."""
        import yaml

        doc = yaml.safe_load(self.inventory_path.read_text())
        doc["ssh"].update(changes)
        return doc

    def write(self, doc: dict[str, Any], name: str) -> Path:
        """``doc`` as an inventory file beside the site's key and known_hosts."""
        import yaml

        path = self.directory / name
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {(res.stderr or res.stdout).strip()}")
    return res


def _drop_site_user(user: str) -> None:
    if _sh("id", "-u", user, check=False).returncode == 0:
        _sh("userdel", "--remove", "--force", user, check=False)


@lab_fixture(scope="session")
def site(tmp_path_factory):
    """Somebody else's cluster, built for real: a lab of 2 nodes + 1 spare where the spare (n2) is
    the bastion; the users ``ckdrill`` (password-less sudo) and ``ckdrill-nosudo`` (sudo wants a
    password), each with its own key; nftables in this machine's namespace refusing SSH from the
    controller to n0 and n1, so only the bastion is reachable; and an inventory (nodes n0, n1 as
    ckdrill, become: sudo, jump: bastion). Everything is removed at the end."""
    require_netns()
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    for tool in ("sudo", "useradd", "visudo"):
        require(shutil.which(tool, path=path) is not None, f"{tool} is not installed (apt-get install sudo passwd)")
    from chaoskit.lab.netns import NetnsLab

    directory = tmp_path_factory.mktemp("site")
    lab = NetnsLab.create(2, spare=1, directory=directory / "lab")
    table = f"cksite_{lab.lab_id}"  # not "chaoskit...": other tests look for tables chaoskit left behind
    try:
        keys = {}
        for user in (SITE_USER, SITE_NOSUDO_USER):
            _drop_site_user(user)  # a crashed session's leftover
            _sh("useradd", "--create-home", "--shell", "/bin/sh", user)
            _sh("usermod", "-p", "*", user)  # no password, yet not locked: sshd without PAM refuses locked accounts
            key = directory / f"{user}_ed25519"
            _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", user, "-f", str(key))
            # sshd reads authorized keys as the user, who cannot enter the lab's root-only folder: the file goes home
            home = Path(f"/home/{user}")
            (home / ".ssh").mkdir(mode=0o700, exist_ok=True)
            (home / ".ssh" / "authorized_keys").write_text(Path(f"{key}.pub").read_text())
            _sh("chown", "-R", f"{user}:{user}", str(home / ".ssh"))
            keys[user] = key
        sudoers = directory / "sudoers"
        sudoers.write_text(f"{SITE_USER} ALL=(ALL) NOPASSWD: ALL\n{SITE_NOSUDO_USER} ALL=(ALL) ALL\n")
        _sh("visudo", "-c", "-q", "-f", str(sudoers))
        shutil.copy(sudoers, SITE_SUDOERS)
        SITE_SUDOERS.chmod(0o440)
        for node in lab.node_names():  # these users' keys live in their homes; sshd re-reads its config on HUP
            config = lab.node_dir(node) / "sshd_config"
            config.write_text(config.read_text() + f"Match User {SITE_USER},{SITE_NOSUDO_USER}\n"
                              "    AuthorizedKeysFile .ssh/authorized_keys\n")
            os.kill(int((lab.node_dir(node) / "sshd.pid").read_text().split()[0]), signal.SIGHUP)
        time.sleep(0.2)
        lab._wait_ssh(lab.node_names())
        targets = ", ".join(lab.mgmt_address(n) for n in ("n0", "n1"))
        rules = (f"table inet {table} {{\n  chain output {{\n    type filter hook output priority 0; policy accept;\n"
                 f"    ip daddr {{ {targets} }} tcp dport 22 reject with tcp reset\n  }}\n}}\n")
        subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True, capture_output=True)
        known_hosts = directory / "known_hosts"
        shutil.copy(lab.known_hosts_path, known_hosts)
        doc = {
            "name": f"site-{lab.lab_id}",
            "ssh": {"user": SITE_USER, "become": "sudo", "key": keys[SITE_USER].name, "known_hosts": known_hosts.name,
                    "jump": "bastion", "connect_timeout": "5s"},
            "bastions": [{"name": "bastion", "address": lab.mgmt_address("n2")}],
            "nodes": [
                {"name": node, "address": lab.mgmt_address(node), "processes": "netns",
                 "workdir": str(lab.node_dir(node) / "work"),
                 "interfaces": {"data": {"name": "eth0", "address": lab.data_address(node)},
                                "mgmt": {"name": "eth1", "address": lab.mgmt_address(node)}}}
                for node in ("n0", "n1")
            ],
        }
        import yaml

        inventory = directory / "inventory.yaml"
        inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
        yield Site(lab, directory, inventory, SITE_USER, keys[SITE_USER], SITE_NOSUDO_USER, keys[SITE_NOSUDO_USER],
                   known_hosts, ["n0", "n1"])
    finally:
        _sh("nft", "delete", "table", "inet", table, check=False)
        SITE_SUDOERS.unlink(missing_ok=True)
        lab.down()
        for user in (SITE_USER, SITE_NOSUDO_USER):
            _drop_site_user(user)
