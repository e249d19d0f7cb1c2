"""The docker transport: a node is a container, reached through the docker engine.

It is the SSH transport's sibling: both are an :class:`~.agent_transport.AgentTransport`, so the
on-node agent (:mod:`.channel`) keeps one contract (JSON requests, deadlines, leases, fallbacks); here it
runs in a ``docker exec`` session whose stdin and stdout are the engine's hijacked exec socket. Nothing of
SSH is here (users, keys, host keys, bastions, sudo): the agent runs as the container's root. The control path never crosses the container's network:
a fault that takes the container's NIC down cannot cut chaoskit off (the same
reason real clusters keep a BMC network).

Power: a container has no BMC. ``python -m chaoskit.cluster.transports.docker
power off|on|status CONTAINER`` kills it (SIGKILL: the node is gone at once, as
on a power cut), starts it again, or exits 0 when it runs. Inventories of docker
nodes use it as their ``power`` commands, so ``node.poweroff`` and its
controller-side lease work unchanged.

The docker SDK is imported when a transport first connects.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from typing import Any

from chaoskit.cluster.transports.agent_transport import GRACE_S, AgentTransport
from chaoskit.cluster.transports.channel import AgentChannel, AgentGone, boot_argv
from chaoskit.core.errors import InfraError

__all__ = ["DockerTransport", "devices_by_address", "docker_client", "network_argv", "networks_of", "power_argv"]

DEFAULT_PYTHON = "python3"


def docker_client(timeout: float = 30.0) -> Any:
    """A docker SDK client for the engine in the environment (``DOCKER_HOST`` or the local socket)."""
    try:
        import docker
    except ImportError:
        raise InfraError("the docker lab and transport need the docker SDK", hint="pip install 'chaoskit[docker]'") from None
    try:
        client = docker.from_env(timeout=int(timeout))
        client.ping()
    except Exception as exc:  # noqa: BLE001 - the SDK raises DockerException, requests and socket errors alike
        raise InfraError(
            f"no docker engine answers: {_short(exc)}",
            hint="install and start one (Debian: apt-get install docker.io; dockerd), or set DOCKER_HOST",
        ) from None
    return client


def power_argv(container: str, action: str) -> list[str]:
    """The power command of a container node, run on the controller."""
    return [sys.executable, "-m", "chaoskit.cluster.transports.docker", "power", action, container]


class DockerTransport(AgentTransport):
    """Run commands in one container through the docker engine (the agent's contract, :class:`AgentTransport`)."""

    name = "docker"

    def __init__(self, node: str, container: str, *, python: str = DEFAULT_PYTHON, workdir: str | None = None,
                 process_scope: str = "all", scope_token: str | None = None, connect_timeout: float = 10.0,
                 command_timeout: float = 30.0, use_agent: bool = True) -> None:
        super().__init__(node, python=python, workdir=workdir, process_scope=process_scope, scope_token=scope_token,
                         connect_timeout=connect_timeout, command_timeout=command_timeout, use_agent=use_agent)
        self.container = container

    def __repr__(self) -> str:
        return f"DockerTransport({self.node!r}, container={self.container!r}, mode={self.mode})"

    @property
    def connected(self) -> bool:
        return self._client is not None

    def _open_client(self) -> Any:
        return docker_client(self.connect_timeout).api

    def _start_agent(self) -> AgentChannel:
        try:
            chan = _ExecChannel.open(self._client, self.container, boot_argv(self.python))
        except InfraError as exc:
            raise AgentGone(str(exc)) from None
        return self._checked_agent(AgentChannel.over(chan, self.connect_timeout, self.node, self.program))

    def _exec(self, command: str, timeout: float, stdin: bytes | None = None) -> tuple[int, str, str]:
        """One ``docker exec`` of a shell command line (already quoted) with a client-side deadline."""
        with self._lock:
            self._connect_locked()
            api = self._client
        chan = _ExecChannel.open(api, self.container, ["sh", "-c", command])
        end = time.monotonic() + timeout + GRACE_S
        out = bytearray()
        try:
            if stdin is not None:
                chan.sendall(stdin)
            chan.shutdown_write()
            reader = threading.Thread(target=lambda: out.extend(chan.read_all()), daemon=True)
            reader.start()
            reader.join(max(0.0, end - time.monotonic()))
            if reader.is_alive():
                raise InfraError(f"{command[:80]}...: no answer from node {self.node} within {timeout:g}s")
            return chan.exit_code(), out.decode(errors="replace"), chan.stderr().decode(errors="replace")
        finally:
            chan.close()


class _ExecChannel:
    """What :class:`~.channel.AgentChannel` needs of a paramiko channel, over one docker exec.

    With no TTY the engine multiplexes the process's stdout and stderr on the
    socket in frames (8-byte header: stream, 3 zero bytes, big-endian length);
    stdin is written raw and closed with a half-shutdown.
    """

    def __init__(self, api: Any, exec_id: str, sock: Any, container: str) -> None:
        self.api, self.exec_id, self.container = api, exec_id, container
        self.sock: socket.socket = getattr(sock, "_sock", sock)
        self.sock.settimeout(None)
        self._out = bytearray()
        self._err = bytearray()
        self._eof = False

    @classmethod
    def open(cls, api: Any, container: str, argv: list[str]) -> "_ExecChannel":
        import docker.errors

        try:
            exec_id = api.exec_create(container, argv, stdin=True, stdout=True, stderr=True, tty=False)["Id"]
            sock = api.exec_start(exec_id, socket=True)
        except docker.errors.NotFound:
            raise InfraError(f"container {container} does not exist") from None
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                raise InfraError(f"container {container} is not running") from None
            raise InfraError(f"docker exec in {container} failed: {_short(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - connection errors from requests/urllib3
            raise InfraError(f"docker exec in {container} failed: {_short(exc)}") from None
        return cls(api, exec_id, sock, container)

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def shutdown_write(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def recv(self, n: int) -> bytes:
        """Up to ``n`` bytes of the process's stdout; ``b""`` once it has closed it."""
        while not self._out and not self._eof:
            self._read_frame()
        data = bytes(self._out[:n])
        del self._out[:n]
        return data

    def read_all(self) -> bytes:
        while not self._eof:
            self._read_frame()
        data, self._out = bytes(self._out), bytearray()
        return data

    def recv_stderr_ready(self) -> bool:
        return bool(self._err)

    def recv_stderr(self, n: int) -> bytes:
        data = bytes(self._err[:n])
        del self._err[:n]
        return data

    def stderr(self) -> bytes:
        return bytes(self._err)

    def exit_code(self) -> int:
        code = self.api.exec_inspect(self.exec_id).get("ExitCode")
        return -1 if code is None else int(code)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def _read_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                break
            buf += chunk
        return bytes(buf)

    def _read_frame(self) -> None:
        header = self._read_exact(8)
        if len(header) < 8:
            self._eof = True
            return
        stream, size = header[0], int.from_bytes(header[4:8], "big")
        payload = self._read_exact(size)
        (self._err if stream == 2 else self._out).extend(payload)
        if len(payload) < size:
            self._eof = True


def _short(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


# -- power, run on the controller (python -m chaoskit.cluster.transports.docker power ...) ------------


def _container(client: Any, name: str) -> Any:
    """The container, or ``None`` after saying on stderr that it does not exist."""
    import docker.errors

    try:
        return client.containers.get(name)
    except docker.errors.NotFound:
        print(f"container {name} does not exist", file=sys.stderr)
        return None


def power(action: str, container: str) -> int:
    """``off`` kills the container (SIGKILL), ``on`` starts it and waits until it runs, ``status`` exits 0 when it runs."""
    client = docker_client()
    c = _container(client, container)
    if c is None:
        return 2
    if action == "status":
        return 0 if c.status == "running" else 1
    if action == "off":
        if c.status == "running":
            c.kill(signal="SIGKILL")
        return 0
    if action == "on":
        if c.status != "running":
            c.start()
        end = time.monotonic() + 30
        while time.monotonic() < end:
            c.reload()
            if c.status == "running":
                return 0
            time.sleep(0.1)
        print(f"container {container} did not start: {c.status}", file=sys.stderr)
        return 1
    print(f"unknown power action {action!r}: off, on or status", file=sys.stderr)
    return 2


def networks_of(container: str) -> dict[str, dict[str, Any]]:
    """The container's networks: name -> {ip, aliases}."""
    import docker.errors

    try:
        c = docker_client().containers.get(container)
    except docker.errors.NotFound:
        raise InfraError(f"container {container} does not exist") from None
    nets = c.attrs["NetworkSettings"]["Networks"] or {}
    devices = devices_by_address(c)
    return {name: {"ip": n.get("IPAddress") or "", "aliases": [a for a in n.get("Aliases") or [] if a != c.id[:12]],
                   "device": devices.get(n.get("IPAddress") or "", "")}
            for name, n in nets.items()}


def devices_by_address(c: Any) -> dict[str, str]:
    """IPv4 address -> device name inside the container (``ip -o -4 addr``)."""
    code, out = c.exec_run(["ip", "-o", "-4", "addr", "show"])
    found = {}
    for line in (out or b"").decode(errors="replace").splitlines():
        parts = line.split()
        if code == 0 and len(parts) >= 4 and parts[2] == "inet":
            found[parts[3].split("/")[0]] = parts[1].split("@")[0]
    return found


def network_argv(action: str, container: str, networks: list[str]) -> list[str]:
    """The controller command that disconnects a container from ``networks`` or connects it back
    (each ``NAME`` or, for connect, ``NAME=IP=ALIAS,ALIAS`` to keep its address and names).

    The engine names a reconnected NIC anew (eth1, eth2...): chaoskit finds a docker node's NICs
    by address, never by a remembered name. (Renaming it back would hide it from the engine,
    whose next disconnect would then leave it in place.)"""
    return [sys.executable, "-m", "chaoskit.cluster.transports.docker", "network", action, container, *networks]


def network(action: str, container: str, networks: list[str]) -> int:
    """``disconnect`` / ``connect`` the container and the networks, or ``status``: exit 0 when it is on all of them."""
    import docker.errors

    client = docker_client()
    c = _container(client, container)
    if c is None:
        return 2
    current = set((c.attrs["NetworkSettings"]["Networks"] or {}))
    for spec in networks:
        name, ip, aliases = (spec.split("=") + ["", ""])[:3]
        if action == "disconnect" and name in current:
            client.networks.get(name).disconnect(c, force=True)
        elif action == "connect" and name not in current:
            net = client.networks.get(name)
            kwargs: dict[str, Any] = {"aliases": [a for a in aliases.split(",") if a] or None}
            try:  # the same address when the network allows it (a user-configured subnet), so peers still reach it
                net.connect(c, ipv4_address=ip or None, **kwargs)
            except docker.errors.APIError:
                net.connect(c, **kwargs)

        elif action == "status" and name not in current:
            print(f"container {container} is not on network {name}", file=sys.stderr)
            return 1
        elif action not in ("connect", "disconnect", "status"):
            print(f"unknown network action {action!r}: disconnect, connect or status", file=sys.stderr)
            return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    usage = ("usage: python -m chaoskit.cluster.transports.docker power off|on|status CONTAINER\n"
             "       python -m chaoskit.cluster.transports.docker network disconnect|connect|status CONTAINER NETWORK[=IP=ALIASES]...")
    try:
        if len(args) == 3 and args[0] == "power":
            return power(args[1], args[2])
        if len(args) >= 4 and args[0] == "network":
            return network(args[1], args[2], args[3:])
    except InfraError as exc:
        print(str(exc), file=sys.stderr)
        return 3
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
