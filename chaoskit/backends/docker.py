"""``kind: docker``: each node a container of ``docker-compose.yml``, reached through the engine.

See :mod:`chaoskit.lab.docker`. The job is started in the containers with
``docker exec``; its checkpoints and SDK events go to the folder every node
mounts at the same path as the host.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr

from chaoskit.backends.api import (
    ClusterBackend,
    ClusterHandle,
    ClusterSpec,
    LabStatus,
    Say,
    teardown_of,
)
from chaoskit.cluster.inventory import InterfaceSpec, Inventory, Node, PowerCommands
from chaoskit.cluster.transports.docker import (
    DockerTransport,
    docker_client,
    power_argv,
)
from chaoskit.cluster.transports.ssh_many import connect_all
from chaoskit.core.accounts import Account, claim_lab_account, job_group
from chaoskit.core.errors import InfraError, ScenarioError
from chaoskit.lab.docker import ComposeProject, DockerLab, find_compose, load_compose

__all__ = ["DockerBackend", "DockerSpec", "project_of"]

NODE_PYTHON = "/opt/chaoskit/bin/python"
"""The node image's Python (docker/Dockerfile), which runs torchrun and chaoskit's agent."""


class DockerSpec(ClusterSpec):
    """The services of a compose file as nodes, each a container reached through the docker engine."""

    kind: Literal["docker"] = Field(..., description=(
        "docker: each node is a container of docker-compose.yml, reached through the docker engine "
        "(needs a docker engine, the node image and pip install 'chaoskit[docker]')."))
    spare: int = Field(0, ge=0, le=16, description="Idle nodes whose torchrun agents wait to take over.")
    compose: str | None = Field(None, description=(
        "The compose file whose services are the nodes, relative to the scenario file "
        "(default: the nearest docker-compose.yml in the scenario's folder or a parent)."))
    _project: ComposeProject | None = PrivateAttr(None)
    """The compose file as read once for this spec (:func:`project_of`): the checks judge it and the run uses it."""


class DockerBackend(ClusterBackend):
    name = "docker"
    Spec = DockerSpec
    summary = "the services of docker-compose.yml as containers (a docker engine)"
    builds_images = True

    def preview(self, spec: DockerSpec, base: Path) -> ClusterHandle:
        project = project_of(spec, base)
        services = project.services
        if spec.nodes + spec.spare > len(services):
            raise ScenarioError(
                f"cluster: {spec.nodes} nodes + {spec.spare} spare, but {project.path} has {len(services)} services",
                hint="add services to the compose file, or ask for fewer nodes",
            )
        nodes = []
        for s in services[: spec.nodes + spec.spare]:
            container = f"{project.name}-{s.name}-1"
            labels = {k.removeprefix("io.chaoskit."): v for k, v in s.labels.items() if k.startswith("io.chaoskit.")}
            nodes.append(Node(
                s.name, address=container, transport="docker", labels={**labels, "lab": "docker"},
                # not connected: a dry run only asks it which container it is
                conn=DockerTransport(s.name, container, python=NODE_PYTHON, scope_token=f"{project.name}.{s.name}"),
                interfaces={"data": InterfaceSpec(name="eth0")},
                power=PowerCommands(**{a: power_argv(container, a) for a in ("off", "on", "status")}),
            ))
        names = [n.name for n in nodes]
        return ClusterHandle(
            id=f"(docker lab {project.name})", kind=self.name, inventory=Inventory(f"docker-{project.name}", nodes),
            job_nodes=names[: spec.nodes], rdzv_host=f"<address of {names[0]}>",
            scope=lambda node: f"{project.name}.{node}",
            agent_args=lambda node: ["--local-addr", f"<address of {node}>"],
            python=NODE_PYTHON, shared_dir=project.shared_dir(),
            launch_wrap=lambda node, argv, env, cwd: ["docker", "exec", "-i", "-w", str(cwd), f"{project.name}-{node}-1", *argv],
            author_files={"compose": Path(project.path)},
        )

    def open(self, spec: DockerSpec, base: Path) -> ClusterHandle:
        """The compose project's containers: the ones already up, or brought up for this run and removed after it.
        The project is the one :meth:`preview` read for ``spec`` (and the checks judged), never the file read again."""
        project = project_of(spec, base)
        lab = DockerLab.load(project=project)
        ephemeral = lab is None
        if ephemeral:
            lab = DockerLab.up(project=project)
        claim = None
        try:
            claim = claim_lab_account()  # the job runs as a lab account of the run's own in the containers
            handle = self._handle(spec, lab, ephemeral)
        except BaseException:
            if claim is not None:
                claim.release()
            if ephemeral:
                lab.down()
            raise
        if claim is not None:
            close = handle.teardown

            def teardown() -> None:
                try:
                    close()
                finally:
                    claim.release()

            handle.teardown = teardown
            handle.job_account = claim.account
            handle.account_reaches = lambda account: (_no_ptrace(lab, handle.job_nodes)
                                                      or _shared_closed_to(account, Path(handle.shared_dir or "/")))
        return handle

    def _handle(self, spec: DockerSpec, lab: DockerLab, ephemeral: bool) -> ClusterHandle:
        shared = lab.project.shared_dir()
        if shared is None:
            raise InfraError(
                f"{lab.project.path}: no node mounts a host folder at the same path (HOST:HOST), so chaoskit could not "
                "read the job's events",
                hint="keep the shared volume of chaoskit's docker-compose.yml",
            )
        if shutil.which("docker") is None:
            raise InfraError("the docker lab starts the job with the docker CLI, which is not installed",
                             hint="apt-get install docker.io (or docker-ce-cli)")
        inventory = lab.inventory(python=NODE_PYTHON)
        names = inventory.names()
        missing = [s.name for s in lab.project.services[: spec.nodes + spec.spare] if s.name not in names]
        if missing:
            raise InfraError(f"docker lab {lab.project.name}: no container for {', '.join(missing)}",
                             hint="'chaoskit lab down' then 'chaoskit lab up --kind docker'")
        used = names[: spec.nodes + spec.spare]
        inventory = Inventory(inventory.name, [inventory[n] for n in used])
        containers = {n.name: n.address for n in inventory.nodes}
        addresses = {n.name: n.interfaces["data"].address for n in inventory.nodes}
        running = lab.containers()
        for node in used:
            if running[node].status != "running":
                raise InfraError(f"docker lab node {node} ({containers[node]}) is not running",
                                 hint="'chaoskit lab down' then 'chaoskit lab up --kind docker'")

        def wrap(node: str, argv: list[str], env: dict[str, str], cwd: Path) -> list[str]:
            flags = [f for k, v in sorted(env.items()) for f in ("-e", f"{k}={v}")]
            account = handle.job_account  # the lab account (by number: the image knows no such user), group chaoskit-jobs
            user = ["--user", f"{account.uid}:{job_group()}"] if account is not None else []
            return ["docker", "exec", "-i", *user, "-w", str(cwd), *flags, containers[node], *argv]

        handle = ClusterHandle(
            id=lab.lab_id, kind=self.name, inventory=inventory, job_nodes=used[: spec.nodes],
            rdzv_host=addresses[used[0]], scope=lab.scope,
            # No GLOO_SOCKET_IFNAME: gloo takes the address of the node's host name (the engine writes it
            # into /etc/hosts), which survives a disconnect and reconnect; the NIC's name does not.
            agent_args=lambda node: ["--local-addr", addresses[node]],
            connect=lambda: connect_all([n.conn for n in inventory.nodes]),
            teardown=teardown_of(inventory, lab.down if ephemeral else None),
            details={"compose": str(lab.project.path), "project": lab.project.name, "shared": str(shared), "ephemeral": ephemeral},
            python=NODE_PYTHON, launch_wrap=wrap, shared_dir=shared,
            job_transport=lambda node: inventory[node].conn,
        )
        return handle

    def lab_up(self, spec: DockerSpec, base: Path, say: Say, rebuild: bool = False) -> str:
        if spec.model_fields_set & {"nodes", "spare"}:
            raise ScenarioError("--nodes and --spare do not apply to --kind docker: the compose file's services are the nodes",
                                hint="add or remove services in docker-compose.yml; a scenario picks how many it uses")
        project = load_compose(compose_file(spec, base) if spec.compose else find_compose())
        existing = DockerLab.load(project=project)
        if existing is not None:
            return (f"docker lab {existing.project.name} is already up ({', '.join(existing.containers())}); "
                    "'chaoskit lab down' first")
        t0 = time.time()
        lab = DockerLab.up(project=project, build=rebuild, say=lambda msg: say(f"  {msg}"))
        return (f"docker lab {lab.project.name} up in {time.time() - t0:.1f}s: {', '.join(lab.containers())} "
                f"(from {lab.project.path})")

    def reuse_key(self, spec: DockerSpec, base: Path) -> str | None:
        """A docker lab is its compose project, whatever number of its services a scenario uses."""
        return f"docker:{compose_file(spec, base).resolve()}"

    def reuse_spec(self, spec: DockerSpec, base: Path) -> DockerSpec:
        return DockerSpec(kind="docker", compose=str(compose_file(spec, base).resolve()))

    def lab_down(self, compose: Path | None = None) -> list[str]:
        out = []
        for lab in _labs(compose):
            removed = lab.down()
            out.append(f"docker lab {lab.project.name} down: removed " + "; ".join(
                f"{len(v)} {k} ({', '.join(v)})" if v else f"0 {k}" for k, v in removed.items()))
        return out

    def lab_status(self) -> list[LabStatus]:
        out = []
        for lab in _labs():
            st = lab.status()
            nodes = [{**n, "detail": f"{n['container']} {n['state']} ({n['image']})"} for n in st["nodes"]]
            out.append(LabStatus(self.name, st["id"], f"docker lab {lab.project.name}: {st['compose'] or '(compose file unknown)'}",
                                 nodes, {"compose": st["compose"], "shared": st["shared"]}))
        return out

    def rollback_inventory(self, details: dict[str, Any], nodes: list[str]) -> Inventory:
        return _run_lab(details).inventory(python=NODE_PYTHON)

    def crash_teardown(self, details: dict[str, Any]) -> str | None:
        if not details.get("ephemeral") or not details.get("compose"):
            return None
        lab = _run_lab(details)
        if not lab.containers():
            return None
        removed = lab.down()
        return f"docker lab {lab.project.name} removed: {', '.join(removed['containers']) or 'no containers'}"


def compose_file(spec: DockerSpec, base: Path) -> Path:
    """The compose file of a spec: ``compose:`` relative to ``base``, else the nearest one from ``base`` up."""
    if spec.compose:
        path = Path(spec.compose)
        return path if path.is_absolute() else base / path
    return find_compose(base)


def project_of(spec: DockerSpec, base: Path) -> ComposeProject:
    """The compose project of ``spec``: its file read once (:func:`~chaoskit.lab.docker.load_compose`), then the
    same object for the preview, the checks and the run."""
    if spec._project is None:
        spec._project = load_compose(compose_file(spec, base))
    return spec._project


def _labs(compose: Path | None = None) -> list[DockerLab]:
    """Docker labs on the engine: projects chaoskit made (by label) and the compose file's project.

    No docker SDK or no engine means no docker lab, unless ``compose`` asked for one."""
    if compose is None and importlib.util.find_spec("docker") is None:
        return []
    try:
        return DockerLab.find(compose)
    except (InfraError, ScenarioError):
        if compose is not None:
            raise
        return []


def _run_lab(details: dict[str, Any]) -> DockerLab:
    """The docker lab a run used: its compose file under the project name it ran with."""
    environ = {**os.environ, **({"COMPOSE_PROJECT_NAME": details["project"]} if details.get("project") else {})}
    return DockerLab(load_compose(details["compose"], environ=environ), docker_client())


def _no_ptrace(lab: DockerLab, nodes: list[str]) -> str | None:
    """Why chaoskit's agent (root in the container) could not see a job that runs as another user, or ``None``: it
    reads the job's processes' environment (their scope), which takes ``SYS_PTRACE`` (the compose file's
    ``cap_add``; chaoskit's docker-compose.yml adds it)."""
    lacking = [s.name for s in lab.project.services if s.name in nodes and "SYS_PTRACE" not in s.cap_add]
    if lacking:
        return (f"the compose file's services {', '.join(lacking)} do not add SYS_PTRACE (cap_add), which chaoskit's "
                "agent needs to see a job that does not run as root")
    return None


def _shared_closed_to(account: Account, shared: Path) -> str | None:
    """Why ``account`` (run with the group chaoskit-jobs) cannot make its way into the shared folder, as the containers
    see it (mounted at the same path, above it the image's own folders), or ``None``: the job's folder is made in it."""
    try:
        st = os.stat(shared)
    except OSError as exc:
        return f"{shared}: {exc.strerror}"
    gid = job_group()
    need = stat.S_IXUSR if st.st_uid == account.uid else stat.S_IXGRP if st.st_gid == gid else stat.S_IXOTH
    if not st.st_mode & need:
        return f"the shared folder {shared} (mode {stat.S_IMODE(st.st_mode):04o}) is closed to {account.name}"
    return None
