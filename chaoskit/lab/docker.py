"""The Docker lab: ``docker-compose.yml``'s services as nodes, brought up through the docker SDK.

chaoskit reads the compose file itself (the subset a lab needs: image, build,
init, cap_add, networks, volumes, labels, hostname, environment, command) and
creates what Compose would, with Compose's own names and labels
(``<project>-<service>-1``, ``<project>_<network>``, ``com.docker.compose.*``).
So a lab made by ``chaoskit lab up --kind docker`` shows up in ``docker compose
ps``, and one made by ``docker compose up`` is found and used by chaoskit: the
engine is the only state; nothing is kept on the side.

Nodes are the services in file order: the first ``nodes`` form the job's world,
the next ``spare`` wait as spares. Every node is reached with
:class:`~chaoskit.cluster.transports.docker.DockerTransport` (docker exec), its
NIC on the lab network is ``data``, and its power commands kill and start the
container. The job's files live in the one bind mount that has the same path on
the host and in the nodes (the lab's shared storage).
"""

from __future__ import annotations

import os
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoskit.cluster.inventory import InterfaceSpec, Inventory, Node, PowerCommands
from chaoskit.cluster.transports.docker import (
    DockerTransport,
    devices_by_address,
    docker_client,
    power_argv,
)
from chaoskit.core.accounts import job_group
from chaoskit.core.errors import InfraError, ScenarioError, SourcePos
from chaoskit.core.limits import MAX_FILE_BYTES
from chaoskit.core.state import state_dir
from chaoskit.core.trusted import UntrustedFile, open_checked
from chaoskit.core.yaml_source import input_text, load_yaml_text
from chaoskit.lab.guard import guard, guard_table, unguard
from chaoskit.nodeside import nodefs

__all__ = ["ComposeProject", "DockerLab", "load_compose", "find_compose", "private_bind"]

PROJECT = "com.docker.compose.project"
SERVICE = "com.docker.compose.service"
NUMBER = "com.docker.compose.container-number"
ONEOFF = "com.docker.compose.oneoff"
CONFIG_FILES = "com.docker.compose.project.config_files"
WORKING_DIR = "com.docker.compose.project.working_dir"
NETWORK = "com.docker.compose.network"
VOLUME = "com.docker.compose.volume"
MADE_BY = "io.chaoskit.lab"
"""Set on everything ``chaoskit lab up`` creates (value: the compose file), so ``lab down`` finds it from anywhere."""
STATE = "io.chaoskit.state"
"""The chaoskit state folder of whoever made it: ``lab status``/``down`` list only their own labs by label."""

ROLE = "io.chaoskit.role"
"""The label every service of a lab carries (worker or spare): a compose file without it is not a lab."""

DEFAULT_COMPOSE = "docker-compose.yml"
READY_TIMEOUT_S = 60.0

_SERVICE_KEYS = {"image", "build", "init", "cap_add", "networks", "volumes", "labels", "hostname", "environment", "command", "entrypoint"}
_TOP_KEYS = {"name", "version", "services", "networks", "volumes"}
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_VAR_RE = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass
class Service:
    name: str
    image: str
    build: dict[str, Any] | None = None
    init: bool = False
    cap_add: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)
    binds: list[tuple[str, str, str]] = field(default_factory=list)
    """(host path or named volume, path in the container, mode)."""
    labels: dict[str, str] = field(default_factory=dict)
    hostname: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    command: list[str] | None = None
    entrypoint: list[str] | None = None


@dataclass
class ComposeProject:
    """One compose file as read once (:func:`load_compose`): everything a lab does with it is done with this."""

    path: Path
    """Where the file read really is (links resolved on the way to it, :func:`~chaoskit.core.trusted.open_checked`)."""
    name: str
    services: list[Service]
    networks: dict[str, dict[str, Any]]
    volumes: dict[str, dict[str, Any]]

    @property
    def directory(self) -> Path:
        return self.path.parent

    def shared_dir(self) -> Path | None:
        """The bind mount that has the same path on the host and in every node: the job's shared storage."""
        for svc in self.services:
            for source, target, _ in svc.binds:
                if source.startswith("/") and source == target:
                    return Path(source)
        return None


