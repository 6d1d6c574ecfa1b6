"""``make run``'s launcher (``scripts/run.sh`` → ``honcho start``) from a fresh clone, on the embedded
SQLite default and on the fleet set-ups (RabbitMQ + PostgreSQL, and PostgreSQL alone with the PostgreSQL
broker; ``Procfile.fleet`` with the relay):
every process type comes up, a job submitted over HTTP completes, and SIGTERM to honcho stops
everything with nothing left leased and no unclean exit recorded.

The clone reuses this checkout's virtualenv (``.venv`` symlinked into it, ``PYTHONPATH`` set to the
clone so its code, not this checkout's editable install, is what runs). Only committed work is cloned.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from jobs.db import make_engine

from .fleet import Fleet
from .support import ROOT, Proc, Procs, group_alive, processes, wait_for
from .web import Http, free_port, live

VENV = Path(sys.executable).parent.parent
PROCESS_TYPES = {
    "sqlite": ("web", "worker", "asr", "scheduler"),
    "fleet": ("web", "worker", "asr", "scheduler", "relay"),
    "pgbroker": ("web", "worker", "asr", "scheduler", "relay"),
}


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("clone") / "tenure"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(path)], check=True, timeout=120)
    (path / ".venv").symlink_to(VENV)
    return path


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("fleet", marks=pytest.mark.services),
        pytest.param("pgbroker", marks=pytest.mark.services),
    ]
)
def setup(request: pytest.FixtureRequest, clone: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """``(name, TENURE_* variables)``: the SQLite default (var/tenure.db in the clone), a fleet on RabbitMQ +
    PostgreSQL, or a fleet on PostgreSQL alone (the PostgreSQL broker on the job database, migrated by run.sh)."""
    if request.param == "sqlite":
        for leftover in (clone / "var").glob("tenure.db*"):
            leftover.unlink()
        yield "sqlite", {}
    elif request.param == "pgbroker":
        from tests.integration.jobs.support import postgres_database

        with postgres_database() as url:
            yield "pgbroker", {"TENURE_BROKER_URL": url, "TENURE_DATABASE_URL": url}
    else:
        fleet: Fleet = request.getfixturevalue("rabbitmq_postgres_fleet")
        yield "fleet", {"TENURE_BROKER_URL": fleet.broker_url, "TENURE_DATABASE_URL": fleet.database_url}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_make_run_serves_a_job_over_http_and_sigterm_stops_everything_cleanly(
    setup: tuple[str, dict[str, str]], clone: Path, tmp_path: Path
) -> None:
    name, tenure_env = setup
    port = free_port()
    env, rec = _environment(clone, tmp_path, port, tenure_env, segments=1, seconds=2)
    database_url = tenure_env.get("TENURE_DATABASE_URL", f"sqlite:///{clone / 'var' / 'tenure.db'}")

    with processes(tmp_path) as procs:
        honcho = procs.start("make-run", ["bash", "scripts/run.sh"], env, cwd=clone)
        groups: list[int] = []
        try:
            # Given make run's launcher: the URL and the admin password are printed, every process type starts
            http = _ready(procs, honcho, port, name, groups)

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


class _LivenessProbe(threading.Thread):
    """Polls ``GET /api/health/live`` every 0.2 s until stopped; counts the probes and the failures."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port, self.probes, self.failures = port, 0, 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.2):
            self.probes += 1
            self.failures += 0 if live(self.port) else 1

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)


