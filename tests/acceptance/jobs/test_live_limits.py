"""The live feed's connection limits and send timeout, on real gunicorn processes (SQLite and PostgreSQL, no Redis).

Two gunicorn servers on two ports serve the app on one database: the per-identity limit counts the
connections of both (a row per connection in the job database), a killed web process gives its
connections' slots back once they expire, and a client that stops reading is disconnected by the
send timeout (10 s, the default) and frees its slot. A graceful shutdown (SIGTERM) ends open streams at
once instead of waiting out gunicorn's graceful timeout.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

import accounts
from accounts import live_slots
from tests.acceptance.operations.support import Procs, processes, wait_for
from tests.acceptance.operations.web import free_port, live
from tests.integration.jobs.support import JobEnv, job_env
from tests.stalled_subscriber import stalled_subscriber

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

KIND = "live_limits_echo"
#: Slots expire this soon after their last renewal here, so a killed process's come back quickly, with a
#: margin: a slot renewed a third of this before its process was killed must still count while a test opens
#: another connection on a loaded machine.
SLOT_TTL_S = 8
#: gunicorn.conf.py's graceful_timeout: how long a SIGTERMed worker waits for open requests.
GRACEFUL_TIMEOUT_S = 10


@dataclass
class Deployment:
    env: JobEnv
    procs: Procs
    ports: list[int]
    token: str
    identity: str

    def held(self) -> int:
        return live_slots.held(self.env.engine, self.identity)

    def rows(self) -> int:
        """The identity's slot rows, expired ones included: a row goes only when its connection ends."""
        return int(self.env.sql("SELECT count(*) FROM live_slots WHERE identity = :i", i=self.identity)[0][0])


def _start_web(procs: Procs, env: JobEnv, name: str, workers: int) -> int:
    port = free_port()
    web_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TENURE_", "PROMETHEUS_"))},
        "PYTHONPATH": str(Path(__file__).resolve().parents[3]),
        "TENURE_DATABASE_URL": env.url,
        "TENURE_BROKER_URL": env.broker_url,
        "TENURE_OUTPUT_ROOT": str(env.tmp_path / "outputs"),
        "TENURE_SECRET_KEY": "live-limits-secret",
        "TENURE_WEB_TASKS_APP": "",
        "TENURE_WEB_LIVE_POLL_S": "0.1",
        "TENURE_WEB_LIVE_SLOT_TTL_S": str(SLOT_TTL_S),
        "PORT": str(port),
        "TENURE_WEB_WORKERS": str(workers),
        "TENURE_WEB_THREADS": "12",
    }
    gunicorn = str(Path(sys.executable).with_name("gunicorn"))
    procs.start(name, [gunicorn, "-c", "gunicorn.conf.py", "webapp:create_app()"], web_env)
    return port


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.services)])
def deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp(f"live-limits-{request.param}")
    with job_env(request.param, tmp) as env, processes(tmp) as procs:
        env.declare(KIND, lambda: None)
        user, _ = accounts.create_user(env.engine, "ursula", "live-limits-password")
        _, token = accounts.create_token(env.engine, user.id, "live")
        ports = [_start_web(procs, env, "web-a", 1), _start_web(procs, env, "web-b", 1)]
        for port in ports:
            wait_for(f"the web server on port {port}", lambda port=port: live(port), 30, procs)
        yield Deployment(env, procs, ports, token, f"user:{user.id}")


@contextlib.contextmanager
def _ws(port: int, token: str) -> Iterator[ClientConnection]:
    url = f"ws://127.0.0.1:{port}/api/v1/live"
    with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=10) as ws:
        ws.send(json.dumps({"cursor": None}))
        assert json.loads(ws.recv(timeout=10))["type"] == "hello"
        yield ws


def _sse(port: int, token: str) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/api/v1/live.sse", headers={"Authorization": f"Bearer {token}"})
    response = conn.getresponse()
    assert response.status == 200
    while not response.readline().startswith(b"event: hello"):
        pass
    return conn


def _refused(port: int, token: str) -> tuple[int, str | None]:
    with pytest.raises(InvalidStatus) as refused:
        with _ws(port, token):
            pass
    return refused.value.response.status_code, refused.value.response.headers.get("Retry-After")


def _worker_of(master_pid: int) -> int:
    (worker,) = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    return int(worker)


def test_a_fifth_connection_is_refused_when_four_are_spread_over_two_processes(deployment: Deployment) -> None:
    a, b = deployment.ports
    with contextlib.ExitStack() as held:
        for _ in range(2):
            held.enter_context(_ws(a, deployment.token))
            held.callback(_sse(b, deployment.token).close)
        assert deployment.held() == 4
        assert _refused(a, deployment.token) == (429, "5")
        assert _refused(b, deployment.token) == (429, "5")
    # Released at once: a closed SSE connection is noticed at the next poll, not a heartbeat later.
    wait_for("the four slots to be released", lambda: deployment.held() == 0, 3, deployment.procs)
    with _ws(b, deployment.token):  # free again
        pass