def private_bind(source: str) -> None:
    """The lab's shared storage (``/tmp/chaoskit-docker`` by default), which root writes through from every node:
    made by us or, when it exists, a real folder of ours that nobody else can write; then 0700, or as root 0710 with
    the lab accounts' group (:data:`~chaoskit.core.accounts.JOB_GROUP`), which the job's lab account passes through
    to its own folder there (issue 48), and no other user (set on the opened folder, no link followed)."""
    try:
        nodefs.ensure_dir(source)
        gid = job_group()
        fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if gid is not None:
                os.fchown(fd, os.geteuid(), gid)
            os.fchmod(fd, 0o710 if gid is not None else 0o700)
        finally:
            os.close(fd)
    except OSError as exc:
        raise InfraError(f"the docker lab's bind mount {source}: {exc}",
                         hint="remove it if it is not chaoskit's, or set CHAOSKIT_DOCKER_SHARED to a folder of your own") from None


def find_compose(start: Path | None = None) -> Path:
    """``docker-compose.yml`` in ``start`` (default: the working directory) or one of its parents."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        candidate = d / DEFAULT_COMPOSE
        if candidate.is_file():
            return candidate
    raise ScenarioError(
        f"no {DEFAULT_COMPOSE} in {here} or its parents",
        hint="run from chaoskit's repository, or pass --compose PATH (cluster: {kind: docker, compose: PATH} in a scenario)",
    )


def load_compose(path: str | Path, environ: dict[str, str] | None = None) -> ComposeProject:
    """Parse the subset of the Compose format a lab uses; an unsupported key is an error, not ignored.

    The file is opened once (:func:`~chaoskit.core.trusted.open_checked`) and parsed from what was read there,
    within the input limits (merge keys allowed as Compose allows them); the project's ``path`` is where that file
    really is, which the site policy's ``script_roots`` check judges: nothing reads the file by its name again.
    Every error is a :class:`ScenarioError` at its ``file:line:col``."""
    try:
        with open_checked(path, what="compose file") as checked:
            path = Path(checked.real)
            text = input_text(checked.read(MAX_FILE_BYTES + 1), str(path), "compose file")
    except FileNotFoundError:
        raise ScenarioError("no such compose file", pos=SourcePos(str(path), 1, 1)) from None
    except OSError as exc:  # UntrustedFile (not a regular file, a folder swapped for a link), EACCES, ELOOP
        reason = str(exc) if isinstance(exc, UntrustedFile) else exc.strerror
        raise ScenarioError(f"cannot read this compose file: {reason}", pos=SourcePos(str(path), 1, 1)) from None
    data, smap = load_yaml_text(text, str(path), merge=True)
    env = dict(os.environ if environ is None else environ)

    def error(message: str, *where: Any, key: bool = False) -> ScenarioError:
        return ScenarioError(f"{'.'.join(str(w) for w in where) + ': ' if where else ''}{message}", pos=smap.at(where, key=key))

    if not isinstance(data, dict):
        raise error("a compose file is a mapping (services:, networks:)")
    data = _interpolate(data, env, error)
    for key in data:
        if key not in _TOP_KEYS and not str(key).startswith("x-"):
            raise error(f"chaoskit's docker lab does not read {key!r} (it reads {', '.join(sorted(_TOP_KEYS))})", key, key=True)
    # Compose's order: COMPOSE_PROJECT_NAME, then name:, then the folder's name.
    name = str(env.get("COMPOSE_PROJECT_NAME") or data.get("name") or path.parent.name).lower()
    if not _NAME_RE.fullmatch(name):
        raise error(f"invalid project name {name[:80]!r}: lower-case letters, digits, - and _", "name")
    networks = _declared(data, "networks", error)
    volumes = _declared(data, "volumes", error)
    services_doc = data.get("services")
    if not isinstance(services_doc, dict) or not services_doc:
        raise error("services: at least one service (one per node)", "services")
    services = []
    for sname, doc in services_doc.items():
        where = ("services", sname)
        sname = str(sname)
        if not _NAME_RE.fullmatch(sname):
            raise error(f"invalid service name {sname[:80]!r}", *where, key=True)
        if not isinstance(doc, dict):
            raise error("a service is a mapping", *where)
        for key in doc:
            if key not in _SERVICE_KEYS:
                raise error(f"chaoskit's docker lab does not read {key!r} (it reads {', '.join(sorted(_SERVICE_KEYS))})",
                            *where, key, key=True)
        image = doc.get("image")
        if not image or not isinstance(image, str):
            raise error("image: the node image (e.g. chaoskit-node:latest)", *where)
        nets = doc.get("networks") or ["default"]
        nets = list(nets) if isinstance(nets, (list, dict)) else [nets]
        for n in nets:
            if not isinstance(n, str):
                raise error("a network is named by a string", *where, "networks")
            if n != "default" and n not in networks:
                raise error(f"network {n!r} is not declared under networks:", *where, "networks")
        binds = []
        vols = doc.get("volumes") or []
        if not isinstance(vols, list):
            raise error("a list of SOURCE:TARGET[:ro]", *where, "volumes")
        for i, v in enumerate(vols):
            if not isinstance(v, str):
                raise error("use the short syntax SOURCE:TARGET[:ro]", *where, "volumes", i)
            parts = v.split(":")
            if len(parts) not in (2, 3) or not parts[1].startswith("/"):
                raise error(f"volume {v!r}: SOURCE:TARGET[:ro] with an absolute TARGET", *where, "volumes", i)
            source = parts[0]
            if source.startswith("."):
                source = str((path.parent / source).resolve())
            elif not source.startswith("/") and source not in volumes:
                raise error(f"named volume {source!r} is not declared under volumes:", *where, "volumes", i)
            binds.append((source, parts[1], parts[2] if len(parts) == 3 else "rw"))
        build = doc.get("build")
        if isinstance(build, str):
            build = {"context": build}
        if build is not None and not isinstance(build, dict):
            raise error("build: a folder or {context:, dockerfile:}", *where, "build")
        cap_add = doc.get("cap_add") or []
        if not isinstance(cap_add, list) or not all(isinstance(c, str) for c in cap_add):
            raise error("cap_add: a list of capability names", *where, "cap_add")
        hostname = doc.get("hostname")
        if hostname is not None and not isinstance(hostname, str):
            raise error("hostname: a string", *where, "hostname")
        fields = {}
        for key, parse in (("labels", _mapping), ("environment", _mapping), ("command", _argv), ("entrypoint", _argv)):
            try:
                fields[key] = parse(doc.get(key))
            except ValueError as exc:
                raise error(str(exc), *where, key) from None
        services.append(Service(
            name=sname, image=image, build=build, init=bool(doc.get("init", False)),
            cap_add=list(cap_add), networks=[str(n) for n in nets], binds=binds, hostname=hostname, **fields,
        ))
    unmarked = [s.name for s in services if ROLE not in s.labels]
    if unmarked:
        # The opt-in that keeps chaoskit off compose files that are not its labs: `lab down` or a
        # run never touches a project whose services do not say they are lab nodes.
        raise error(
            f"{', '.join(unmarked)}: no {ROLE} label, so this is not a chaoskit lab and chaoskit will not act on it",
            "services", unmarked[0], "labels",
        )
    if any("default" in s.networks for s in services):
        networks.setdefault("default", {})
    return ComposeProject(path, name, services, networks, volumes)


def _declared(data: dict[str, Any], section: str, error) -> dict[str, dict[str, Any]]:
    """Top-level ``networks:`` or ``volumes:``: names, each with a mapping of options or nothing."""
    doc = data.get(section) or {}
    if not isinstance(doc, dict):
        raise error(f"{section}: a mapping of names", section)
    out = {}
    for k, v in doc.items():
        if v is not None and not isinstance(v, dict):
            raise error("a mapping of options, or nothing", section, k)
        out[str(k)] = dict(v or {})
    return out


def _interpolate(value: Any, env: dict[str, str], error) -> Any:
    """Compose's ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``$VAR`` and ``$$``."""
    if isinstance(value, dict):
        return {k: _interpolate(v, env, error) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env, error) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        var = m.group(1) or m.group(4)
        op, default = m.group(2), m.group(3) or ""
        got = env.get(var)
        if op == ":-":
            return got if got else default
        if op == "-":
            return default if got is None else got
        return got or ""

    return _VAR_RE.sub(sub, value)


