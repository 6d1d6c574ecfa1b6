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

from tests.stalled_subscriber import stalled_subscriber

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


# -- the live feed's promises ------------------------------------------------------------------------
class _Stream:
    """One feed connection over either transport: its messages, and when the server ended it."""

    def __init__(self, server: str, transport: str, headers: dict[str, str], cursor: str | None = None) -> None:
        import http.client

        self.transport = transport
        if transport == "ws":
            self._stack = contextlib.ExitStack()
            self.ws = self._stack.enter_context(_ws(server, headers, cursor))
        else:
            host, port = server.split(":")
            self.conn = http.client.HTTPConnection(host, int(port), timeout=10)
            resume = {"Last-Event-ID": cursor} if cursor else {}
            self.conn.request("GET", "/api/v1/live.sse", headers={**headers, **resume})
            self.sock = self.conn.sock  # http.client lets go of it once the response says it closes
            self.response = self.conn.getresponse()
            assert self.response.status == 200, self.response.read()[:300]

    def recv(self, timeout: float = 5.0) -> dict | None:
        """The next message, or None when the server ended the stream."""
        from websockets.exceptions import ConnectionClosed

        if self.transport == "ws":
            try:
                return json.loads(self.ws.recv(timeout=timeout))
            except ConnectionClosed:
                return None
        self.sock.settimeout(timeout)
        event = None
        while True:
            line = self.response.readline().decode()
            if not line:
                return None
            if line.startswith("event: "):
                event = line[7:].strip()
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == event
                return data

    def next(self, type_: str = "notice", timeout: float = 5.0) -> dict:
        while True:
            message = self.recv(timeout)
            assert message is not None, f"the stream ended while waiting for {type_}"
            if message["type"] in (type_, "resync"):
                return message

    def until_end(self, timeout: float) -> list[dict]:
        """Every message until the server ends the stream (fails if it does not within *timeout*)."""
        import time

        deadline = time.monotonic() + timeout
        seen: list[dict] = []
        while (message := self.recv(max(0.01, deadline - time.monotonic()))) is not None:
            seen.append(message)
            assert time.monotonic() < deadline, f"the stream was not ended within {timeout} s: {seen[-3:]}"
        return seen

    def close(self) -> None:
        if self.transport == "ws":
            self._stack.close()
        else:
            self.conn.close()


def test_a_users_cursor_does_not_move_while_another_users_jobs_produce_1000_events(  # type: ignore[no-untyped-def]
    app, server, driver, alice, bob, root
) -> None:
    import time

    app.config["LIVE_HEARTBEAT_S"] = 0.2
    mine, everyone = _Stream(server, "ws", alice.bearer), _Stream(server, "sse", root.bearer)
    try:
        start = mine.next("hello")["cursor"]
        admin_feed = everyone.next("hello")["cursor"][:16]
        theirs = _submit(driver, bob, "busy").id
        driver.start(theirs)
        for i in range(998):
            driver.event(theirs, "step", n=i)
        # Bob's 1,000 events: the admin sees every one, numbered in its own feed.
        seen = [everyone.next() for _ in range(1000)]
        assert {m["job_id"] for m in seen} == {theirs} and seen[-1]["id"] == f"{admin_feed}.1000"
        # Alice saw heartbeats only, all at her start: her cursor tells nothing about bob.
        beats = []
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            message = mine.recv()
            assert message is not None and message["type"] == "heartbeat", message
            beats.append(message["cursor"])
        assert beats and set(beats) == {start}
        own = _submit(driver, alice, "mine").id
        notice = mine.next()
        assert (notice["job_id"], notice["id"]) == (own, f"{start[:16]}.1")
    finally:
        mine.close()
        everyone.close()
    # Resumed after more of bob's events: nothing for alice, her cursor still where it was.
    for i in range(200):
        driver.event(theirs, "more", n=i)
    again = _Stream(server, "sse", alice.bearer, notice["id"])
    try:
        assert again.next("hello")["cursor"] == notice["id"]
        assert again.next("heartbeat") == {"type": "heartbeat", "cursor": notice["id"]}
    finally:
        again.close()


