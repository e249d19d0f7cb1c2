"""An inventory's SSH fields, written by a second, unprivileged author (``useradd`` here), never make root run a
command, read a key or write a file outside the allowed roots (issue 31).

The author writes the inventory and its ssh config in their own home; chaoskit (root, as CI runs it) validates and
runs it. ``Match exec``, ``ProxyCommand``, ``LocalCommand`` and an ``Include`` outside the roots are refused at the
config's own line with exit 2, before anything connects (the node is a loopback port nobody answers, whose backlog
would hold a connection attempt); the command a config names never runs (its marker file is never made). Trust on
first use appends only to a regular file of root's inside the roots, never creating a folder or following a link.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import anyone_connected, need, need_root_tool, run_cli

AUTHOR = "ckauthor31s"


def _sh(*argv: str, check: bool = True, stdin: str | None = None):
    res = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {(res.stderr or res.stdout).strip()}")
    return res


@pytest.fixture(scope="module")
def home():
    need_root_tool("useradd")
    need(shutil.which("runuser") is not None, "runuser (util-linux)")
    need(os.geteuid() == 0, "root (chaoskit runs as root in CI)")
    _sh("userdel", "--remove", "--force", AUTHOR, check=False)
    _sh("useradd", "--create-home", "--shell", "/bin/sh", AUTHOR)
    try:
        yield Path(pwd.getpwnam(AUTHOR).pw_dir)
    finally:
        _sh("userdel", "--remove", "--force", AUTHOR, check=False)


@pytest.fixture()
def drill(home, tmp_path):
    """A fresh folder of the author's, and a marker path a config's command would create."""
    folder = home / f"drill-{tmp_path.name}"
    _sh("runuser", "-u", AUTHOR, "--", "mkdir", str(folder))
    marker = home / f"ran-{tmp_path.name}"
    yield folder, marker
    _sh("rm", "-rf", str(folder), str(marker), check=False)





def _write(path: Path, text: str) -> Path:
    """``text`` written by the author themself."""
    _sh("runuser", "-u", AUTHOR, "--", "tee", str(path), stdin=text)
    return path


def _inventory(folder: Path, port: int, ssh_extra: str = "", policy: str = "") -> Path:
    _write(folder / "known_hosts", "")
    return _write(folder / "inventory.yaml", textwrap.dedent(f"""\
        name: authored
        ssh: {{user: root, port: {port}, known_hosts: ./known_hosts, connect_timeout: 2s{ssh_extra}}}
        """) + policy + "nodes:\n  - {name: n1, address: 127.0.0.1}\n")


def _scenario(folder: Path) -> Path:
    return _write(folder / "drill.yaml", textwrap.dedent("""\
        name: authored
        cluster: {inventory: inventory.yaml}
        workload: {launch: attach, process: 'train\\.py', run_id: x}
        probes:
          log: [{match: 'step (?P<step>\\d+)', event: step}]
        faults:
          - {kind: process.kill, target: {nodes: [n1], process: 'train\\.py'}, at: {after: 1s}}
        """))


CONFIGS = [  # (case, the config's text with {marker}, the refused line, what the message says)
    ("match-exec", "Host *\n  User root\nMatch exec \"id -u > {marker}\"\n  Port 22\n", 3, "Match exec runs a command"),
    ("match-not-exec", "Match host 127.0.0.1 !exec \"touch {marker}\"\n  Port 22\n", 1, "Match exec runs a command"),
    ("proxy-command", "Host 127.0.0.1\n  ProxyCommand sh -c 'touch {marker}'\n", 2, "ProxyCommand runs a command"),
    ("proxy-command-equals", "Host *\n  proxycommand=touch {marker}\n", 2, "ProxyCommand runs a command"),
    ("local-command", "Host *\n  PermitLocalCommand yes\n  LocalCommand touch {marker}\n", 3, "LocalCommand runs a command"),
    ("include-outside", "Include /etc/ssh/ssh_config\nHost *\n  Port 22\n", 1, "outside the allowed roots"),
]


@pytest.mark.parametrize("case", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_an_ssh_config_that_runs_a_command_is_refused_at_its_line(case, drill, listener):
    folder, marker = drill
    _, text, line, says = case
    config = _write(folder / "ssh_config", text.format(marker=marker))
    _inventory(folder, listener.getsockname()[1], ", config: ./ssh_config")
    scenario = _scenario(folder)
    for argv in (("validate", scenario), ("validate", folder / "inventory.yaml"), ("run", scenario, "--out", folder / "run")):
        res = run_cli(*argv)
        assert res.code == 2, (argv, res.stdout + res.stderr)
        assert f"{config}:{line}:" in res.stderr and says in res.stderr, res.stderr
    assert not marker.exists() and not anyone_connected(listener) and not (folder / "run").exists()


def test_an_included_config_is_checked_too_and_one_inside_the_roots_is_fine(drill, listener):
    folder, marker = drill
    inner = _write(folder / "inner.conf", f"Host *\n  ProxyCommand touch {marker}\n")
    _write(folder / "ssh_config", f"Include {inner}\n")
    _inventory(folder, listener.getsockname()[1], ", config: ./ssh_config")
    res = run_cli("validate", _scenario(folder))
    assert res.code == 2 and f"{inner}:2:3: ProxyCommand runs a command" in res.stderr, res.stderr
    _write(inner, "Host *\n  ServerAliveInterval 5\n")
    res = run_cli("validate", folder / "drill.yaml")
    assert res.code == 0, res.stderr
    assert not marker.exists()


def test_a_config_changed_after_validation_is_refused_before_paramiko_reads_it(drill):
    """Between validate and connect the author rewrites the config: the transport checks it again, right before
    paramiko (which would run Match exec) reads it."""
    from chaoskit.cluster.transports.ssh import SSHTransport
    from chaoskit.core.errors import InfraError

    folder, marker = drill
    config = _write(folder / "ssh_config", f"Host *\n  Port 22\nMatch exec \"touch {marker}\"\n")
    t = SSHTransport("n1", "127.0.0.1", ssh_config=config, ssh_roots=[str(folder)])
    with pytest.raises(InfraError, match=f"{config}:3:1: Match exec runs a command"):
        t.route()
    assert not marker.exists()


@pytest.mark.parametrize("field", ["known_hosts", "key", "config"])
def test_ssh_files_outside_the_allowed_roots_are_refused_at_their_line(field, drill, listener, home):
    """known_hosts at another user's authorized_keys (which trust on first use would have appended a key line to),
    a key or a config elsewhere: refused at the inventory's line, before anything connects."""
    folder, _ = drill
    victim = home / ".ssh"
    _sh("runuser", "-u", AUTHOR, "--", "mkdir", "-p", str(victim))
    target = {"known_hosts": victim / "authorized_keys", "key": Path("/etc/ssh/ssh_host_ed25519_key"),
              "config": Path("/etc/ssh/ssh_config")}[field]
    inv = _inventory(folder, listener.getsockname()[1], ", trust_on_first_use: true")
    text = inv.read_text().replace("known_hosts: ./known_hosts, ", "") + ""
    text = text.replace("connect_timeout: 2s", f"connect_timeout: 2s, {field}: {target}")
    _write(inv, text)
    res = run_cli("validate", _scenario(folder))
    assert res.code == 2 and f"{inv}:2:" in res.stderr and f"ssh.{field}: {target} is outside the allowed roots" in res.stderr, \
        res.stderr
    assert not (victim / "authorized_keys").exists() and not anyone_connected(listener)


