"""``make run``'s launcher (``scripts/run.sh`` → ``honcho start``) from a fresh clone, on the embedded
SQLite default and on the fleet set-up (RabbitMQ + PostgreSQL, ``Procfile.fleet`` with the relay):
every process type comes up, a job submitted over HTTP completes, and SIGTERM to honcho stops
everything with nothing left leased and no unclean exit recorded.

The clone reuses this checkout's virtualenv (``.venv`` symlinked into it, ``PYTHONPATH`` set to the
clone so its code, not this checkout's editable install, is what runs). Only committed work is cloned.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from jobs.db import make_engine

from .fleet import Fleet
from .support import ROOT, Procs, group_alive, processes, wait_for

VENV = Path(sys.executable).parent.parent
PROCESS_TYPES = {
    "sqlite": ("web", "worker", "asr", "scheduler"),
    "fleet": ("web", "worker", "asr", "scheduler", "relay"),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("clone") / "tenure"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(path)], check=True, timeout=120)
    (path / ".venv").symlink_to(VENV)
    return path


class Http:
    def __init__(self, port: int, user: str, password: str) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, auth: bool = True) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", self.auth)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            with e:
                return e.code, json.loads(e.read() or b"null")


def _live(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health/live", timeout=2) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False


@pytest.fixture(params=["sqlite", pytest.param("fleet", marks=pytest.mark.services)])
def setup(request: pytest.FixtureRequest, clone: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """``(name, TENURE_* variables)``: the SQLite default (var/tenure.db in the clone) or a fleet."""
    if request.param == "sqlite":
        for leftover in (clone / "var").glob("tenure.db*"):
            leftover.unlink()
        yield "sqlite", {}
    else:
        fleet: Fleet = request.getfixturevalue("rabbitmq_postgres_fleet")
        yield "fleet", {"TENURE_BROKER_URL": fleet.broker_url, "TENURE_DATABASE_URL": fleet.database_url}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_make_run_serves_a_job_over_http_and_sigterm_stops_everything_cleanly(
    setup: tuple[str, dict[str, str]], clone: Path, tmp_path: Path
) -> None:
    name, tenure_env = setup
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENURE_", "PROMETHEUS_", "PYTHON"))}
    env.update(tenure_env, PORT=str(port), PYTHONPATH=str(clone), PYTHONUNBUFFERED="1", TENURE_WEB_WORKERS="1")
    env["TENURE_OUTPUT_ROOT"] = str(tmp_path / "outputs")
    rec = tmp_path / "rec" / "4242-ops"
    env["TENURE_IMPORT_ROOTS"] = str(rec.parent)
    subprocess.run(
        [str(VENV / "bin" / "tenure"), "demo", "make-recording", str(rec), "--segments", "1", "--seconds", "2"],
        cwd=clone,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    database_url = tenure_env.get("TENURE_DATABASE_URL", f"sqlite:///{clone / 'var' / 'tenure.db'}")

    with processes(tmp_path) as procs:
        honcho = procs.start("make-run", ["bash", "scripts/run.sh"], env, cwd=clone)
        groups: list[int] = []
        try:
            # Given make run's launcher: the URL and the admin password are printed, every process type starts
            wait_for("the URL", lambda: f"open http://127.0.0.1:{port}/" in honcho.output(), 60, procs)
            password = re.search(r"with password: (\S+)", honcho.output()).group(1)  # type: ignore[union-attr]
            started = wait_for("every process type to start", lambda: _started(honcho.output(), name), 60, procs)
            groups = list(started.values())
            wait_for("the web process to answer", lambda: _live(port), 60, procs, poll_s=0.2)
            # Every dramatiq process (2 worker + 1 asr) has booted: a stop that lands in the middle of a
            # slow start-up (the ASR stack imports for seconds on a loaded machine) is a different case,
            # covered by test_stop.py, and may legitimately outlast honcho's fixed 5 s before SIGKILL.
            wait_for(
                "every worker process to be ready",
                lambda: honcho.output().count("Worker process is ready for action") >= 3,
                120,
                procs,
                poll_s=0.2,
            )
            http = Http(port, "admin", password)

            # When a job is submitted over HTTP
            submit = {"kind": "import_recording", "payload": {"folder": str(rec)}}
            status, job = http.call("POST", "/api/v1/jobs", submit)
            assert status == 201, job

            # Then it completes
            def finished() -> dict[str, Any] | None:
                code, body = http.call("GET", f"/api/v1/jobs/{job['id']}")
                assert code == 200, body
                return body if body["status"] in ("succeeded", "failed", "cancelled", "interrupted") else None

            done = wait_for("the job to finish", finished, 120, procs, poll_s=0.25)
            assert done["status"] == "succeeded", (done, procs.logs())
            assert _stopped(honcho.output()) == [], procs.logs()  # nothing exited on its own

            # When honcho receives SIGTERM
            procs.signal(honcho, signal.SIGTERM)
            code = honcho.popen.wait(30)

            # Then it stops every process (none needed the SIGKILL at 5 s) and nothing is left behind
            out = honcho.output()
            assert code in (0, 143), out
            assert "SIGKILL" not in out and "sending SIGKILL" not in out.lower(), out
            for pgid in groups:
                assert not group_alive(pgid), f"process group {pgid} still alive:\n{out}"
            _assert_nothing_left(name, database_url, tenure_env)
            assert "ended uncleanly" not in out
        finally:
            _kill_groups(procs, groups)


def _started(output: str, name: str) -> dict[str, int] | None:
    """``process type → pid`` (= its process group: honcho starts each in a new session) once all started."""
    pids = {m[0].split(".")[0]: int(m[1]) for m in re.findall(r"system\s*\| (\S+) started \(pid=(\d+)\)", output)}
    return pids if set(PROCESS_TYPES[name]) <= set(pids) else None


def _stopped(output: str) -> list[str]:
    return re.findall(r"system\s*\| (\S+) stopped", output)


def _assert_nothing_left(name: str, database_url: str, tenure_env: dict[str, str]) -> None:
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')")).scalar() == 0
            if name == "sqlite":
                assert conn.execute(text("SELECT count(*) FROM broker_messages WHERE state = 1")).scalar() == 0
                assert conn.execute(text("SELECT count(*) FROM broker_processes")).scalar() == 0
                assert conn.execute(text("SELECT count(*) FROM broker_unclean_exits")).scalar() == 0
            else:
                assert conn.execute(text("SELECT count(*) FROM outbox WHERE published_at IS NULL")).scalar() == 0
    finally:
        engine.dispose()
    if name == "fleet":
        from .fleet import rabbitmq_unacked

        assert rabbitmq_unacked(tenure_env["TENURE_BROKER_URL"]) == {}


def _kill_groups(procs: Procs, groups: list[int]) -> None:
    """honcho's children run in their own sessions: if the test failed early, kill them by group too."""
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
