"""The live feed against a real server (werkzeug on 127.0.0.1:0) with real WebSocket/SSE clients."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from werkzeug.serving import make_server

from .conftest import login


@pytest.fixture()
def server(app) -> Iterator[str]:  # type: ignore[no-untyped-def]
    srv = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{srv.server_port}"
    srv.shutdown()
    thread.join(5)


def _connect(server: str, headers: dict[str, str], query: str = ""):  # type: ignore[no-untyped-def]
    headers = dict(headers)
    agent = headers.pop("User-Agent", None)
    extra = {"user_agent_header": agent} if agent else {}
    return connect(f"ws://{server}/api/v1/live{query}", additional_headers=headers, open_timeout=5, **extra)


@contextlib.contextmanager
def _ws(server: str, headers: dict[str, str], cursor: str | None = None):  # type: ignore[no-untyped-def]
    """A feed connection that sent its first message, ``{"cursor": cursor}`` (where to resume)."""
    with _connect(server, headers) as ws:
        ws.send(json.dumps({"cursor": cursor}))
        yield ws


def _next(ws, type_: str = "notice", timeout: float = 5.0) -> dict:  # type: ignore[no-untyped-def]
    while True:
        message = json.loads(ws.recv(timeout=timeout))
        if message["type"] in (type_, "resync") or type_ == "any":
            return message


def _submit(driver, person, text="x"):  # type: ignore[no-untyped-def]
    return driver.submit(person.user.owner_id, payload={"text": text})


def _feed_of(cursor: str) -> tuple[str, int]:
    """A cursor's feed id and notice count (``<feed>.<n>``)."""
    feed, _, n = cursor.partition(".")
    assert len(feed) == 16 and n.isdigit(), cursor
    return feed, int(n)


def test_resume_after_cursor_loses_nothing(server, driver, alice):  # type: ignore[no-untyped-def]
    with _ws(server, alice.bearer) as ws:
        hello = _next(ws, "hello")
        feed, n = _feed_of(hello["cursor"])
        assert n == 0 and hello["heartbeat_s"] == 10
        first = [_submit(driver, alice, str(i)).id for i in range(3)]
        got = [_next(ws) for _ in range(3)]
    assert [m["job_id"] for m in got] == first and all(m["status"] == "queued" for m in got)
    assert [m["id"] for m in got] == [f"{feed}.{i}" for i in (1, 2, 3)]
    cursor = got[-1]["id"]
    # While disconnected: new jobs, a status change, progress and an event.
    later = [_submit(driver, alice, f"later{i}").id for i in range(3)]
    driver.start(first[0])
    driver.progress(first[0], 0.5)
    driver.event(first[0], "half_way")
    with _ws(server, alice.bearer, cursor) as ws:
        assert _next(ws, "hello")["cursor"] == cursor
        resumed = [_next(ws) for _ in range(5)]
    assert [m["job_id"] for m in resumed] == [*later, first[0], first[0]]
    assert [m["id"] for m in resumed] == [f"{feed}.{i}" for i in range(4, 9)]
    assert resumed[3]["kind"] == "status" and resumed[4]["progress"] == 0.5


def test_too_old_cursor_gets_resync(app, server, driver, alice):  # type: ignore[no-untyped-def]
    from jobs.retention import DAY_S, RetentionPolicy, prune

    with _ws(server, alice.bearer) as ws:
        _next(ws, "hello")
        for i in range(20):
            _submit(driver, alice, str(i))
        cursor = [_next(ws) for _ in range(20)][2]["id"]  # after the third job's notice
    # Retention deletes the first jobs' events (cancelled, past their retention): a cursor before them
    # may have missed some.
    for job in driver_jobs_oldest_first(driver)[:5]:
        app.extensions["tenure"].jobs.cancel(None, job, by="root")
    _submit(driver, alice, "newest")  # retention never deletes the newest event row (SQLite reuses its id)
    later_ms = 10 * 86_400_000 + driver.job(driver_jobs_oldest_first(driver)[-1]).created_at.timestamp() * 1000
    policy = RetentionPolicy(jobs_s={s: DAY_S for s in ("succeeded", "failed", "cancelled", "interrupted")})
    assert prune(driver.engine, policy, now=int(later_ms)).jobs == 5
    with _ws(server, alice.bearer, cursor) as ws:
        hello = _next(ws, "hello")
        resync = _next(ws, "resync")
    # A new feed from now: its cursor, in the hello and the resync alike.
    assert _feed_of(hello["cursor"]) == (hello["cursor"][:16], 0) and hello["cursor"][:16] != cursor[:16]
    assert resync == {"type": "resync", "reason": "cursor_expired", "cursor": hello["cursor"]}


