"""The live feed: job notices over WebSocket (``/api/v1/live``) and SSE (``/api/v1/live.sse``).

Both transports serve the same stream (docs/api.md, "Live feed"):

- ``hello`` {cursor, heartbeat_s} first; then ``notice`` {id, job_id, kind, status, progress,
  message, sequence} for every change the caller may see (:func:`visibility`: admins all jobs, users
  their own), oldest first; ``heartbeat`` {cursor} after ``LIVE_HEARTBEAT_S`` seconds without
  another message; ``resync`` {reason, cursor} when the stream cannot continue exactly from a cursor
  — ``cursor_unknown`` (not one of this identity's feeds), ``cursor_expired`` (retention deleted
  events after it) or ``behind`` (more than ``LIVE_MAX_BACKLOG`` notices pending): the client
  re-reads the REST snapshot and carries on from the new cursor.
- Cursors are per identity (:mod:`jobs.feeds`): ``<feed>.<n>``, a random feed id and the number of
  notices that feed has delivered. Starting from now opens a new feed; other identities' activity
  never moves a cursor (a heartbeat repeats the last notice's), so it tells nothing about them. A
  cursor resumes in every web process on every host, gap-free and duplicate-free, and only for the
  identity whose feed it is (with the same visibility). Progress notices (progress writes no event)
  are best-effort: they carry the current cursor and are not replayed.
- Resume: ``Last-Event-ID: C`` (SSE) or a first WebSocket message ``{"cursor": "C"}`` continues after
  C. A WebSocket client always sends that first message (``{"cursor": null}`` to start from now)
  within ``LIVE_SUBSCRIBE_TIMEOUT_S``; the feed answers ``hello`` only then. Query parameters are
  refused (400): a cursor, like any credential, never travels in the URL.
- Everything but the WebSocket's cursor is decided BEFORE the upgrade, as plain HTTP: 400 for a
  query string, 401 without valid credentials, 403 for a cookie session from a foreign ``Origin``
  (CSRF tokens do not cover WebSocket handshakes), 429 with ``Retry-After`` when this process
  (``LIVE_MAX_CONNECTIONS``) or the identity across every web process (``LIVE_MAX_PER_IDENTITY``,
  :mod:`webapp.live_limits`) has no free slot. ``HEAD /api/v1/live.sse`` answers the same checks
  without connecting (204 when a connection would be admitted now): a browser cannot read a refused
  WebSocket handshake's status, so the UI asks this way how long to wait. A first WebSocket message
  that is no ``{"cursor": …}`` object (or none in time) gets an ``error`` message {code, message} and
  the close code 1008.
- While open, every ``LIVE_REAUTH_S`` the stream checks the credential it was admitted with
  (:func:`accounts.sessions.credential_user`: a logout, a password change, a revoked token or a
  disabled user end it) and the caller's visibility (a role change ends it): an ``error`` message
  {code: ``unauthorized`` | ``forbidden``, message}, then the end of the stream (close code 1008 on
  a WebSocket). It renews its connection slot every third of ``LIVE_SLOT_TTL_S``; a slot that expired
  meanwhile (the loop stalled that long) ends it too (``too_many_requests``).
- A message that cannot be written within ``LIVE_SEND_TIMEOUT_S`` (a client that stopped reading, once
  ``LIVE_SEND_BUFFER_BYTES`` of kernel buffer are full) ends the connection and frees its slot; an SSE
  client that closed its end is noticed at the next poll.
- When its web process begins a graceful shutdown (:func:`end_streams`, chained to gunicorn's SIGTERM in
  ``gunicorn.conf.py``), every open stream ends at its next poll: a WebSocket with close code 1012
  (service restart), an SSE response by its end. The shutdown does not wait out gunicorn's graceful
  timeout for them, and their clients resume with their cursor on another process.
"""

from __future__ import annotations

import contextlib
import json
import re
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Response, current_app, g, request, session, stream_with_context
from flask_sock import Sock
from simple_websocket import ConnectionClosed
from simple_websocket import Server as WebSocketServer
from wsproto.events import TextMessage

from accounts import sessions

