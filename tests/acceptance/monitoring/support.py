"""Processes, ports and waits shared by the monitoring acceptance tests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[3]
WAIT_S = 30.0
#: One scrape: ``{(sample name, sorted labels): value}``.
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Processes:
    """Processes this test started; each in its own session so a leftover child can be killed by group."""

    logs: Path
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, name: str, args: list[str], env: dict[str, str], **kwargs: object) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            args, env=env, cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kwargs
        )
        log.close()
        self.started.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:  # children of a process we started (dramatiq worker processes, gunicorn workers)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout)

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            self.stop(proc)

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], object], what: str, timeout: float = WAIT_S) -> object:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def parse_samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def scrape(url: str, headers: dict[str, str] | None = None) -> Samples:
    """GET a metrics endpoint and parse it."""
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return parse_samples(resp.read().decode())


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of *name*'s samples whose labels include *labels*."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


@dataclass
class Prometheus:
    """A Prometheus server this test started, queried through its HTTP API."""

    url: str

    def api(self, path: str, **params: str) -> dict:
        """The ``data`` of a successful answer of Prometheus's HTTP API."""
        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=10) as resp:
            data = json.load(resp)
        assert data["status"] == "success", data
        return data["data"]

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        data = self.api("/api/v1/query", query=expr)
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def alerts(self) -> dict[str, set[str]]:
        """Active alerts by state: ``{"firing": {alertname…}, "pending": {…}}``."""
        out: dict[str, set[str]] = {"firing": set(), "pending": set()}
        for alert in self.api("/api/v1/alerts")["alerts"]:
            out[alert["state"]].add(alert["labels"]["alertname"])
        return out

    def rule_evaluations(self) -> tuple[str, ...]:
        """When Prometheus last evaluated each rule group, asserting that every rule it loaded is healthy."""
        groups = self.api("/api/v1/rules")["groups"]
        assert groups and all(r["health"] == "ok" for g in groups for r in g["rules"]), groups
        return tuple(g["lastEvaluation"] for g in groups)

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        assert len(result) <= 1, result
        return result[0][1] if result else None

    def wait_value(self, expr: str, check: Callable[[float], bool], what: str = "", timeout: float = WAIT_S) -> float:
        """Poll Prometheus until *expr* has one value that passes *check*; that value."""
        last: list[float | None] = [None]

        def ok() -> bool:
            last[0] = self.value(expr)
            return last[0] is not None and check(last[0])

        try:
            wait_for(ok, what or expr, timeout)
        except AssertionError:
            raise AssertionError(f"timed out waiting for {what or expr}; last value {last[0]}") from None
        assert last[0] is not None
        return last[0]


def start_prometheus(
    procs: Processes,
    tmp: Path,
    scrape_configs: list[dict[str, object]],
    *,
    rule_files: Sequence[Path] = (),
    extra_files: dict[str, str] | None = None,
) -> Prometheus:
    """Debian's Prometheus on 127.0.0.1 scraping every second, its data in *tmp*, once it answers (skips when
    not installed).

    Parameters:
      extra_files: Files to write next to the configuration first (``file_sd_configs`` targets).
    """
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus not installed (scripts/install_prometheus.sh)")
    for name, content in (extra_files or {}).items():
        (tmp / name).write_text(content)
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": scrape_configs,
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    server = procs.start(
        "prometheus",
        [
            binary,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        dict(os.environ),
    )
    prometheus = Prometheus(f"http://127.0.0.1:{port}")

    def ready() -> bool:
        assert server.poll() is None, procs.log("prometheus")
        try:
            with urllib.request.urlopen(f"{prometheus.url}/-/ready", timeout=2) as resp:
                return resp.status == 200
        except OSError:  # not listening yet, or 503 while it loads
            return False

    wait_for(ready, "Prometheus to be ready")
    return prometheus