@pytest.mark.parametrize("transport", ["ws", "sse"])
def test_a_token_revoked_mid_stream_ends_it_within_two_seconds(app, server, web_engine, alice, transport) -> None:  # type: ignore[no-untyped-def]
    import time

    import accounts

    stream = _Stream(server, transport, alice.bearer)
    try:
        stream.next("hello")
        (token,) = accounts.list_tokens(web_engine, alice.user.id)
        revoked_at = time.monotonic()
        accounts.revoke_token(web_engine, alice.user.id, token.id)
        last = stream.until_end(timeout=2.0)
        assert time.monotonic() - revoked_at < 2.0
    finally:
        stream.close()
    assert last[-1] == {
        "type": "error",
        "code": "unauthorized",
        "message": "The credentials this feed was opened with are no longer valid.",
    }
    if transport == "ws":
        assert stream.ws.close_code == 1008
    _wait_for_free_slots(app, alice)


def _cookie_headers(app, server: str, person) -> tuple[dict[str, str], object]:  # type: ignore[no-untyped-def]
    client = app.test_client()
    client.environ_base["HTTP_USER_AGENT"] = "tenure-tests"  # "strong" session protection binds the agent
    login(client, person)
    cookie = client.get_cookie("session")
    headers = {"Cookie": f"session={cookie.value}", "User-Agent": "tenure-tests", "Origin": f"http://{server}"}
    return headers, client


@pytest.mark.parametrize("transport", ["ws", "sse"])
def test_logout_ends_the_sessions_stream_and_its_cookie(app, server, alice, transport) -> None:  # type: ignore[no-untyped-def]
    import time

    from .conftest import csrf_token

    headers, client = _cookie_headers(app, server, alice)
    stream = _Stream(server, transport, headers)
    try:
        stream.next("hello")
        logged_out_at = time.monotonic()
        assert client.post("/logout", data={"csrf_token": csrf_token(client, "/tokens")}).status_code == 302
        assert stream.until_end(timeout=2.0)[-1]["code"] == "unauthorized"
        assert time.monotonic() - logged_out_at < 2.0
    finally:
        stream.close()
    # The cookie as it was before the logout (a copy an attacker kept) authenticates nobody any more.
    replay = app.test_client()
    replay.environ_base["HTTP_USER_AGENT"] = "tenure-tests"
    replay.set_cookie("session", headers["Cookie"].split("=", 1)[1])
    assert replay.get("/api/v1/jobs").status_code == 401


@pytest.mark.parametrize("via", ["basic", "session"])
def test_a_password_change_ends_streams_opened_with_the_password(app, server, web_engine, alice, via) -> None:  # type: ignore[no-untyped-def]
    import accounts

    app.config["LIVE_HEARTBEAT_S"] = 0.2
    headers = alice.basic if via == "basic" else _cookie_headers(app, server, alice)[0]
    stream, by_token = _Stream(server, "ws", headers), _Stream(server, "ws", alice.bearer)
    try:
        stream.next("hello")
        by_token.next("hello")
        accounts.set_password(web_engine, alice.user.id, "another long password")
        assert stream.until_end(timeout=2.0)[-1]["code"] == "unauthorized"
        assert by_token.next("heartbeat")["type"] == "heartbeat"  # a token is its own credential
    finally:
        stream.close()
        by_token.close()


def test_a_role_change_or_a_disabled_user_ends_the_stream(app, server, web_engine, root, alice) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy import text

    admin, user = _Stream(server, "sse", root.bearer), _Stream(server, "ws", alice.bearer)
    try:
        admin.next("hello")
        user.next("hello")
        with web_engine.begin() as conn:  # as a role change does (the accounts API is another change's)
            conn.execute(text("UPDATE users SET role = 'user' WHERE id = :id"), {"id": root.user.id})
            conn.execute(text("UPDATE users SET disabled = :t WHERE id = :id"), {"t": True, "id": alice.user.id})
        assert admin.until_end(timeout=2.0)[-1] == {
            "type": "error",
            "code": "forbidden",
            "message": "Your permissions changed; reconnect to go on with the new ones.",
        }
        assert user.until_end(timeout=2.0)[-1]["code"] == "unauthorized"
    finally:
        admin.close()
        user.close()
    # Reconnecting works, with what the new role sees.
    again = _Stream(server, "ws", root.bearer)
    try:
        assert _feed_of(again.next("hello")["cursor"])[1] == 0
    finally:
        again.close()


