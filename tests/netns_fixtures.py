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
import subprocess

import pytest

from tests.conftest import wait_until  # noqa: F401 - tests use fx().wait_until

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


@pytest.fixture(scope="session")
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