def _mapping(value: Any) -> dict[str, str]:
    """``{K: V}`` or ``[K=V, ...]``; ``ValueError`` for anything else."""
    if value is None:
        return {}
    if isinstance(value, dict):
        if any(isinstance(v, (dict, list)) for v in value.values()):
            raise ValueError("a mapping of names to plain values")
        return {str(k): "" if v is None else str(v) for k, v in value.items()}
    if not isinstance(value, list) or any(isinstance(item, (dict, list)) for item in value):
        raise ValueError("a mapping, or a list of KEY=VALUE")
    return dict(str(item).split("=", 1) if "=" in str(item) else (str(item), "") for item in value)


def _argv(value: Any) -> list[str] | None:
    """A command as a list or one string (split as a shell would, without running one); ``ValueError`` otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot split the command: {exc}") from None
    if not isinstance(value, list) or any(isinstance(v, (dict, list)) for v in value):
        raise ValueError("a command is a list of arguments or one string")
    return [str(v) for v in value]


class DockerLab:
    """A compose project's containers, as the engine reports them."""

    def __init__(self, project: ComposeProject, client: Any) -> None:
        self.project, self.client = project, client

    # -- finding -----------------------------------------------------------------------

    @classmethod
    def load(cls, compose: str | Path | None = None, *, project: ComposeProject | None = None) -> "DockerLab | None":
        """The lab of ``project`` (else of ``compose``, default: the nearest docker-compose.yml) when its containers
        exist."""
        project = project or load_compose(compose or find_compose())
        lab = cls(project, docker_client())
        return lab if lab.containers() else None

    @classmethod
    def find(cls, compose: str | Path | None = None) -> list["DockerLab"]:
        """The docker labs to show or remove: ``compose``'s project (default: the nearest
        docker-compose.yml) when its containers exist, whoever made them; without ``compose``,
        also every project ``chaoskit lab up`` made with this state folder (found by label)."""
        client = docker_client(timeout=10)
        labs: dict[str, DockerLab] = {}
        if compose is not None:
            project = load_compose(compose)
        else:
            try:  # the nearest compose file, if it is a chaoskit lab (another project's file is never touched)
                project = load_compose(find_compose())
            except ScenarioError:
                project = None
        if project is not None:
            lab = cls(project, client)
            if lab.containers():
                labs[project.name] = lab
        if compose is None:
            for c in client.containers.list(all=True, filters={"label": [MADE_BY, f"{STATE}={state_dir()}"]}):
                name, path = c.labels.get(PROJECT), c.labels.get(MADE_BY, "")
                if not name or name in labs:
                    continue
                try:  # the file under the name it was brought up with (COMPOSE_PROJECT_NAME may differ now)
                    made = load_compose(path, environ={**os.environ, "COMPOSE_PROJECT_NAME": name})
                except ScenarioError:  # the file moved or went: its project name is enough to remove the lab
                    made = ComposeProject(Path(path), name, [], {}, {})
                labs[name] = cls(made, client)
        return list(labs.values())

    @property
    def lab_id(self) -> str:
        return f"docker-{self.project.name}"

    def containers(self) -> dict[str, Any]:
        """The project's node containers by service name (running or not)."""
        found = self.client.containers.list(all=True, filters={"label": [f"{PROJECT}={self.project.name}", ROLE]})
        out = {}
        for c in found:
            service = c.labels.get(SERVICE)
            if service and c.labels.get(ONEOFF, "False") != "True":
                out[service] = c
        return {s.name: out[s.name] for s in self.project.services if s.name in out}

    def node_names(self) -> list[str]:
        return [s.name for s in self.project.services]

    def container_name(self, service: str) -> str:
        return f"{self.project.name}-{service}-1"

    # -- up ------------------------------------------------------------------------------

    @classmethod
    def up(cls, compose: str | Path | None = None, *, project: ComposeProject | None = None, build: bool = False,
           say=lambda msg: None) -> "DockerLab":
        """Create the project's networks, volumes and containers and start them (what ``docker compose up -d`` does)."""
        project = project or load_compose(compose or find_compose())
        lab = cls(project, docker_client())
        if lab.containers():
            raise InfraError(
                f"docker lab {project.name!r} is already up ({', '.join(lab.containers())})",
                hint="use it as it is, or 'chaoskit lab down' first",
            )
        try:
            lab._ensure_images(build, say)
            lab._create(say)
            lab.guard()
            lab.wait_ready()
        except BaseException:
            lab.down()
            raise
        return lab

    def _ensure_images(self, build: bool, say) -> None:
        import docker.errors

        for svc in {s.image: s for s in self.project.services}.values():
            try:
                self.client.images.get(svc.image)
                if not build:
                    continue
            except docker.errors.ImageNotFound:
                pass
            if svc.build is None:
                raise InfraError(f"image {svc.image} is not on this engine and service {svc.name} has no build:",
                                 hint=f"docker pull {svc.image}, or add build: to the service")
            context = (self.project.directory / svc.build.get("context", ".")).resolve()
            dockerfile = svc.build.get("dockerfile", "Dockerfile")
            say(f"building {svc.image} from {context / dockerfile} (the first build takes a few minutes)")
            try:
                self.client.images.build(path=str(context), dockerfile=dockerfile, tag=svc.image, rm=True,
                                         buildargs={k: str(v) for k, v in (svc.build.get("args") or {}).items()},
                                         labels={MADE_BY: str(self.project.path)})
            except (docker.errors.BuildError, docker.errors.APIError) as exc:
                raise InfraError(
                    f"building {svc.image} failed: {str(exc).strip().splitlines()[-1][:300]}",
                    hint="without Docker Hub or PyPI, build it with docker/build-offline.sh (a debootstrap base, local wheels)",
                ) from None

    def _labels(self, **extra: str) -> dict[str, str]:
        return {PROJECT: self.project.name, CONFIG_FILES: str(self.project.path), WORKING_DIR: str(self.project.directory),
                MADE_BY: str(self.project.path), STATE: str(state_dir()), **extra}

    def _create(self, say) -> None:
        import docker.types

        p = self.project
        for name, spec in p.networks.items():
            labels = {**self._labels(**{NETWORK: name}), **_mapping(spec.get("labels"))}
            self.client.networks.create(f"{p.name}_{name}", driver=spec.get("driver", "bridge"), labels=labels)
        for name, spec in p.volumes.items():
            labels = {**self._labels(**{VOLUME: name}), **_mapping(spec.get("labels"))}
            self.client.volumes.create(f"{p.name}_{name}", labels=labels)
        shared = p.shared_dir()
        if shared is not None:
            private_bind(str(shared))
        for svc in p.services:
            mounts = []
            for source, target, mode in svc.binds:
                is_bind = source.startswith("/")
                if is_bind and Path(source) != shared:
                    Path(source).mkdir(parents=True, exist_ok=True)
                mounts.append(docker.types.Mount(target, source if is_bind else f"{p.name}_{source}",
                                                 type="bind" if is_bind else "volume", read_only=mode == "ro"))
            first, *others = svc.networks
            container = self.client.containers.create(
                svc.image, name=self.container_name(svc.name), hostname=svc.hostname or svc.name,
                labels={**self._labels(**{SERVICE: svc.name, NUMBER: "1", ONEOFF: "False"}), **svc.labels},
                cap_add=svc.cap_add or None, init=svc.init or None, mounts=mounts, environment=svc.environment,
                command=svc.command, entrypoint=svc.entrypoint, detach=True,
                network=f"{p.name}_{first}",
                networking_config={f"{p.name}_{first}": self.client.api.create_endpoint_config(aliases=[svc.name])},
            )
            for net in others:
                self.client.networks.get(f"{p.name}_{net}").connect(container, aliases=[svc.name])
            container.start()
            say(f"{svc.name}: container {container.name} started")

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Every node's container runs and answers a docker exec."""
        end = time.monotonic() + timeout
        for name, transport in ((n.name, n.conn) for n in self.inventory().nodes):
            while True:
                try:
                    transport.ping(timeout=5.0)
                    break
                except InfraError as exc:
                    transport.close()
                    if time.monotonic() > end:
                        raise InfraError(f"docker lab node {name} is not ready after {timeout:g}s: {exc}") from None
                    time.sleep(0.2)
            transport.close()

    # -- using ---------------------------------------------------------------------------

    def address(self, service: str) -> str:
        """The node's IP address on its first network."""
        c = self.containers().get(service)
        if c is None:
            raise InfraError(f"docker lab node {service} has no container")
        c.reload()
        nets = c.attrs["NetworkSettings"]["Networks"]
        svc = next(s for s in self.project.services if s.name == service)
        net = nets.get(f"{self.project.name}_{svc.networks[0]}") or next(iter(nets.values()), None)
        if not net or not net.get("IPAddress"):
            raise InfraError(f"docker lab node {service} has no address (is it running?)")
        return net["IPAddress"]

    def device(self, service: str, address: str) -> str:
        """The name of the NIC that holds ``address`` in the node (eth0 at first; the engine names a
        reconnected NIC anew, so it is looked up, not assumed)."""
        return devices_by_address(self.containers()[service]).get(address, "eth0")

    def scope(self, node: str) -> str:
        return f"{self.project.name}.{node}"

    def inventory(self, python: str = "/opt/chaoskit/bin/python"):
        """Nodes with docker transports (connected on first use), ``data`` NICs and kill/start power."""
        containers = self.containers()
        nodes = []
        for i, svc in enumerate(self.project.services):
            c = containers.get(svc.name)
            if c is None:
                continue
            labels = {k.removeprefix("io.chaoskit."): v for k, v in svc.labels.items() if k.startswith("io.chaoskit.")}
            labels.setdefault("lab", "docker")
            try:
                address = self.address(svc.name)
                interfaces = {"data": InterfaceSpec(name=self.device(svc.name, address), address=address)}
            except InfraError:  # powered off: no address until it starts again
                interfaces = {"data": InterfaceSpec(name="eth0")}
            nodes.append(Node(
                name=svc.name, address=c.name, transport="docker", labels=labels,
                conn=DockerTransport(svc.name, c.name, python=python, scope_token=self.scope(svc.name)),
                interfaces=interfaces,
                power=PowerCommands(off=power_argv(c.name, "off"), on=power_argv(c.name, "on"), status=power_argv(c.name, "status")),
            ))
        return Inventory(self.lab_id, nodes)

    def status(self) -> dict[str, Any]:
        containers = self.containers()
        return {
            "kind": "docker", "id": self.lab_id, "compose": str(self.project.path),
            "shared": str(self.project.shared_dir() or ""),
            "nodes": [
                {"name": s, "container": c.name, "state": c.status, "image": c.attrs.get("Config", {}).get("Image", "")}
                for s, c in containers.items()
            ],
        }

    # -- down ----------------------------------------------------------------------------

    @property
    def guard_table(self) -> str:
        return guard_table(f"docker_{self.project.name}")

    def guard(self) -> None:
        """Keep this machine's other users out of the lab's networks (the job's stores listen there; docker's
        bridges are reachable from the host): :mod:`chaoskit.lab.guard`."""
        subnets = []
        for net in self.client.networks.list(filters={"label": [f"{PROJECT}={self.project.name}"]}):
            for cfg in (net.attrs.get("IPAM") or {}).get("Config") or []:
                if cfg.get("Subnet"):
                    subnets.append(cfg["Subnet"])
        guard(self.guard_table, subnets)

    def down(self) -> dict[str, list[str]]:
        """Remove the project's containers, networks and volumes (whoever made them). Safe to run twice."""
        import docker.errors

        unguard(self.guard_table)
        removed: dict[str, list[str]] = {"containers": [], "networks": [], "volumes": []}
        label = {"label": [f"{PROJECT}={self.project.name}"]}
        # Only lab nodes (a project of the same name that is not a lab keeps its containers); a
        # network or volume still in use by such a container is refused by the engine and kept.
        for c in self.client.containers.list(all=True, filters={"label": [*label["label"], ROLE]}):
            try:
                c.remove(force=True, v=True)
                removed["containers"].append(c.name)
            except docker.errors.NotFound:
                pass
        # 403 (network) and 409 (volume): other containers still use it.
        for kind, items, in_use in (("networks", self.client.networks.list(filters=label), 403),
                                    ("volumes", self.client.volumes.list(filters=label), 409)):
            for item in items:
                try:
                    item.remove()
                    removed[kind].append(item.name)
                except docker.errors.NotFound:
                    pass
                except docker.errors.APIError as exc:
                    if exc.status_code != in_use:
                        raise
        return removed
