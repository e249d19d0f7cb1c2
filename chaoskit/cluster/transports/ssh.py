"""The SSH transport: one paramiko connection per host, one agent per connection.

Contract:

- **Host keys** are verified against the inventory's ``known_hosts``. An unknown
  key is refused (:class:`HostKeyError`, naming the host and the key's SHA256
  fingerprint) unless ``trust_on_first_use`` is set, which pins the key it sees
  into ``known_hosts`` so every later connection must match it. A changed key is
  always refused.
- **Auth** is by key only (no agent, no password, no ``~/.ssh`` key lookups).
- **Route**: an address that is a Host alias of the OpenSSH client config
  (``ssh_config``, read on first connect by :mod:`.ssh_route`) takes its
  HostName, User, Port, IdentityFile and ProxyJump, except where the inventory
  set a value itself (``explicit``). Through a ``jump`` (a bastion: another
  :class:`SSHTransport`, shared by every node behind it) the connection runs
  inside a ``direct-tcpip`` channel of the bastion's; the bastion's host key is
  verified like a node's, and its errors name the bastion.
- **Privilege**: with ``become="sudo"`` (the default unless the user is root)
  the agent, and so every remote command, runs under ``sudo -n`` (never
  prompts). When sudo wants a password the first agent start fails with
  :class:`SudoError` naming the node and the user: no restarts, no hang.
- **Fast path**: the first command starts :mod:`chaoskit.nodeside.agent` over one exec
  channel (:class:`~.channel.AgentChannel`); later commands travel over that channel as JSON lines with request
  ids, deadlines and exit codes (~0.2 ms round trip instead of ~100 ms for a new
  SSH session). If the agent dies it is restarted; after repeated failures the
  transport falls back to one SSH exec per command.
- **Deadlines**: every command has one on the node (the agent kills the
  command's process group; in exec mode ``timeout -k``) *and* on the client: no
  answer by ``timeout + grace`` raises :class:`~chaoskit.core.errors.InfraError`,
  whatever the socket does.
- **Clock**: times the node reports (a command's end, a signal, a log line read)
  come back on the controller's clock, corrected by the offset :meth:`SSHTransport.sync_clock`
  measured (:mod:`chaoskit.cluster.clock`); :meth:`SSHTransport.ping` alone gives the raw
  node clock.
- **Streams**: :meth:`SSHTransport.follow` streams a file's lines from the node over the
  agent's channel; it ends when cancelled or when the connection drops, and says where
  it stopped so that a new stream picks up there. :meth:`SSHTransport.watch_processes`
  streams the changes of the job's workers there (with a heartbeat about once a second),
  and resumes from the workers the controller last knew.
- **State folder**: the agent keeps chaoskit's node-side files (leases, the watchdog, faults' state) in one
  folder of its own (:mod:`chaoskit.nodeside.nodefs`): ``/run/chaoskit`` as root, ``~/.local/state/chaoskit``
  of a user that is not, or the inventory's ``workdir``; made 0700 and checked (owner, mode, not a link)
  on every agent start. A folder that fails the check stops the connection with an
  :class:`~chaoskit.core.errors.InfraError` naming it and what is wrong; :attr:`SSHTransport.state_dir`
  is the folder the agent checked. The agent (and every helper chaoskit runs there) runs as ``python3 -I``.
- **Quoting**: argv travels as a JSON list to the agent (no shell). In exec mode
  each element is quoted with :func:`~.api.shell_quote`. The values in argv were
  validated by the fault that built them; control characters are refused here
  as a last line of defence.

What is not about SSH (the agent, its requests, deadlines, fallbacks, streams, leases) is
:class:`~chaoskit.cluster.transports.agent_transport.AgentTransport`, which the docker transport shares.
Many nodes at once: :mod:`chaoskit.cluster.transports.ssh_many`. paramiko is imported when a transport connects, not at import time.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from chaoskit.cluster.ssh_paths import append_known_host, inside, read_config
from chaoskit.cluster.transports.agent_transport import GRACE_S, AgentTransport
from chaoskit.cluster.transports.api import InventorySite, ListedNode
from chaoskit.cluster.transports.channel import AgentChannel
from chaoskit.cluster.transports.ssh_route import Bastions, host_config, parse_jumps
from chaoskit.core.errors import InfraError
from chaoskit.core.shell import shell_quote
from chaoskit.core.trusted import open_checked

__all__ = [
    "SSHTransport",
    "HostKeyError",
    "SudoError",
    "fingerprint",
]

IDLE_WAKE_S = 5.0
"""How often a connected transport's thread wakes with nothing to read (paramiko's default,
``Transport._active_check_timeout``, is 0.1 s: ten wake-ups a second per connection, most of
an idle controller's CPU at a hundred nodes). Set on the socket once the session is up, so the
handshake and authentication keep paramiko's own timing; what the wake-up checks (a close, a
re-key, the keepalive every 5 s) is not needed more often than this (a close does not wait for it)."""


"""Failed agent starts in a row before the transport falls back to one exec per command."""
# paramiko logs protocol oddities (e.g. "Success for unrequested channel!" after a link drops) at
# ERROR; with no handler configured Python prints them on stderr. chaoskit reports what matters itself.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
"""Offered first, ahead of paramiko's own order (which starts with aes128-ctr plus
hmac-sha2-256): an AEAD cipher costs one call into the cipher per packet, where CTR
plus HMAC also computes the MAC and compares it byte by byte in Python. OpenSSH has
offered these since 6.2; a server without them gets paramiko's list as before."""