from .auth import SESSION_SECRET, Identity, origin_allowed
from .errors import ApiError, Forbidden, Invalid, TooManyRequests, Unauthorized
from .gateway import FeedLost
from .live_limits import Slot
from .permissions import require
from .services import services

bp = Blueprint("live", __name__, url_prefix="/api/v1")
sock = Sock()

_CURSOR = re.compile(r"[0-9a-z]{16}\.\d{1,18}")
#: WebSocket close code for a first message the feed cannot take, or a stream whose caller lost the
#: right to it (RFC 6455: policy violation).
CLOSE_POLICY_VIOLATION = 1008
#: How long a dropped WebSocket's reader thread gets to notice the end (it needs a wake-up and a recv).
READER_EXIT_S = 1.0
#: WebSocket close code for a stream ended by its web process's shutdown (IANA registry: service restart).
CLOSE_SERVICE_RESTART = 1012

#: Set once this process begins a graceful shutdown: an open stream ends at its next poll instead of
#: holding the shutdown until gunicorn's graceful timeout drops it.
_shutting_down = threading.Event()


def end_streams() -> None:
    """End every live stream of this process at its next poll (called when a graceful shutdown begins)."""
    _shutting_down.set()


def visibility(identity: Identity) -> str | None:
    """The one permission question of the live feed: whose jobs' notices *identity* may see — an owner
    id, or ``None`` for every job. Asked at admission and again on every re-check."""
    return identity.scope


@dataclass(frozen=True)
class Admission:
    """What the handshake decided: who, with which credential, seeing what, in which slot."""

    identity: Identity
    credential: sessions.Credential
    visibility: str | None
    slot: Slot


def _parse_cursor(raw: Any) -> str | None:
    """A resume cursor as the client gave it (``None``/``""``: from now); raises :class:`Invalid`."""
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str) or not _CURSOR.fullmatch(raw):
        raise Invalid("cursor must be a cursor the feed sent (<feed>.<n>).")
    return raw


def _credential(identity: Identity) -> sessions.Credential:
    """The credential this request authenticated with, to check again while the stream runs."""
    user_id = identity.user.id
    if identity.via == "session":
        secret = session.get(SESSION_SECRET)
        if not isinstance(secret, str):
            raise Unauthorized()
        return sessions.session_credential(user_id, secret)
    credentials = request.headers.get("Authorization", "").partition(" ")[2].strip()
    if identity.via == "token":
        return sessions.token_credential(user_id, credentials)
    credential = sessions.basic_credential(services().engine, user_id)
    if credential is None:
        raise Unauthorized()
    return credential


def _reidentify(engine: Any, admission: Admission) -> Identity | None:
    """Who the stream's credential stands for now (``None``: no one any more), as the request that opened
    it would be identified today."""
    found = sessions.credential_user(engine, admission.credential)
    if found is None:
        return None
    user, permissions = found
    return Identity(user, admission.identity.via, admission.identity.token, permissions)


@bp.before_request
def _admit() -> Response | None:
    """Refuse query parameters, authenticate, check Origin and take a connection slot — all before any upgrade."""
    if request.query_string:
        raise ApiError(
            "The live feed takes no query parameters: resume with the Last-Event-ID header (SSE) "
            'or the first WebSocket message {"cursor": …}.'
        )
    identity = require("jobs.read_own")
    assert identity is not None
    if identity.via == "session" and not origin_allowed():
        raise Forbidden("Origin not allowed.")
    if request.endpoint == "live.live_sse":
        g.live_cursor = _parse_cursor(request.headers.get("Last-Event-ID"))
    credential = _credential(identity)
    limits = services().feed_limits
    retry_after = {"Retry-After": str(int(current_app.config["LIVE_RETRY_AFTER_S"]))}
    if request.method == "HEAD":  # the same checks, connecting nothing
        if not limits.available(identity.key):
            raise TooManyRequests("Too many live connections.", headers=retry_after)
        return Response(status=204)
    slot = limits.acquire(identity.key)
    if slot is None:
        raise TooManyRequests("Too many live connections.", headers=retry_after)
    g.live = Admission(identity, credential, visibility(identity), slot)
    return None