def driver_jobs_oldest_first(driver) -> list[str]:  # type: ignore[no-untyped-def]
    import jobs

    records = jobs.list_jobs(driver.engine, owner_id="", is_admin=True, limit=500)
    return [r.id for r in sorted(records, key=lambda r: (r.created_at, r.id))]


def test_falling_behind_gets_resync(app, server, driver, alice):  # type: ignore[no-untyped-def]
    app.config["LIVE_MAX_BACKLOG"] = 5
    with _ws(server, alice.bearer) as ws:
        _next(ws, "hello")
        _submit(driver, alice)
        cursor = _next(ws)["id"]
    for i in range(10):
        _submit(driver, alice, str(i))
    with _ws(server, alice.bearer, cursor) as ws:
        assert _next(ws, "hello")["cursor"] == cursor
        resync = _next(ws, "resync")
    assert resync["reason"] == "behind" and _feed_of(resync["cursor"])[1] == 0 and resync["cursor"][:16] != cursor[:16]


def test_fifth_connection_of_one_identity_gets_429(server, alice, bob):  # type: ignore[no-untyped-def]
    with contextlib.ExitStack() as stack:
        held = [stack.enter_context(_ws(server, alice.bearer)) for _ in range(4)]
        for ws in held:
            _next(ws, "hello")
        with pytest.raises(InvalidStatus) as refused:
            with _ws(server, alice.bearer):
                pass
        assert refused.value.response.status_code == 429
        assert refused.value.response.headers["Retry-After"] == "5"
        with _ws(server, bob.bearer) as other:  # another identity still gets in
            _next(other, "hello")
        held[0].close()
        for _ in range(100):  # the slot is released when the server side notices the close
            try:
                with _ws(server, alice.bearer) as again:
                    _next(again, "hello")
                break
            except InvalidStatus:
                threading.Event().wait(0.05)
        else:
            pytest.fail("the closed connection's slot was never released")


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer tnr_nope"}, {"Authorization": "Basic bm86bm8="}])
def test_unauthenticated_handshake_gets_401(server, headers):  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidStatus) as refused:
        with _ws(server, headers):
            pass
    assert refused.value.response.status_code == 401


def test_cookie_session_needs_same_origin(app, server, alice):  # type: ignore[no-untyped-def]
    client = app.test_client()
    # Flask-Login's "strong" session protection binds the session to the user agent (and address).
    client.environ_base["HTTP_USER_AGENT"] = "tenure-tests"
    login(client, alice)
    cookie = client.get_cookie("session")
    headers = {"Cookie": f"session={cookie.value}", "User-Agent": "tenure-tests"}
    with pytest.raises(InvalidStatus) as refused:
        with _ws(server, {**headers, "Origin": "http://evil.example"}):
            pass
    assert refused.value.response.status_code == 403
    with _ws(server, {**headers, "Origin": f"http://{server}"}) as ws:
        assert _next(ws, "hello")["type"] == "hello"


def test_users_see_only_their_jobs_admins_everything(server, driver, alice, bob, root):  # type: ignore[no-untyped-def]
    with _ws(server, alice.bearer) as a, _ws(server, root.bearer) as r:
        _next(a, "hello")
        _next(r, "hello")
        theirs = _submit(driver, bob, "b")
        mine = _submit(driver, alice, "a")
        assert _next(a)["job_id"] == mine.id  # bob's notice was skipped
        assert [_next(r)["job_id"] for _ in range(2)] == [theirs.id, mine.id]
        a.send("ignored")  # client frames are ignored
        again = _submit(driver, alice, "a2")
        assert _next(a)["job_id"] == again.id