def test_head_says_whether_a_connection_would_be_admitted(app, server, alice) -> None:  # type: ignore[no-untyped-def]
    import http.client

    def probe() -> http.client.HTTPResponse:
        host, port = server.split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        conn.request("HEAD", "/api/v1/live.sse", headers=alice.bearer)
        response = conn.getresponse()
        conn.close()
        return response

    assert probe().status == 204
    with contextlib.ExitStack() as stack:
        for _ in range(4):
            _next(stack.enter_context(_ws(server, alice.bearer)), "hello")
        refused = probe()
        assert refused.status == 429 and refused.getheader("Retry-After") == "5"
        assert _slots_held(app, alice) == (4, 4)  # a probe takes no slot
    _wait_for_free_slots(app, alice)
    host, port = server.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("HEAD", "/api/v1/live.sse")
    assert conn.getresponse().status == 401


def test_the_identity_limit_holds_across_web_processes(app_config, database_path, alice) -> None:  # type: ignore[no-untyped-def]
    """Two web processes (two apps, two servers) on one database: two connections on each (WebSocket on one,
    SSE on the other: both transports hold their slot while they stream), the fifth refused on either."""
    from jobs.db import make_engine
    from webapp import create_app

    engines = [make_engine(f"sqlite:///{database_path}") for _ in range(2)]
    apps = [create_app({**app_config, "TENURE_ENGINE": e}) for e in engines]
    servers = [_serve(a) for a in apps]
    ports = [f"127.0.0.1:{srv.server_port}" for srv, _ in servers]
    try:
        with contextlib.ExitStack() as stack:
            for port, transport in zip(ports, ("ws", "sse"), strict=True):
                for _ in range(2):
                    held = _Stream(port, transport, alice.bearer)
                    stack.callback(held.close)
                    held.next("hello")
            for port in ports:
                with pytest.raises(InvalidStatus) as refused:
                    with _ws(port, alice.bearer):
                        pass
                assert refused.value.response.status_code == 429
                assert refused.value.response.headers["Retry-After"] == "5"
            assert [a.extensions["tenure"].feed_limits.total for a in apps] == [2, 2]
    finally:
        for srv, thread in servers:
            srv.shutdown()
            thread.join(5)
        for engine in engines:
            engine.dispose()


@pytest.mark.parametrize("transport", ["ws", "sse"])
def test_a_client_that_stops_reading_is_dropped_and_frees_its_slot(app, server, driver, alice, transport) -> None:  # type: ignore[no-untyped-def]
    """A real socket that stops reading: the server's sends block, time out, and the connection ends."""
    import time

    app.config.update(LIVE_SEND_TIMEOUT_S=1.0, LIVE_SEND_BUFFER_BYTES=4096)
    host, port = server.split(":")
    raw = stalled_subscriber(host, int(port), alice.token, transport)
    try:
        deadline = time.monotonic() + 5
        while _slots_held(app, alice)[0] != 1:
            assert time.monotonic() < deadline, f"the connection was never admitted: {_slots_held(app, alice)}"
            time.sleep(0.02)
        # Then it reads nothing more, while the job's notices (a long status line each) pile up.
        job = _submit(driver, alice, "flood").id
        driver.progress(job, 0.1, "x" * 2000)
        for i in range(150):
            driver.event(job, "step", n=i)
        stopped = time.monotonic()
        _wait_for_free_slots(app, alice)
        assert time.monotonic() - stopped < 1.0 + 3.0  # the send timeout, and a poll or two
    finally:
        raw.close()


def test_progress_notices_do_not_miss_a_first_report(app, driver, alice) -> None:  # type: ignore[no-untyped-def]
    """The watcher's baseline is taken before a subscriber's position, and a job that started and
    reported progress between two polls is noticed (a claim clears progress: any value is new)."""
    gateway = app.extensions["tenure"].jobs
    running = _submit(driver, alice, "running").id
    driver.start(running)
    _, position = gateway.progress_notices(None, after=None)  # the first subscriber: the baseline is in
    driver.progress(running, 0.25, "a quarter")  # at once: no poll in between
    started = _submit(driver, alice, "started").id
    driver.progress(started, 0.5, "warming up")  # started and reported since the last poll
    silent = _submit(driver, alice, "silent").id
    driver.start(silent)  # started, reported nothing: its status event is the news
    gateway.progress.poll_once()
    notices, position = gateway.progress_notices(alice.user.owner_id, after=position)
    assert sorted((n.job_id, n.progress, n.message) for n in notices) == sorted(
        [(running, 0.25, "a quarter"), (started, 0.5, "warming up")]
    )
    gateway.progress.poll_once()
    assert gateway.progress_notices(None, after=position)[0] == []  # each change once