@bp.teardown_request
def _release(_exc: BaseException | None) -> None:
    # Runs when the WebSocket handler returns (or the request failed before a handler took the slot).
    # Not the end of an SSE stream: Flask tears the request down once the view has returned its
    # response, before the stream is read; live_sse hands its slot to the response instead.
    admission = g.pop("live", None)
    if admission is not None:
        services().feed_limits.release(admission.slot)


class Stream:
    """One subscriber's stream, transport-independent: what to send next, and whether to go on."""

    def __init__(self, admission: Admission, cursor: str | None) -> None:
        cfg = current_app.config
        self.admission = admission
        self.cursor = cursor
        self.gateway = services().jobs
        self.limits = services().feed_limits
        self.engine = services().engine
        self.max_backlog = int(cfg["LIVE_MAX_BACKLOG"])
        self.heartbeat_s = float(cfg["LIVE_HEARTBEAT_S"])
        self.reauth_s = float(cfg["LIVE_REAUTH_S"])
        self.feed: Any = None
        #: Position in the gateway's best-effort progress notices (per process; never sent to the client).
        self.progress_pos: int | None = None
        now = time.monotonic()
        self._beat_at = self._checked_at = self._renewed_at = now

    @property
    def _subscriber(self) -> str:
        return self.admission.identity.key

    def start(self) -> list[dict[str, Any]]:
        _, self.progress_pos = self.gateway.progress_notices(self.admission.visibility, after=None)
        if self.cursor is None:
            self.feed = self.gateway.open_feed(self._subscriber, self.admission.visibility)
            return [self._hello()]
        try:
            self.feed = self.gateway.resume_feed(self.cursor, self._subscriber, self.admission.visibility)
        except FeedLost as lost:
            self.feed = self.gateway.open_feed(self._subscriber, self.admission.visibility)
            return [self._hello(), self._resync(lost.reason)]
        return [self._hello(), *self.poll()]

    def poll(self) -> list[dict[str, Any]]:
        """The notices since the last poll (or a resync), and a heartbeat when one is due."""
        visible = self.admission.visibility
        try:
            notices = self.gateway.feed_notices(self.feed, limit=self.max_backlog + 1)
        except FeedLost as lost:
            return [self._restart(lost.reason)]
        if len(notices) > self.max_backlog:
            return [self._restart("behind")]
        messages = [self._notice(n, n.id) for n in notices]
        # Progress writes no event: these notices are best-effort and carry the current cursor, so a
        # client that records their id resumes exactly where the feed stands.
        progress, self.progress_pos = self.gateway.progress_notices(visible, after=self.progress_pos)
        messages.extend(self._notice(n, self.feed.cursor) for n in progress)
        self.gateway.mark_feed(self.feed, now_ms=int(time.time() * 1000))
        now = time.monotonic()
        if messages:
            self._beat_at = now
        elif now - self._beat_at >= self.heartbeat_s:
            messages.append({"type": "heartbeat", "cursor": self.feed.cursor})
            self._beat_at = now
        return messages

    def check(self) -> dict[str, Any] | None:
        """Every ``LIVE_REAUTH_S``: is the caller still who it was, allowed what it was? ``None`` to go on,
        else the ``error`` message that ends the stream. Renews the connection's slot when due."""
        now = time.monotonic()
        if now - self._renewed_at >= self.limits.renew_every_s:
            self._renewed_at = now
            if not self.limits.renew(self.admission.slot):
                return _error("too_many_requests", "This connection's slot expired; reconnect.")
        if now - self._checked_at < self.reauth_s:
            return None
        self._checked_at = now
        identity = _reidentify(self.engine, self.admission)
        if identity is None:
            return _error("unauthorized", "The credentials this feed was opened with are no longer valid.")
        if visibility(identity) != self.admission.visibility:
            return _error("forbidden", "Your permissions changed; reconnect to go on with the new ones.")
        return None

    def close(self) -> None:
        """Record where the feed stands (so that resuming its last cursor counts nothing)."""
        if self.feed is not None:
            self.gateway.mark_feed(self.feed)

    def _restart(self, reason: str) -> dict[str, Any]:
        self.feed = self.gateway.open_feed(self._subscriber, self.admission.visibility)
        return self._resync(reason)

    @staticmethod
    def _notice(n: Any, ident: str) -> dict[str, Any]:
        return {
            "type": "notice",
            "id": ident,
            "job_id": n.job_id,
            "kind": n.type,
            "status": n.status,
            "progress": n.progress,
            "message": n.message,
            "sequence": n.sequence,
        }

    def _hello(self) -> dict[str, Any]:
        return {"type": "hello", "cursor": self.feed.cursor, "heartbeat_s": self.heartbeat_s}

    def _resync(self, reason: str) -> dict[str, Any]:
        return {"type": "resync", "reason": reason, "cursor": self.feed.cursor}