class HostKeyError(InfraError):
    """The node's host key is unknown or does not match ``known_hosts``."""


class SudoError(InfraError):
    """``sudo -n`` refused to run chaoskit's agent (it wants a password, or the user may not sudo)."""


def fingerprint(key: Any) -> str:
    """OpenSSH-style ``SHA256:...`` fingerprint of a paramiko public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _host_entry(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


class SSHTransport(AgentTransport):
    """Run commands on one node over SSH (see the module docstring for the contract)."""

    name = "ssh"
    ssh_settings = True
    inventory_node = True  # an inventory node may say transport: ssh, made by from_inventory

    def __init__(
        self,
        node: str,
        address: str,
        *,
        user: str = "root",
        port: int = 22,
        key_file: str | os.PathLike[str] | None = None,
        known_hosts: str | os.PathLike[str] | None = None,
        trust_on_first_use: bool = False,
        become: str | None = None,
        jump: "SSHTransport | None" = None,
        ssh_config: str | os.PathLike[str] | None = None,
        explicit: Iterable[str] = ("user", "port", "key", "jump"),
        bastions: Bastions | None = None,
        role: str = "node",
        python: str = "python3",
        workdir: str | None = None,
        process_scope: str = "all",
        scope_token: str | None = None,
        connect_timeout: float = 10.0,
        command_timeout: float = 30.0,
        use_agent: bool = True,
        vet_python: bool = False,
        ssh_roots: list[str] | None = None,
        config_named: bool = True,
    ) -> None:
        super().__init__(node, python=python, workdir=workdir, process_scope=process_scope, scope_token=scope_token,
                         connect_timeout=connect_timeout, command_timeout=command_timeout, use_agent=use_agent)
        self.config_named = config_named
        """Whether the inventory named ``ssh_config`` (an author's file, checked) rather than it being the operator's
        own ``~/.ssh/config``."""
        self.ssh_roots = ssh_roots
        """Where this machine's SSH files may lie (:mod:`~chaoskit.cluster.ssh_paths`; ``None``: not checked): the
        config is checked again right before it is read, its IdentityFile, and trust on first use's known_hosts."""
        self.address = address
        self.user = user
        self.port = int(port)
        self.key_file = str(key_file) if key_file else None
        self.known_hosts = str(known_hosts) if known_hosts else str(Path.home() / ".ssh" / "known_hosts")
        self.trust_on_first_use = trust_on_first_use
        if become not in (None, "sudo", "none"):
            raise ValueError(f"become: only 'sudo' (or 'none') is supported, not {become!r}")
        self.become = become
        self.jump = jump
        """The bastion this node is reached through (``None``: directly)."""
        self.ssh_config = str(ssh_config) if ssh_config else None
        self.explicit = frozenset(explicit)
        """Which of user, port, key, jump the inventory set itself (the ssh config does not override those)."""
        self.bastions = bastions
        self.role = role
        """``node`` or ``bastion``: how errors name this host."""
        self.vet_python = vet_python
        """The site policy names the Python: before it first runs, check on the node that root owns it and
        nobody else can write it (``stat -L``)."""
        self._python_vetted = False
        self._routed = self.ssh_config is None
        self._sock: Any = None
        """The tunnel through ``jump`` the connection runs in, when there is one."""

    @classmethod
    def from_inventory(cls, site: InventorySite, index: int, spec: Any) -> ListedNode:
        """An inventory file's node (``transport: ssh``) with its effective SSH settings."""
        ssh = site.ssh_for(spec)
        conn = cls.from_settings(spec.name, spec.address, ssh, site, workdir=spec.workdir,
                                 process_scope=spec.processes, vet_python=site.vet_python)
        return ListedNode(conn, dict(spec.labels), ssh)

    @classmethod
    def from_settings(cls, name: str, address: str, ssh: Any, site: InventorySite, **kwargs: Any) -> "SSHTransport":
        """The transport of one node or bastion from its effective settings (an inventory's ``ssh:``); what the
        inventory set itself (``model_fields_set``) is what the ssh config may not override."""
        if ssh.config is None:
            default = Path("~/.ssh/config").expanduser()
            config = str(default) if default.is_file() else None
        else:
            config = None if ssh.config == "none" else _resolve(site.base, ssh.config)
        jump = None if ssh.jump in (None, "none") else site.bastions[ssh.jump]
        return cls(
            name,
            address,
            user=ssh.user,
            port=ssh.port,
            key_file=_resolve(site.base, ssh.key),
            known_hosts=_resolve(site.base, ssh.known_hosts),
            trust_on_first_use=ssh.trust_on_first_use if site.trust_on_first_use is None else site.trust_on_first_use,
            become=ssh.become,
            jump=jump,
            ssh_config=config,
            config_named=ssh.config is not None,
            explicit=ssh.model_fields_set & {"user", "port", "key", "jump"},
            bastions=site.bastions,
            python=ssh.python,
            connect_timeout=ssh.connect_timeout,
            command_timeout=ssh.command_timeout,
            ssh_roots=site.ssh_roots,
            **kwargs,
        )

    def __repr__(self) -> str:
        via = f", via {self.jump.node}" if self.jump is not None else ""
        return f"SSHTransport({self.node!r}, {self.user}@{self.address}:{self.port}{via}, mode={self.mode})"

    @property
    def sudo(self) -> bool:
        """Whether remote commands run under ``sudo -n``: ``become``, or by default when the user is not root."""
        return self.become == "sudo" or (self.become is None and self.user != "root")

    @property
    def runs_as(self) -> str:
        return "root" if self.sudo else self.user

    # -- connection ---------------------------------------------------------------------

    def _drop_locked(self) -> None:
        super()._drop_locked()
        self._sock = None

    @property
    def connected(self) -> bool:
        client = self._client
        transport = client.get_transport() if client is not None else None
        # through a bastion, the tunnel closes at once when the bastion's connection drops; the
        # node's transport notices only when its reader thread next runs
        sock = self._sock
        return transport is not None and transport.is_active() and (sock is None or not sock.closed)

    def route(self) -> None:
        """Apply the ssh config's entry for this address (once; before the first connect)."""
        if self._routed:
            return
        with self._lock:
            if self._routed:
                return
            path = self.ssh_config
            if not os.path.exists(path):
                raise InfraError(f"ssh config {path} of {self.label} does not exist",
                                 hint="point ssh.config at an OpenSSH client config, or set ssh.config: none")
            # read once: checked again (it may have changed since validation), and paramiko reads the checked text
            checked = self.ssh_roots is not None and self.config_named
            text, problems = read_config(path, self.ssh_roots if checked else None)
            if problems:
                file, line, col, message = problems[0]
                if checked:
                    raise InfraError(f"{file}:{line}:{col}: {message} (ssh config of {self.label}); nothing connected")
                raise InfraError(f"ssh config {path} of {self.label}: {message}", hint="fix it, or set ssh.config: none")
            entry = host_config(text, path, self.address)
            if (self.ssh_roots is not None and self.config_named and "identityfile" in entry
                    and "key" not in self.explicit and not inside(entry["identityfile"], self.ssh_roots)):
                raise InfraError(f"ssh config {path}: IdentityFile {entry['identityfile']} of {self.label} is outside "
                                 f"the allowed roots ({', '.join(self.ssh_roots)}); nothing connected")
            alias = self.address
            self.address = entry.get("hostname", self.address)
            if "user" in entry and "user" not in self.explicit:
                self.user = entry["user"]
            if "port" in entry and "port" not in self.explicit:
                self.port = entry["port"]
            if "identityfile" in entry and "key" not in self.explicit:
                self.key_file = entry["identityfile"]
            if "proxyjump" in entry and "jump" not in self.explicit and self.jump is None:
                self.jump = self._config_jump(entry["proxyjump"], alias)
            self._routed = True

    def _config_jump(self, value: str, alias: str) -> "SSHTransport | None":
        """The bastion a config's ProxyJump names, looked up in the same config; shared through ``bastions``."""
        bastions = self.bastions if self.bastions is not None else Bastions()
        self.bastions = bastions
        jump: SSHTransport | None = None
        for user, host, port in parse_jumps(value):
            explicit = {k for k, v in (("user", user), ("port", port)) if v is not None} | ({"jump"} if jump else set())
            key = ("config", self.ssh_config, user, host, port, jump.node if jump else None)

            def make(user=user, host=host, port=port, via=jump, explicit=explicit) -> SSHTransport:
                return SSHTransport(
                    host, host, user=user or self.user, port=port or 22, key_file=self.key_file,
                    known_hosts=self.known_hosts, trust_on_first_use=self.trust_on_first_use, jump=via,
                    ssh_config=self.ssh_config, explicit=explicit, bastions=bastions, role="bastion",
                    connect_timeout=self.connect_timeout, use_agent=False, ssh_roots=self.ssh_roots,
                    config_named=self.config_named,
                )

            jump = bastions.get(key, make)
        if jump is not None:
            self.notes.append(f"{self.label} ({alias}) is reached through bastion {jump.node} (ProxyJump {value})")
        return jump

    def open_tunnel(self, host: str, port: int, timeout: float, purpose: str) -> Any:
        """A ``direct-tcpip`` channel from this host (a bastion) to ``host:port``, for ``purpose`` (who asks).

        Thread-safe; a dropped connection is reconnected once."""
        for attempt in (1, 2):
            with self._lock:
                self._connect_locked()
                transport = self._client.get_transport()
            try:
                return transport.open_channel("direct-tcpip", (host, int(port)), ("127.0.0.1", 0), timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - paramiko raises ChannelException, SSHException, EOFError
                if attempt == 1 and not self.connected:
                    continue
                raise InfraError(
                    f"cannot reach {purpose} at {host}:{port} through {self.label} ({self.address}): "
                    f"{exc or type(exc).__name__}",
                    hint=f"check that {self.label} can reach {host}:{port} and allows TCP forwarding",
                ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _open_client(self) -> Any:
        self.route()
        try:
            import paramiko
        except ImportError:
            raise InfraError(
                "the SSH transport needs paramiko", hint="pip install 'chaoskit[ssh]'"
            ) from None
        from paramiko.hostkeys import HostKeyEntry

        client = paramiko.SSHClient()
        if os.path.exists(self.known_hosts):
            try:  # opened once, inside the roots where it really is, and its keys taken from what was opened
                with open_checked(self.known_hosts, roots=self.ssh_roots, what="known_hosts") as checked:
                    text = checked.read(32 << 20).decode("utf-8", errors="replace")
                keys = client.get_host_keys()
                for number, line in enumerate(text.splitlines(), 1):
                    entry = HostKeyEntry.from_line(line, number) if line.strip() and not line.lstrip().startswith("#") \
                        else None
                    for host in entry.hostnames if entry is not None and entry.key is not None else ():
                        keys.add(host, entry.key.get_name(), entry.key)
            except (OSError, paramiko.SSHException) as exc:
                raise InfraError(f"cannot read known_hosts {self.known_hosts}: {exc}") from None
        elif not self.trust_on_first_use:
            raise HostKeyError(
                f"known_hosts file {self.known_hosts} does not exist, so the host key of {self.label} "
                f"({self.address}) cannot be verified",
                hint="point ssh.known_hosts at a file holding the node's key, or set ssh.trust_on_first_use: true",
            )
        policy = _PinPolicy(self) if self.trust_on_first_use else _RejectPolicy(self)
        client.set_missing_host_key_policy(policy)
        where = f"{self.user}@{self.address}:{self.port}"
        sock = None
        if self.jump is not None:
            sock = self.jump.open_tunnel(self.address, self.port, self.connect_timeout, self.label)
            where += f" through {self.jump.label}"
        try:
            client.connect(
                self.address,
                port=self.port,
                username=self.user,
                key_filename=self.key_file,
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
                channel_timeout=self.connect_timeout,
                look_for_keys=False,
                allow_agent=False,
                sock=sock,
                transport_factory=_transport_preferring_aead,
            )
        except HostKeyError:
            client.close()
            if sock is not None:
                sock.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyError(
                f"host key of {self.label} ({self.address}) does not match {self.known_hosts}: "
                f"expected {exc.expected_key.get_name()} {fingerprint(exc.expected_key)}, "
                f"got {exc.key.get_name()} {fingerprint(exc.key)}",
                hint="someone may be intercepting the connection; if the node was reinstalled, update known_hosts",
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise InfraError(
                f"ssh key authentication to {where} ({self.label}) failed: {exc}",
                hint=f"check ssh.user and ssh.key ({self.key_file})",
            ) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            client.close()
            raise InfraError(f"cannot reach {self.label} at {where}: {exc or type(exc).__name__}") from None
        transport = client.get_transport()
        transport.set_keepalive(5)
        transport.sock.settimeout(IDLE_WAKE_S)
        self._sock = sock
        return client

    # -- the agent ------------------------------------------------------------------------

    def _remote(self, argv: list[str]) -> str:
        return shell_quote((["sudo", "-n"] if self.sudo else []) + argv)

    def _boot_command(self, timeout: float | None = None) -> str:
        if self.vet_python and not self._python_vetted:
            self._check_python()
        return super()._boot_command(timeout)

    def _check_python(self) -> None:
        """Refuse a Python on the node that is not a root-owned file nobody else can write (the site policy's)."""
        rc, out, err = self._exec(shell_quote(["stat", "-L", "-c", "%u %a %F", "--", self.python]), min(10.0, self.command_timeout))
        parts = out.split(maxsplit=2)
        if rc != 0 or len(parts) < 3:
            raise InfraError(f"{self.label}: cannot check the agent's Python {self.python}: {err.strip()[-200:] or 'stat failed'}")
        uid, mode, kind = parts[0], int(parts[1], 8), parts[2].strip()
        if uid != "0" or mode & 0o022 or kind != "regular file":
            raise InfraError(
                f"{self.label}: the agent's Python {self.python} is not a root-owned file only root can write "
                f"(uid {uid}, mode {mode:04o}, {kind}); the site policy allows only such a Python",
                hint="point ssh.python at the system's interpreter (e.g. /usr/bin/python3)")
        self._python_vetted = True

    def _refusal(self, failure: str) -> "SudoError | None":
        """Whether ``sudo -n`` is why the agent did not start: its message (from the agent
        channel's stderr, or else from one ``sudo -n true``), or ``None``."""
        if not self.sudo:
            return None
        line = _sudo_line(failure)
        if line is None:
            try:
                rc, _, err = self._exec(shell_quote(["sudo", "-n", "true"]), min(5.0, self.command_timeout))
            except InfraError:
                return None
            line = _sudo_line(err) if rc != 0 else None
        return None if line is None else self._sudo_error(line)

    def _refused_exec(self, rc: int, out: str, err: str) -> None:
        """An exec that sudo refused to run (it wants a password, or the user may not sudo)."""
        if self.sudo and rc == 1 and not out and (line := _sudo_line(err)) is not None:
            raise self._sudo_error(line)

    def _sudo_error(self, line: str) -> "SudoError":
        if "password" in line:
            message = (f"{self.label}: sudo -n asks for a password for user {self.user}; become: sudo needs "
                       f"password-less sudo (NOPASSWD) for {self.user} on {self.node} ({line})")
        else:
            message = f"{self.label}: sudo -n refuses user {self.user} ({line}); become: sudo needs password-less sudo"
        return SudoError(message, hint=f"on {self.node}, add '{self.user} ALL=(root) NOPASSWD: ALL' to a file in "
                                       "/etc/sudoers.d/, or log in as root (user: root, become: none)")

    def _start_agent(self) -> "AgentChannel":
        """Open one SSH exec channel running the agent."""
        return self._checked_agent(AgentChannel.start(self._client, self._boot_command(), self.connect_timeout,
                                                       self.node, self.program))

    def _exec(self, command: str, timeout: float, stdin: bytes | None = None) -> tuple[int, str, str]:
        """One SSH exec with a client-side deadline; (exit status, stdout, stderr)."""
        with self._lock:
            self._connect_locked()
            client = self._client
        end = time.monotonic() + timeout + GRACE_S
        try:
            chan = client.get_transport().open_session(timeout=min(self.connect_timeout, timeout + GRACE_S))
        except Exception as exc:  # noqa: BLE001 - paramiko raises several unrelated types here
            raise InfraError(f"cannot open an SSH session on node {self.node}: {exc}") from None
        out, err = bytearray(), bytearray()
        try:
            chan.exec_command(command)
            if stdin is not None:
                chan.settimeout(max(0.1, end - time.monotonic()))
                chan.sendall(stdin)
                chan.shutdown_write()
            chan.settimeout(0.0)
            while True:
                got = False
                while chan.recv_ready():
                    out += chan.recv(65536)
                    got = True
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    got = True
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    if chan.eof_received or chan.closed:
                        break
                if chan.closed and not chan.recv_ready():
                    break
                if time.monotonic() > end:
                    raise InfraError(f"{command[:80]}...: no answer from node {self.node} within {timeout:g}s")
                if not got:
                    time.sleep(0.001)
            rc = chan.recv_exit_status() if chan.exit_status_ready() else -1
        except InfraError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise InfraError(f"SSH exec on node {self.node} failed: {exc}") from None
        finally:
            chan.close()
        return rc, out.decode(errors="replace"), err.decode(errors="replace")




class _RejectPolicy:
    """Refuse a host whose key is not in known_hosts, naming the host and the key."""

    def __init__(self, transport: SSHTransport) -> None:
        self.t = transport

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        t = self.t
        raise HostKeyError(
            f"unknown host key for {t.label} ({hostname}): {key.get_name()} {fingerprint(key)} "
            f"is not in {t.known_hosts}",
            hint="check the fingerprint out of band and add the key to known_hosts, "
            "or set ssh.trust_on_first_use: true to pin the first key seen",
        )


class _PinPolicy:
    """Trust on first use: accept the key once and pin it into known_hosts."""

    _file_lock = threading.Lock()

    def __init__(self, transport: SSHTransport) -> None:
        self.t = transport

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        t = self.t
        entry = _host_entry(t.address, t.port)
        client.get_host_keys().add(entry, key.get_name(), key)
        line = f"{entry} {key.get_name()} {key.get_base64()}\n"
        with self._file_lock:
            try:  # never a folder made, a link followed, a file outside the roots or of someone else written
                append_known_host(t.known_hosts, line, t.ssh_roots)
            except OSError as exc:
                raise HostKeyError(f"trust on first use: host key of {t.label} not pinned: {exc}",
                                   hint="point ssh.known_hosts at a file of yours inside the allowed roots") from None
        t.notes.append(f"pinned host key of {t.node} ({entry}): {key.get_name()} {fingerprint(key)}")


_SUDO_REFUSALS = ("password is required", "a terminal is required", "must have a tty", "not in the sudoers",
                  "not allowed to execute", "may not run sudo")


def _sudo_line(text: str) -> str | None:
    """The line in which sudo refused to run a command, or ``None``."""
    for line in text.splitlines():
        at = line.find("sudo:")
        if at >= 0 and any(r in line for r in _SUDO_REFUSALS):
            return line[at:].strip()
    return None


def _resolve(base: Path, value: str | None) -> str | None:
    """An inventory's path: ``~`` expanded, relative to the inventory's folder."""
    if value is None:
        return None
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else base / p)


def _transport_preferring_aead(sock: Any, **kwargs: Any) -> Any:
    """A paramiko Transport offering :data:`PREFERRED_CIPHERS` first (``SSHClient.connect``'s ``transport_factory``)."""
    import paramiko

    transport = paramiko.Transport(sock, **kwargs)
    options = transport.get_security_options()
    first = tuple(c for c in PREFERRED_CIPHERS if c in options.ciphers)
    options.ciphers = first + tuple(c for c in options.ciphers if c not in first)
    return transport