def _db_rows(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _worker_pids(db: Path, *, never_restarted: bool = False) -> list[int]:
    """The worker processes of the ``worker`` process type now (its supervisor's slots), booted ones only."""
    sql = "SELECT s.pid FROM worker_slots s JOIN broker_processes p ON p.pid = s.pid WHERE s.role = 'worker'"
    return [pid for (pid,) in _db_rows(db, sql + (" AND s.restarts = 0" if never_restarted else ""))]


def _victim(db: Path, pipeline_id: str, kind: str) -> tuple[int, str] | None:
    """The worker process running the pipeline's *kind* step, or — if that step already finished before
    it was caught running — any worker process; with what it was doing."""
    rows = _db_rows(db, "SELECT status, worker_id FROM jobs WHERE parent_job_id = ? AND kind = ?", pipeline_id, kind)
    for status, worker_id in rows:
        if status == "running" and worker_id:
            return int(worker_id.split(":")[1]), f"running {kind}"
    if any(status in ("succeeded", "failed", "cancelled", "interrupted") for status, _ in rows):
        pids = _worker_pids(db)
        return (pids[0], f"idle ({kind} already done)") if pids else None
    return None


def _restarts(db: Path) -> int:
    return int(_db_rows(db, "SELECT coalesce(sum(restarts), 0) FROM worker_slots WHERE role = 'worker'")[0][0])


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_make_run_replaces_worker_processes_sigkilled_during_a_pipeline_and_keeps_serving(
    clone: Path, tmp_path: Path
) -> None:
    for leftover in (clone / "var").glob("tenure.db*"):
        leftover.unlink()
    port = free_port()
    # Short leases: a killed attempt's job is recovered within seconds, not the default 30 s
    short = {"TENURE_JOB_LEASE_TTL_S": "2", "TENURE_BROKER_LEASE_TTL_S": "2", "TENURE_RECOVERY_INTERVAL_S": "1"}
    env, rec = _environment(clone, tmp_path, port, short, segments=2, seconds=3)
    db = clone / "var" / "tenure.db"

    with processes(tmp_path) as procs:
        honcho = procs.start("make-run", ["bash", "scripts/run.sh"], env, cwd=clone)
        groups: list[int] = []
        probe = _LivenessProbe(port)
        try:
            # Given make run up, the web polled every 0.2 s, and the README's demo pipeline submitted
            http = _ready(procs, honcho, port, "sqlite", groups)
            probe.start()
            payload = {"folder": str(rec), "highlight_s": 8.0, "width": 640, "height": 360}
            status, pipeline = http.call("POST", "/api/v1/jobs", {"kind": "recording_pipeline", "payload": payload})
            assert status == 201, pipeline

            # When a worker process is SIGKILLed three times while it runs: the one running the import
            # step, then the other one, then the one running the render step
            killed: list[str] = []

            def kill(pid: int, doing: str) -> None:
                os.kill(pid, signal.SIGKILL)
                killed.append(f"{pid} ({doing})")
                n = len(killed)
                # the next kill comes once the replacement has booted: three crashes, not a crash at boot
                wait_for(f"restart {n}", lambda: _restarts(db) >= n and len(_worker_pids(db)) == 2, 60, procs)

            kill(*wait_for("the import step", lambda: _victim(db, pipeline["id"], "import_recording"), 60, procs))
            kill(_worker_pids(db, never_restarted=True)[0], "the other one, idle")
            kill(*wait_for("the render step", lambda: _victim(db, pipeline["id"], "render_clip"), 180, procs))
            print("\nSIGKILLed worker processes:", ", ".join(killed))

            # Then the pipeline succeeds
            def finished() -> dict[str, Any] | None:
                code, body = http.call("GET", f"/api/v1/jobs/{pipeline['id']}")
                assert code == 200, body
                return body if body["status"] in ("succeeded", "failed", "cancelled", "interrupted") else None

            done = wait_for("the pipeline to finish", finished, 180, procs, poll_s=0.25)
            probe.stop()
            assert done["status"] == "succeeded", (done, procs.logs())
            # ... the web answered throughout, and no Procfile process stopped
            print(f"/api/health/live: {probe.probes} probes, {probe.failures} failed")
            assert probe.probes >= 25 and probe.failures == 0
            assert _stopped(honcho.output()) == [], procs.logs()
            # ... and the API, the Workers page and the metrics show the three restarts
            status, slots = http.call("GET", "/api/v1/workers/slots")
            assert status == 200, slots
            workers = [s for s in slots if s["role"] == "worker"]
            assert sum(s["restarts"] for s in workers) == 3 and {s["state"] for s in workers} == {"running"}, slots
            page = http.page("/ops/workers")
            assert "3 restart(s)" in page, page
            samples = [line for line in _metrics(http) if line.startswith('tenure_worker_restarts_total{role="worker"')]
            assert sum(float(line.rsplit(" ", 1)[1]) for line in samples) == 3, samples
            # ... the render step's Attempts (API and page) end attempt 1 "lease lost", and its timeline has
            # the lease expiry (which worker, which host) and the recovery that requeued it
            render_pid = int(killed[-1].split(" ", 1)[0])
            assert killed[-1].endswith("(running render_clip)"), killed
            ((render_id,),) = _db_rows(
                db, "SELECT id FROM jobs WHERE parent_job_id = ? AND kind = 'render_clip'", done["id"]
            )
            _assert_lease_lost(http, render_id, render_pid)
            # ... the Workers page and readiness list the three unclean exits until an admin acknowledges them
            _assert_unclean_exits_until_acknowledged(http, [int(k.split(" ", 1)[0]) for k in killed])
            # When honcho receives SIGTERM, it still stops everything
            procs.signal(honcho, signal.SIGTERM)
            assert honcho.popen.wait(30) in (0, 143), honcho.output()
        finally:
            probe.stop()
            _kill_groups(procs, groups)


def _assert_lease_lost(http: Http, job_id: str, killed_pid: int) -> None:
    status, attempts = http.call("GET", f"/api/v1/jobs/{job_id}/attempts")
    assert status == 200, attempts
    first, last = attempts["items"][0], attempts["items"][-1]
    assert (first["attempt"], first["outcome"], first["next"]) == (1, "lease lost — worker died", "requeued"), attempts
    assert first["host"] == socket.gethostname() and last["outcome"] == "succeeded", attempts
    status, events = http.call("GET", f"/api/v1/jobs/{job_id}/events?limit=500")
    assert status == 200, events
    (expiry,) = [e for e in events["items"] if e["type"] == "lease_expired"]
    assert expiry["data"]["attempt"] == 1 and expiry["data"]["worker"].split(":")[1] == str(killed_pid), expiry
    assert expiry["data"]["host"] == socket.gethostname() and expiry["data"]["expired_at"], expiry
    recovery = next(e for e in events["items"] if e["sequence"] == expiry["sequence"] + 1)
    assert (recovery["type"], recovery["data"]["status"], recovery["data"]["next"]) == ("status", "queued", "requeued")
    page = http.page(f"/jobs/{job_id}")
    assert '<td data-label="Outcome" class="outcome">lease lost — worker died' in page, page
    assert "lease_expired" in page


def _assert_unclean_exits_until_acknowledged(http: Http, killed_pids: list[int]) -> None:
    page = http.page("/ops/workers")
    listed = [
        int(pid) for pid in re.findall(r'<td data-label="Host / pid">[^<]* / (\d+)</td><td data-label="Started">', page)
    ]
    assert sorted(listed) == sorted(killed_pids), page
    status, ready = http.call("GET", "/api/health/ready")
    assert status == 200 and ready["status"] == "ok", ready  # a past crash leaves the system ready
    assert ready["components"]["unclean_exits"]["detail"].startswith("3 unclean exit(s) awaiting acknowledgement")
    after = http.submit_form(page, "unclean-exits-form")
    assert "Acknowledged 3 unclean exit(s)." in after and 'id="unclean-exits"' not in after, after
    status, ready = http.call("GET", "/api/health/ready")
    assert status == 200 and ready["components"]["unclean_exits"]["detail"] == "no unclean exits", ready


def _metrics(http: Http) -> list[str]:
    req = urllib.request.Request(http.base + "/metrics", headers={"Authorization": http.auth})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read().decode().splitlines()


def _environment(
    clone: Path, tmp_path: Path, port: int, tenure_env: dict[str, str], *, segments: int, seconds: float
) -> tuple[dict[str, str], Path]:
    """make run's environment for the clone (its own PYTHONPATH and output root) and a demo recording."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENURE_", "PROMETHEUS_", "PYTHON"))}
    env.update(tenure_env, PORT=str(port), PYTHONPATH=str(clone), PYTHONUNBUFFERED="1", TENURE_WEB_WORKERS="1")
    env["TENURE_OUTPUT_ROOT"] = str(tmp_path / "outputs")
    rec = tmp_path / "rec" / "4242-ops"
    env["TENURE_IMPORT_ROOTS"] = str(rec.parent)
    subprocess.run(
        [str(VENV / "bin" / "tenure"), "demo", "make-recording", str(rec), "--segments", str(segments)]
        + ["--seconds", str(seconds)],
        cwd=clone,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return env, rec


def _ready(procs: Procs, honcho: Proc, port: int, name: str, groups: list[int]) -> Http:
    """Wait until make run is up (URL and password printed, every process type started, every worker
    process booted); note each process type's group in *groups*; the admin's client."""
    wait_for("the URL", lambda: f"open http://127.0.0.1:{port}/" in honcho.output(), 60, procs)
    password = re.search(r"with password: (\S+)", honcho.output()).group(1)  # type: ignore[union-attr]
    started = wait_for("every process type to start", lambda: _started(honcho.output(), name), 60, procs)
    groups.extend(started.values())
    wait_for("the web process to answer", lambda: live(port), 60, procs, poll_s=0.2)
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
    return Http(port, "admin", password)


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
            elif name == "pgbroker":
                # every message was acknowledged (none leased, none ready) and none went through the outbox
                assert conn.execute(text("SELECT count(*) FROM pgbroker_messages WHERE state IN (0, 1)")).scalar() == 0
                assert conn.execute(text("SELECT count(*) FROM outbox")).scalar() == 0
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