def _error(code: str, message: str) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message}


def _bound_sends(sock_: socket.socket, *, blocking_timeout: bool) -> None:
    """A bounded kernel send buffer, and sends that give up after ``LIVE_SEND_TIMEOUT_S``.

    *blocking_timeout*: the WebSocket's socket stays blocking (simple-websocket's reader thread waits in
    ``recv``): ``SO_SNDTIMEO`` bounds the library's own sends (pings, pongs, the close frame), and
    :func:`_send` writes the feed's frames against a deadline. Otherwise (SSE) the socket's timeout,
    which bounds each ``sendall`` of the server as a whole, and which servers report as a dropped
    connection."""
    cfg = current_app.config
    timeout = float(cfg["LIVE_SEND_TIMEOUT_S"])
    with contextlib.suppress(OSError):
        sock_.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, int(cfg["LIVE_SEND_BUFFER_BYTES"]))
    if blocking_timeout:
        seconds = int(timeout)
        sock_.setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("@ll", seconds, int((timeout - seconds) * 1e6))
        )
    else:
        sock_.settimeout(timeout)


def _first_message_cursor(ws: Any) -> str | None:
    """The cursor of the client's first WebSocket message ``{"cursor": C | null}``; raises :class:`Invalid`."""
    raw = ws.receive(timeout=float(current_app.config["LIVE_SUBSCRIBE_TIMEOUT_S"]))
    if raw is None:
        raise Invalid('Send {"cursor": <the last cursor you saw, or null>} as the first message.')
    try:
        message = json.loads(raw)
    except (TypeError, ValueError):
        message = None
    if not isinstance(message, dict):
        raise Invalid('The first message must be a JSON object {"cursor": <cursor or null>}.')
    return _parse_cursor(message.get("cursor"))


def _send(ws: WebSocketServer, message: dict[str, Any]) -> None:
    """One JSON text frame, written whole within ``LIVE_SEND_TIMEOUT_S`` or :class:`TimeoutError`.

    A deadline for the whole frame, not a timeout per ``send``: a client that stopped reading still
    opens its window by a few bytes now and then, and a per-call timeout would wait again after each."""
    if not ws.connected:
        raise ConnectionClosed(ws.close_reason, ws.close_message)
    data = memoryview(ws.ws.send(TextMessage(data=json.dumps(message))))
    deadline = time.monotonic() + float(current_app.config["LIVE_SEND_TIMEOUT_S"])
    poller = select.poll()
    poller.register(ws.sock, select.POLLOUT)
    while data:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not poller.poll(remaining * 1000):
            raise TimeoutError("the client took no data for LIVE_SEND_TIMEOUT_S")
        with contextlib.suppress(BlockingIOError):
            data = data[ws.sock.send(data, socket.MSG_DONTWAIT) :]


def _close(ws: WebSocketServer, code: int, message: str) -> None:
    """Send the close frame, then end the TCP connection as well.

    ``Server.close()`` closes the socket while simple-websocket's reader thread is blocked in ``recv`` on
    it; on Linux that neither wakes the thread nor sends FIN, so a client that answered the close frame
    waits for a TCP close that never comes (seen as a refused subscriber hanging in CLOSING). A shutdown
    wakes the reader and sends FIN."""
    with contextlib.suppress(OSError, ConnectionClosed):
        super(WebSocketServer, ws).close(reason=code, message=message)  # the frame, without closing the socket
    _drop(ws)