def test_a_policys_ssh_roots_keep_keys_to_them(drill, listener, tmp_path):
    """With ssh_roots: the inventory's own folder, even the operator's ~/.ssh is out of bounds for ssh.key."""
    folder, _ = drill
    inv = _inventory(folder, listener.getsockname()[1], ", key: ~/.ssh/id_ed25519", policy=f"policy: {{ssh_roots: [{folder}]}}\n")
    res = run_cli("validate", inv)
    assert res.code == 2 and "ssh.key:" in res.stderr and "is outside the allowed roots" in res.stderr, res.stderr


def test_trust_on_first_use_appends_only_to_roots_own_regular_file(drill, home):
    from chaoskit.cluster.ssh_paths import append_known_host

    folder, _ = drill
    roots = [str(folder)]
    line = "[127.0.0.1]:22 ssh-ed25519 AAAA\n"
    with pytest.raises(PermissionError, match="creates no folder"):
        append_known_host(str(folder / "new" / "known_hosts"), line, roots)
    assert not (folder / "new").exists()
    with pytest.raises(PermissionError, match="outside the allowed roots"):
        append_known_host(str(home / "known_hosts"), line, roots)
    assert not (home / "known_hosts").exists()
    _write(folder / "theirs", "")  # the author's own file: root writes nothing into it
    with pytest.raises(PermissionError, match="belongs to uid"):
        append_known_host(str(folder / "theirs"), line, roots)
    assert (folder / "theirs").read_text() == ""
    os.symlink(home / ".profile", folder / "link")  # a link the author planted, to a file of theirs
    before = (home / ".profile").read_bytes() if (home / ".profile").exists() else None
    with pytest.raises(OSError):
        append_known_host(str(folder / "link"), line, roots)
    assert ((home / ".profile").read_bytes() if (home / ".profile").exists() else None) == before
    os.mkfifo(folder / "fifo")
    with pytest.raises(OSError):
        append_known_host(str(folder / "fifo"), line, roots)
    ours = folder / "known_hosts.root"
    append_known_host(str(ours), line, roots)
    assert ours.read_text() == line and oct(os.stat(ours).st_mode & 0o777) == "0o600"


# -- Slurm's commands and config, power commands, Ray addresses ---------------------------------------------