def test_a_killed_web_process_gives_its_slots_back_when_they_expire(deployment: Deployment) -> None:
    a, b = deployment.ports
    web_b = next(p for p in deployment.procs.started if p.name == "web-b")
    # Kept referenced: an SSE connection garbage-collected here would close its socket, and web-b would free its
    # slot at its next write, before the kill this test is about.
    left_open: list[http.client.HTTPConnection] = []
    with contextlib.ExitStack() as held:
        for _ in range(2):
            held.enter_context(_ws(a, deployment.token))
            left_open.append(_sse(b, deployment.token))  # left open: its process dies with it
        assert deployment.held() == 4
        victim = _worker_of(web_b.pid)
        os.kill(victim, signal.SIGKILL)  # its slots stay in the table: nobody released them
        killed_at = time.monotonic()
        refused = _refused(a, deployment.token)
        assert refused == (429, "5"), f"{refused}, {time.monotonic() - killed_at:.1f} s after the kill"
        # Nobody renews them now: within the TTL (and a poll) they stop counting.
        wait_for("the dead process's slots to expire", lambda: deployment.held() == 2, SLOT_TTL_S + 5, deployment.procs)
        # Not before they expired: each was renewed at most a third of the TTL (and a poll) before the kill
        assert time.monotonic() - killed_at >= SLOT_TTL_S * 2 / 3 - 0.5
        held.enter_context(_ws(a, deployment.token))
        held.enter_context(_ws(a, deployment.token))
        assert _refused(a, deployment.token)[0] == 429
    for conn in left_open:
        conn.close()
    wait_for("a new web-b worker", lambda: live(b) and _worker_of(web_b.pid) != victim, 30, deployment.procs)


def _stops_reading(deployment: Deployment, transport: str) -> socket.socket:
    """A real socket subscribed over *transport* (``ws`` or ``sse``) that will never read again."""
    return stalled_subscriber("127.0.0.1", deployment.ports[0], deployment.token, transport)


def test_a_client_that_stops_reading_is_disconnected_within_15_s(deployment: Deployment) -> None:
    """Real sockets that stop reading while their notices pile up, one per transport (WebSocket and SSE)
    at once: within 15 s the server gives up on each (a send blocked for 10 s) and their slots are free."""
    clients = [_stops_reading(deployment, "ws")]
    try:
        wait_for("the WebSocket's slot", lambda: deployment.held() == 1, 10, deployment.procs)
        clients.append(_stops_reading(deployment, "sse"))
        wait_for("both connections' slots", lambda: deployment.held() == 2, 10, deployment.procs)
        # From here on they read nothing: a job of their owner reports a long status line and many events.
        env = deployment.env
        job = env.submit(KIND, owner_id=deployment.identity.split(":")[1])
        ctx = env.claim(job.id)
        assert ctx is not None
        ctx._progress_due = 0.0  # written at once
        ctx.progress(0.1, "x" * 2000)  # every notice of the job carries it: ~2 KiB each
        for i in range(300):
            ctx.event("step", n=i)
        flooded = time.monotonic()
        # Their rows deleted (not merely expired: this deployment's slots expire after 3 s): both ended.
        wait_for("the end of the clients that stopped reading", lambda: deployment.rows() == 0, 15, deployment.procs)
        assert time.monotonic() - flooded < 15
        # The server closed each connection: what is left in the buffers, then the end.
        for raw in clients:
            raw.settimeout(5)
            with contextlib.suppress(ConnectionResetError):
                while raw.recv(65536):
                    pass
    finally:
        for raw in clients:
            raw.close()


def test_a_graceful_shutdown_ends_open_streams_instead_of_waiting_out_its_timeout(tmp_path: Path) -> None:
    """SIGTERM to gunicorn with a WebSocket and an SSE stream open: the WebSocket is closed with 1012
    (service restart), the SSE response ends with its last chunk (a connection cut when the graceful
    timeout ran out would end mid-body), and gunicorn is gone before that timeout."""
    with job_env("sqlite", tmp_path) as env, processes(tmp_path) as procs:
        user, _ = accounts.create_user(env.engine, "ursula", "live-limits-password")
        _, token = accounts.create_token(env.engine, user.id, "live")
        port = _start_web(procs, env, "web", 1)
        wait_for("the web server", lambda: live(port), 30, procs)
        (web,) = procs.started
        sse = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        sse.request("GET", "/api/v1/live.sse", headers={"Authorization": f"Bearer {token}"})
        stream = sse.getresponse()
        assert stream.status == 200 and stream.getheader("Transfer-Encoding") == "chunked"
        with _ws(port, token) as ws:
            procs.signal(web, signal.SIGTERM)
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    ws.recv(timeout=GRACEFUL_TIMEOUT_S)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
        assert b"event: hello" in stream.read()  # the whole body: IncompleteRead had it been cut
        sse.close()
        web.popen.wait(GRACEFUL_TIMEOUT_S - 1)