def _drop(ws: WebSocketServer) -> None:
    """End the TCP connection without a closing handshake (the client is not reading).

    simple-websocket's reader thread, which is no daemon (a process cannot exit while it runs), waits in
    ``select`` on the socket until its next ping (25 s). The shutdown wakes it, but only if the socket is
    still open when it looks: closing drops the socket from its ``select`` set. So the reader is given
    the moment it needs to see the end and exit before the socket is closed."""
    ws.connected = False
    with contextlib.suppress(OSError):
        ws.sock.shutdown(socket.SHUT_RDWR)
    ws.thread.join(READER_EXIT_S)
    ws.sock.close()


@sock.route("/live", bp=bp)
def live_ws(ws: Any) -> None:
    """WebSocket transport: JSON text frames. The client's first frame carries the cursor; later ones are ignored."""
    _bound_sends(ws.sock, blocking_timeout=True)
    try:
        cursor = _first_message_cursor(ws)
    except Invalid as exc:
        with contextlib.suppress(OSError):
            _send(ws, _error(exc.code, exc.message))
        _close(ws, CLOSE_POLICY_VIOLATION, exc.message[:120])
        return
    stream = Stream(g.live, cursor)
    poll_s = float(current_app.config["LIVE_POLL_S"])
    try:
        for message in stream.start():
            _send(ws, message)
        next_poll = time.monotonic() + poll_s
        while True:
            # Client frames are ignored; waiting on them is how a closed connection is noticed.
            ws.receive(timeout=max(0.0, next_poll - time.monotonic()))  # raises ConnectionClosed
            if time.monotonic() < next_poll:
                continue
            next_poll = time.monotonic() + poll_s
            if _shutting_down.is_set():
                _close(ws, CLOSE_SERVICE_RESTART, "The server is restarting; reconnect with your cursor.")
                return
            ended = stream.check()
            if ended is not None:
                _send(ws, ended)
                _close(ws, CLOSE_POLICY_VIOLATION, ended["message"][:120])
                return
            for message in stream.poll():
                _send(ws, message)
    except OSError:  # a send that could not proceed for LIVE_SEND_TIMEOUT_S, or a broken connection
        _drop(ws)
    finally:
        stream.close()


def _peer_closed(sock_: socket.socket) -> bool:
    """Whether the client closed its end of an SSE connection (it sends nothing else: a readable socket
    that has no byte to peek at is at its end)."""
    try:
        readable, _, _ = select.select([sock_], [], [], 0)
        return bool(readable) and sock_.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _sse(message: dict[str, Any]) -> str:
    ident = message.get("id", message.get("cursor"))
    head = f"id: {ident}\n" if ident is not None else ""
    return f"{head}event: {message['type']}\ndata: {json.dumps(message)}\n\n"


@bp.route("/live.sse")
def live_sse() -> Response:
    """Server-Sent Events transport (``curl -N``, ``EventSource``); resumes from ``Last-Event-ID``."""
    raw_socket = request.environ.get("gunicorn.socket") or request.environ.get("werkzeug.socket")
    if raw_socket is not None:
        _bound_sends(raw_socket, blocking_timeout=False)
    admission: Admission = g.live
    stream = Stream(admission, g.live_cursor)
    poll_s = float(current_app.config["LIVE_POLL_S"])
    limits = services().feed_limits

    def events() -> Iterator[str]:
        try:
            yield "retry: 3000\n\n"
            for message in stream.start():
                yield _sse(message)
            while True:
                time.sleep(poll_s)
                if raw_socket is not None and _peer_closed(raw_socket):
                    return  # noticed now, not at the next write (which may be a heartbeat away)
                if _shutting_down.is_set():
                    return  # EventSource reconnects by itself (retry: 3000), with Last-Event-ID
                ended = stream.check()
                if ended is not None:
                    yield _sse(ended)
                    return
                # A write per heartbeat at least is also how a vanished client is noticed (GeneratorExit).
                for message in stream.poll():
                    yield _sse(message)
        finally:
            stream.close()

    response = Response(
        stream_with_context(events()),
        mimetype="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
    # The server closes the response when the stream ends, however it ends (even unread): the slot is
    # the response's from here on, not the request's.
    response.call_on_close(lambda: limits.release(admission.slot))
    g.pop("live")
    return response