def _fake_tools(folder: Path, marker: Path) -> Path:
    from chaoskit.backends.inventory import SLURM_TOOLS

    bin_dir = folder / "bin"
    _sh("runuser", "-u", AUTHOR, "--", "mkdir", str(bin_dir))
    for tool in SLURM_TOOLS:
        _write(bin_dir / tool, f"#!/bin/sh\nid -u > {marker}\n")
        _sh("runuser", "-u", AUTHOR, "--", "chmod", "755", str(bin_dir / tool))
    return bin_dir


def test_an_authors_slurm_commands_and_config_are_refused(drill, listener):
    """A fake squeue in the author's folder ran as uid 0 before: now cluster.slurm.bin (and a slurm.conf) that someone
    other than root can change is refused, exit 2, and none of its programs runs."""
    folder, marker = drill
    bin_dir = _fake_tools(folder, marker)
    _inventory(folder, listener.getsockname()[1])
    scenario = _scenario(folder)
    text = scenario.read_text().replace("cluster: {inventory: inventory.yaml}",
                                        f"cluster: {{inventory: inventory.yaml, scheduler: slurm, slurm: {{bin: {bin_dir}}}}}")
    _write(scenario, text.replace("run_id: x", "slurm_job: '7'"))
    for argv in (("validate", scenario), ("run", scenario, "--out", folder / "run")):
        res = run_cli(*argv)
        assert res.code == 2 and "cluster.slurm.bin:" in res.stderr and "someone other than root" in res.stderr, res.stderr
    conf = _write(folder / "slurm.conf", "ClusterName=theirs\n")
    _write(scenario, scenario.read_text().replace(f"bin: {bin_dir}", f"conf: {conf}"))
    res = run_cli("validate", scenario)
    assert res.code == 2 and "cluster.slurm.conf:" in res.stderr and "someone other than root" in res.stderr, res.stderr
    assert not marker.exists() and not anyone_connected(listener)


def test_an_authors_power_command_is_refused_at_its_line_and_never_runs(drill, listener):
    from chaoskit.cluster.power import run_power_command
    from chaoskit.core.errors import InfraError

    folder, marker = drill
    script = _write(folder / "off.sh", f"#!/bin/sh\nid -u > {marker}\n")
    _sh("runuser", "-u", AUTHOR, "--", "chmod", "755", str(script))
    inv = _inventory(folder, listener.getsockname()[1])
    _write(inv, inv.read_text().replace("- {name: n1, address: 127.0.0.1}",
                                        f"- {{name: n1, address: 127.0.0.1, power: {{off: [{script}], on: [/bin/true]}}}}"))
    res = run_cli("validate", inv)
    assert res.code == 2 and f"{inv}:4:" in res.stderr and "nodes.0.power.off:" in res.stderr, res.stderr
    with pytest.raises(InfraError, match="not run: .*someone other than root"):  # and at run time, whatever was validated
        run_power_command([str(script)], 5, "n1")
    assert not marker.exists()
    # a policy's power_programs: only the programs it names
    _write(inv, inv.read_text().replace(f"off: [{script}]", "off: [/bin/echo, 'off']").replace(
        "nodes:", "policy: {power_programs: [/bin/true]}\nnodes:"))
    res = run_cli("validate", inv)
    assert res.code == 2 and "lets power commands run only /bin/true, not '/bin/echo'" in res.stderr, res.stderr


def test_a_ray_address_the_policy_does_not_name_is_refused(drill):
    folder, _ = drill
    inv = _write(folder / "ray.yaml", "name: r\npolicy: {ray_addresses: ['127.0.0.1:6379']}\nray: 10.9.9.9:6379\nnodes: []\n")
    res = run_cli("validate", inv)
    assert res.code == 2 and f"{inv}:3:" in res.stderr and "not '10.9.9.9:6379'" in res.stderr, res.stderr
    _write(inv, inv.read_text().replace("10.9.9.9", "127.0.0.1"))
    assert run_cli("validate", inv).code == 0


def test_other_power_tools_password_flags_are_redacted():
    """``-p`` is a password for racadm, redfishtool, ilorest (not only sshpass), and curl's ``-u user:password``; ssh's
    ``-p`` stays a port."""
    from chaoskit.core.secrets import redact_argv, redact_text

    assert redact_argv(["racadm", "-r", "bmc", "-u", "root", "-p", "calvin", "serveraction", "powerdown"])[6] == "***"
    assert redact_argv(["/usr/bin/redfishtool", "-u", "admin", "-psecret", "Systems", "reset"])[3] == "-p***"
    assert redact_argv(["curl", "-u", "admin:pdu-pass", "https://pdu/outlet/3/off"])[2] == "admin:***"
    assert redact_argv(["ssh", "-p", "2222", "host"]) == ["ssh", "-p", "2222", "host"]
    assert "calvin" not in redact_text("power command failed: racadm -r bmc -p calvin serveraction powerdown")