def test_heartbeat_and_sse_resume(app, server, driver, alice):  # type: ignore[no-untyped-def]
    import http.client

    app.config["LIVE_HEARTBEAT_S"] = 0.2
    with _ws(server, alice.bearer) as ws:
        start = _next(ws, "hello")["cursor"]
        assert _next(ws, "heartbeat", timeout=3)["cursor"] == start
        jobs = [_submit(driver, alice, str(i)).id for i in range(3)]
        ids = [_next(ws)["id"] for _ in range(3)]
    host, port = server.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("GET", "/api/v1/live.sse", headers={**alice.bearer, "Last-Event-ID": ids[0]})
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("Content-Type").startswith("text/event-stream")
    seen: list[tuple[str, dict]] = []
    event = None
    while len([s for s in seen if s[0] == "notice"]) < 2:
        line = response.fp.readline().decode().rstrip("\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            seen.append((event or "", json.loads(line[6:])))
    conn.close()
    notices = [d for e, d in seen if e == "notice"]
    assert [n["job_id"] for n in notices] == jobs[1:] and [n["id"] for n in notices] == ids[1:]
    assert seen[0][0] == "hello"
    with _ws(server, alice.bearer, "abc") as ws:
        assert _refusal(ws) == (
            {"type": "error", "code": "validation_error", "message": _BAD_CURSOR},
            1008,
        )


_BAD_CURSOR = "cursor must be a cursor the feed sent (<feed>.<n>)."


def _refusal(ws) -> tuple[dict, int | None]:  # type: ignore[no-untyped-def]
    """The error message the feed sent, and the close code it closed with."""
    from websockets.exceptions import ConnectionClosed

    message = json.loads(ws.recv(timeout=5))
    with pytest.raises(ConnectionClosed):  # the closing handshake is over: the server closed TCP too
        ws.recv(timeout=5)
    return message, ws.close_code


@pytest.mark.parametrize("query", ["?cursor=1", "?cursor=", "?access_token=tnr_x", "?x"])
def test_query_parameters_are_refused_on_both_transports(server, alice, query) -> None:  # type: ignore[no-untyped-def]
    import http.client

    reason = (
        "The live feed takes no query parameters: resume with the Last-Event-ID header (SSE) "
        'or the first WebSocket message {"cursor": …}.'
    )
    with pytest.raises(InvalidStatus) as refused:
        with _connect(server, alice.bearer, query):
            pass
    assert refused.value.response.status_code == 400
    assert json.loads(refused.value.response.body)["error"] == {"code": "bad_request", "message": reason}
    host, port = server.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("GET", f"/api/v1/live.sse{query}", headers=alice.bearer)
    response = conn.getresponse()
    assert response.status == 400 and json.loads(response.read())["error"]["message"] == reason
    conn.close()


def _slots_held(app, person) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """This process's live connections, and *person*'s slots across every web process."""
    from accounts import live_slots

    limits = app.extensions["tenure"].feed_limits
    return limits.total, live_slots.held(limits.engine, f"user:{person.user.id}")


def _wait_for_free_slots(app, person) -> None:  # type: ignore[no-untyped-def]
    """Every connection slot is released (when a handler returns, just after its close frame)."""
    for _ in range(100):
        if _slots_held(app, person) == (0, 0):
            break
        threading.Event().wait(0.05)
    assert _slots_held(app, person) == (0, 0), "a refused connection kept its slot"


def test_the_websocket_cursor_comes_only_from_the_first_message(app, server, driver, alice) -> None:  # type: ignore[no-untyped-def]
    # A first message that is no JSON object, or a cursor of the wrong type: refused with the reason
    for first in ("3", "not json", '["1"]'):
        with _connect(server, alice.bearer) as ws:
            ws.send(first)
            message, code = _refusal(ws)
            assert message["type"] == "error" and message["code"] == "validation_error" and code == 1008, first
    with _connect(server, alice.bearer) as ws:
        ws.send(json.dumps({"cursor": 3}))
        assert _refusal(ws) == ({"type": "error", "code": "validation_error", "message": _BAD_CURSOR}, 1008)
    # four refusals so far: their slots come back (or a fifth connection would rightly get 429)
    _wait_for_free_slots(app, alice)
    # No first message in time: the feed says what it waits for, then closes (and frees the slot)
    app.config["LIVE_SUBSCRIBE_TIMEOUT_S"] = 0.3
    with _connect(server, alice.bearer) as ws:
        message, code = _refusal(ws)
    assert code == 1008 and message == {
        "type": "error",
        "code": "validation_error",
        "message": 'Send {"cursor": <the last cursor you saw, or null>} as the first message.',
    }
    _wait_for_free_slots(app, alice)
    # {} and {"cursor": null} start from now (a new feed each); a cursor in the first message resumes after it
    starts = []
    for first in ({}, {"cursor": None}):
        with _connect(server, alice.bearer) as ws:
            ws.send(json.dumps(first))
            starts.append(_next(ws, "hello")["cursor"])
    assert [_feed_of(c)[1] for c in starts] == [0, 0] and starts[0] != starts[1]
    job = _submit(driver, alice).id
    with _connect(server, alice.bearer) as ws:
        ws.send(json.dumps({"cursor": starts[0]}))
        assert _next(ws, "hello")["cursor"] == starts[0] and _next(ws)["job_id"] == job


def _serve(app):  # type: ignore[no-untyped-def]
    srv = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    return srv, thread


def test_cursor_resumes_on_another_app_instance(app_config, database_path, driver, alice, bob):  # type: ignore[no-untyped-def]
    """Two web processes (two apps, two servers) on one database: a cursor from one resumes on the other."""
    from jobs.db import make_engine
    from webapp import create_app

    engines = [make_engine(f"sqlite:///{database_path}") for _ in range(2)]
    apps = [create_app({**app_config, "TENURE_ENGINE": e}) for e in engines]
    servers = [_serve(a) for a in apps]
    first, second = (f"127.0.0.1:{srv.server_port}" for srv, _ in servers)

    def submit(person, text):  # type: ignore[no-untyped-def]
        return _submit(driver, person, text).id

    try:
        with _ws(first, alice.bearer) as ws:
            _next(ws, "hello")
            early = [submit(alice, "a0"), submit(bob, "b0"), submit(alice, "a1")]
            got = [_next(ws) for _ in range(2)]
        assert [m["job_id"] for m in got] == [early[0], early[2]]
        cursor = got[-1]["id"]
        # While disconnected, through the OTHER process: new jobs (alice's and bob's) and a cancel.
        later = [submit(alice, "a2"), submit(bob, "b1")]
        apps[1].extensions["tenure"].jobs.cancel(alice.user.owner_id, early[0], by=alice.user.owner_id)
        with _ws(second, alice.bearer, cursor) as ws:
            assert _next(ws, "hello")["cursor"] == cursor
            resumed = [_next(ws) for _ in range(2)]
        assert all(m["type"] == "notice" for m in resumed)  # no resync
        assert [(m["job_id"], m["status"]) for m in resumed] == [(later[0], "queued"), (early[0], "cancelled")]
        feed, n = _feed_of(cursor)
        assert [m["id"] for m in resumed] == [f"{feed}.{n + 1}", f"{feed}.{n + 2}"]
    finally:
        for srv, thread in servers:
            srv.shutdown()
            thread.join(5)
        for engine in engines:
            engine.dispose()


def test_the_cli_client_resumes_with_last_event_id(server, driver, alice) -> None:  # type: ignore[no-untyped-def]
    from tenure_cli.remote import Remote

    with _ws(server, alice.bearer) as ws:
        _next(ws, "hello")
        jobs = [_submit(driver, alice, str(i)).id for i in range(3)]
        cursor = [_next(ws) for _ in range(3)][0]["id"]
    remote = Remote(f"http://{server}", alice.token)
    try:
        with remote.live(cursor=cursor) as feed:  # the header, never ?cursor= (which the feed refuses)
            messages = iter(feed)
            assert next(messages)["type"] == "hello"
            assert [next(messages)["job_id"] for _ in range(2)] == jobs[1:]
    finally:
        remote.client.close()
