"""Fixtures that bring up the repository's docker-compose.yml on a real docker engine.

Load them with ``pytest_plugins = ["tests.docker_fixtures"]``. The lab is the very
file users run, under a project name of its own (COMPOSE_PROJECT_NAME) and a
private shared folder, so it never touches a user's ``chaoskit`` project. Outside
CI a missing engine, SDK or image skips with what to install; with ``CI`` set it
fails (.ci/run installs docker.io, starts dockerd and builds the image).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import wait_until, lab_fixture

REPO = Path(__file__).resolve().parent.parent
COMPOSE = REPO / "docker-compose.yml"
IMAGE = "chaoskit-node:latest"


def docker_problem() -> str | None:
    """Why the docker lab cannot run here, or ``None``."""
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed (pip install 'chaoskit[docker]')"
    if shutil.which("docker") is None:
        return "the docker CLI is not installed (apt-get install docker.io)"
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:  # noqa: BLE001
        return f"no docker engine answers ({type(exc).__name__}): apt-get install docker.io and start dockerd"
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        return f"the lab image {IMAGE} is not built: run docker/build-offline.sh (or docker compose build)"
    return None


def require_docker() -> None:
    """Skip (outside CI) or fail (in CI) without an engine, the SDK, the CLI or the image."""
    from tests.conftest import need

    problem = docker_problem()
    need(problem is None, problem or "")


def project_env(tmp: Path, tag: str) -> dict[str, str]:
    return {"COMPOSE_PROJECT_NAME": f"cktest{tag}{os.getpid() % 100000}", "CHAOSKIT_DOCKER_SHARED": str(tmp)}


def leftovers(project: str) -> dict[str, list[str]]:
    """What the engine still holds of ``project``, by ``docker ps -a``, ``network ls`` and ``volume ls``."""
    label = f"label=com.docker.compose.project={project}"
    out = {}
    for what, argv in (("containers", ["docker", "ps", "-a", "--filter", label, "--format", "{{.Names}}"]),
                       ("networks", ["docker", "network", "ls", "--filter", label, "--format", "{{.Name}}"]),
                       ("volumes", ["docker", "volume", "ls", "--filter", label, "--format", "{{.Name}}"])):
        res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, res.stderr
        out[what] = res.stdout.split()
    return out


@lab_fixture(scope="session")
def docker_lab(tmp_path_factory):
    """The repository's docker-compose.yml, up for the whole session under a test project name."""
    require_docker()
    from chaoskit.lab.docker import DockerLab, load_compose

    env = project_env(tmp_path_factory.mktemp("docker-shared"), "s")
    # The project name and shared folder apply to this lab only: the environment is not changed,
    # so other tests' `chaoskit lab status` never see it.
    lab = DockerLab.up(project=load_compose(COMPOSE, environ={**os.environ, **env}))
    try:
        yield lab
    finally:
        lab.down()


@pytest.fixture
def docker_inventory(docker_lab):
    from tests.conftest import connected

    with connected(docker_lab.inventory()) as inventory:
        yield inventory


@pytest.fixture
def docker_ctx(docker_inventory, tmp_path):
    """A RunContext over the docker lab (journal + leases with a short TTL)."""
    from tests.conftest import fault_context

    with fault_context(docker_inventory, tmp_path) as ctx:
        yield ctx


def node_clean(lab, node: str) -> str | None:
    """What a fault left on a lab node (container stopped or disconnected, NIC down, qdisc, nft table), or ``None``."""
    c = lab.containers().get(node)
    if c is None or c.status != "running":
        return f"{node}: container not running"
    try:
        address = lab.address(node)
    except Exception as exc:  # noqa: BLE001 - no address: disconnected
        return f"{node}: {exc}"
    dev = lab.device(node, address)
    code, out = c.exec_run(["ip", "-o", "link", "show", "dev", dev])
    text = out.decode(errors="replace")
    if code != 0 or ",UP" not in text:
        return f"{node}: {dev} not up: {text.strip()}"
    code, out = c.exec_run(["tc", "qdisc", "show", "dev", dev])
    if "c4a0:" in out.decode(errors="replace"):
        return f"{node}: chaoskit qdisc left: {out.decode().strip()}"
    code, out = c.exec_run(["nft", "list", "tables"])
    if "chaoskit" in out.decode(errors="replace"):
        return f"{node}: nft table left: {out.decode().strip()}"
    return None


@pytest.fixture
def clean_docker_lab(docker_lab):
    yield docker_lab
    for node in docker_lab.node_names():
        assert wait_until(lambda: node_clean(docker_lab, node) is None, 10), node_clean(docker_lab, node)
