"""A real Prometheus and a real Pushgateway (Debian's ``prometheus`` and ``prometheus-pushgateway``) on loopback.

Each is started by the test session on a free port of 127.0.0.1, with its data in a temp folder; Prometheus
scrapes the Pushgateway every :data:`SCRAPE_S` (``honor_labels``, as a Pushgateway is scraped), and both are
stopped at the end. Debian's own services of the same packages are stopped in CI (they would listen on 9090 and
9091 and run for the rest of the machine's life); elsewhere they are left alone.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import IN_CI, need

SCRAPE_S = 1.0


@dataclass
class Monitoring:
    prometheus: str
    """http://127.0.0.1:PORT of Prometheus."""
    pushgateway: str

    def query(self, promql: str) -> list[dict]:
        """The instant vector ``promql`` evaluates to now (the raw ``result`` list)."""
        url = f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read())["data"]["result"]

    def wait_value(self, promql: str, predicate, timeout: float = 30.0) -> tuple[float, float]:
        """Poll until ``promql`` has one sample whose value meets ``predicate``: (the value, when it was first seen)."""
        end = time.time() + timeout
        last = None
        while time.time() < end:
            last = self.query(promql)
            if len(last) == 1 and predicate(float(last[0]["value"][1])):
                return float(last[0]["value"][1]), time.time()
            time.sleep(0.05)
        raise AssertionError(f"{promql}: {last} after {timeout}s")

    def push(self, job: str, text: str) -> float:
        """PUT ``text`` (Prometheus text format) into the group ``job``; the time just after the gateway took it."""
        req = urllib.request.Request(f"{self.pushgateway}/metrics/job/{job}", data=text.encode(), method="PUT",
                                     headers={"Content-Type": "text/plain; version=0.0.4"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status in (200, 202)
        return time.time()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout}s: {log.read_text()[-2000:]}")


def _stop_debian_services() -> None:
    """In CI only: Debian's packages may have started their own services on install."""
    if not IN_CI:
        return
    for service in ("prometheus", "prometheus-pushgateway"):
        script = Path("/etc/init.d") / service
        if script.exists():
            subprocess.run([str(script), "stop"], capture_output=True, timeout=30)


def _start(argv: list[str], log: Path, ready: str) -> subprocess.Popen:
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        _wait_ready(ready, proc, log)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


@pytest.fixture(scope="session")
def monitoring(tmp_path_factory: pytest.TempPathFactory):
    """A Prometheus scraping a Pushgateway, both on loopback, for the session."""
    for tool in ("prometheus", "prometheus-pushgateway", "promtool"):
        need(shutil.which(tool) is not None, f"{tool} (apt-get install prometheus prometheus-pushgateway)")
    _stop_debian_services()
    base = tmp_path_factory.mktemp("monitoring")
    procs: list[subprocess.Popen] = []
    try:
        pg_port = _free_port()
        pg = f"http://127.0.0.1:{pg_port}"
        procs.append(_start(["prometheus-pushgateway", f"--web.listen-address=127.0.0.1:{pg_port}"],
                            base / "pushgateway.log", f"{pg}/-/ready"))
        config = base / "prometheus.yml"
        config.write_text(
            f"global: {{scrape_interval: {SCRAPE_S:g}s, evaluation_interval: {SCRAPE_S:g}s}}\n"
            "scrape_configs:\n"
            f"  - job_name: pushgateway\n    honor_labels: true\n    static_configs: [{{targets: ['127.0.0.1:{pg_port}']}}]\n")
        prom_port = _free_port()
        prom = f"http://127.0.0.1:{prom_port}"
        procs.append(_start(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={base / 'data'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}", "--storage.tsdb.retention.time=1h"],
                            base / "prometheus.log", f"{prom}/-/ready"))
        yield Monitoring(prom, pg)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
