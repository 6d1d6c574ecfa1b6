"""The live feed: job notices over WebSocket (``/api/v1/live``) and SSE (``/api/v1/live.sse``).

Both transports serve the same stream (docs/api.md, "Live feed"):

- ``hello`` {cursor, heartbeat_s} first; then ``notice`` {id, job_id, type, status, progress,
  message} for every change the caller may see (admins: all jobs; users: their own), oldest first;
  ``heartbeat`` {cursor} every ``LIVE_HEARTBEAT_S`` seconds; ``resync`` {reason, cursor} when the
  requested cursor is older than what is retained (``cursor_expired``) or more than
  ``LIVE_MAX_BACKLOG`` notices are pending (``behind``) — the client then re-reads the REST
  snapshot and carries on from the given cursor.
- Resume: ``Last-Event-ID: C`` (SSE) or a first WebSocket message ``{"cursor": "C"}`` continues after
  C; nothing in between is lost. A WebSocket client always sends that first message (``{"cursor":
  null}`` to start from now) within ``LIVE_SUBSCRIBE_TIMEOUT_S``; the feed answers ``hello`` only
  then. Query parameters are refused (400): a cursor, like any credential, never travels in the URL.
  The cursor in heartbeats advances past notices the caller may not see.
  Cursors are the job layer's change cursors (opaque tokens: ``123`` on SQLite, ``xid.id`` on
  PostgreSQL), valid in every web process on every host. Progress notices (progress writes no
  event) are best-effort: they carry the current cursor and are not replayed.
- Everything but the WebSocket's cursor is decided BEFORE the upgrade, as plain HTTP: 400 for a
  query string, 401 without valid credentials, 403 for a cookie session from a foreign ``Origin``
  (CSRF tokens do not cover WebSocket handshakes), 429 with ``Retry-After`` when the process
  (``LIVE_MAX_CONNECTIONS``) or the identity (``LIVE_MAX_PER_IDENTITY``) has no free slot. A first
  WebSocket message that is no ``{"cursor": …}`` object (or none in time) gets an ``error`` message
  {code, message} and the close code 1008.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from flask import Blueprint, Response, current_app, g, request, stream_with_context
from flask_sock import Sock
from simple_websocket import Server as WebSocketServer

from .auth import origin_allowed
from .errors import ApiError, Forbidden, Invalid, TooManyRequests
from .gateway import CursorExpired
from .jobs_adapter import JobLayerGateway
from .permissions import require
from .services import services

bp = Blueprint("live", __name__, url_prefix="/api/v1")
sock = Sock()


@dataclass
class Feed:
    """One subscriber's position in the notice stream; transport-independent."""

    gateway: JobLayerGateway
    scope: str | None
    cursor: str | None
    max_backlog: int
    pending: list[dict[str, Any]] = field(default_factory=list)
    #: Position in the gateway's best-effort progress notices (per process; never sent to the client).
    progress_pos: int | None = None

    def start(self) -> list[dict[str, Any]]:
        _, self.progress_pos = self._progress(None)
        if self.cursor is None:
            self.cursor = self.gateway.head()
            return [self._hello()]
        hello = self._hello()
        try:
            return [hello, *self.poll(raise_unknown=True)]
        except CursorExpired as exc:
            # A cursor this database never handed out (another database, a reset one): start at the head.
            self.cursor = exc.head
            return [self._hello(), self._resync("cursor_unknown", exc.head)]

    def poll(self, *, raise_unknown: bool = False) -> list[dict[str, Any]]:
        assert self.cursor is not None
        try:
            notices, scanned = self.gateway.notices(self.scope, after=self.cursor, limit=self.max_backlog + 1)
        except CursorExpired as exc:
            if exc.unknown and raise_unknown:
                raise
            self.cursor = exc.head
            return [self._resync("cursor_unknown" if exc.unknown else "cursor_expired", exc.head)]
        if len(notices) > self.max_backlog:
            head = self.gateway.head()
            self.cursor = head
            return [self._resync("behind", head)]
        messages = [self._notice(n, n.id) for n in notices]
        self.cursor = scanned
        # Progress writes no event: these notices are best-effort and carry the current cursor, so a
        # client that records their id resumes exactly where the durable stream stands.
        progress, self.progress_pos = self._progress(self.progress_pos)
        messages.extend(self._notice(n, self.cursor) for n in progress)
        return messages

    def _progress(self, after: int | None) -> tuple[list[Any], int | None]:
        return self.gateway.progress_notices(self.scope, after=after)

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
        }

    def heartbeat(self) -> dict[str, Any]:
        return {"type": "heartbeat", "cursor": self.cursor}

    def _hello(self) -> dict[str, Any]:
        return {"type": "hello", "cursor": self.cursor, "heartbeat_s": current_app.config["LIVE_HEARTBEAT_S"]}

    @staticmethod
    def _resync(reason: str, head: str) -> dict[str, Any]:
        return {"type": "resync", "reason": reason, "cursor": head}


_CURSOR = re.compile(r"\d{1,19}(\.\d{1,19})?")
#: WebSocket close code for a first message the feed cannot take (RFC 6455: policy violation).
CLOSE_POLICY_VIOLATION = 1008


def _parse_cursor(raw: Any) -> str | None:
    """A resume cursor as the client gave it (``None``/``""``: from now); raises :class:`Invalid`."""
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str) or not _CURSOR.fullmatch(raw):
        raise Invalid("cursor must be a cursor the feed sent (digits, or digits.digits).")
    return raw


@bp.before_request
def _admit() -> None:
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
    if not services().feed_limits.acquire(identity.key):
        retry_after = str(int(current_app.config["LIVE_RETRY_AFTER_S"]))
        raise TooManyRequests("Too many live connections.", headers={"Retry-After": retry_after})
    g.live_slot = identity.key


@bp.teardown_request
def _release(_exc: BaseException | None) -> None:
    # Runs when the WebSocket handler returns, or when the SSE stream ends (stream_with_context).
    slot = g.pop("live_slot", None)
    if slot is not None:
        services().feed_limits.release(slot)


def _feed(cursor: str | None) -> Feed:
    return Feed(
        gateway=services().jobs,
        scope=g.identity.scope,
        cursor=cursor,
        max_backlog=int(current_app.config["LIVE_MAX_BACKLOG"]),
    )


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


def _close(ws: WebSocketServer, code: int, message: str) -> None:
    """Send the close frame, then end the TCP connection as well.

    ``Server.close()`` closes the socket while simple-websocket's reader thread is blocked in ``recv`` on
    it; on Linux that neither wakes the thread nor sends FIN, so a client that answered the close frame
    waits for a TCP close that never comes (seen as a refused subscriber hanging in CLOSING). A shutdown
    wakes the reader and sends FIN."""
    super(WebSocketServer, ws).close(reason=code, message=message)  # the frame, without closing the socket
    with contextlib.suppress(OSError):
        ws.sock.shutdown(socket.SHUT_RDWR)
    ws.sock.close()


@sock.route("/live", bp=bp)
def live_ws(ws: Any) -> None:
    """WebSocket transport: JSON text frames. The client's first frame carries the cursor; later ones are ignored."""
    try:
        cursor = _first_message_cursor(ws)
    except Invalid as exc:
        ws.send(json.dumps({"type": "error", "code": exc.code, "message": exc.message}))
        _close(ws, CLOSE_POLICY_VIOLATION, exc.message[:120])
        return
    feed = _feed(cursor)
    poll_s = float(current_app.config["LIVE_POLL_S"])
    beat_s = float(current_app.config["LIVE_HEARTBEAT_S"])
    for message in feed.start():
        ws.send(json.dumps(message))
    last_beat = time.monotonic()
    while True:
        ws.receive(timeout=poll_s)  # raises ConnectionClosed when the client goes away
        for message in feed.poll():
            ws.send(json.dumps(message))
        if time.monotonic() - last_beat >= beat_s:
            ws.send(json.dumps(feed.heartbeat()))
            last_beat = time.monotonic()


def _sse(message: dict[str, Any]) -> str:
    ident = message.get("id", message.get("cursor"))
    head = f"id: {ident}\n" if ident is not None else ""
    return f"{head}event: {message['type']}\ndata: {json.dumps(message)}\n\n"


@bp.route("/live.sse")
def live_sse() -> Response:
    """Server-Sent Events transport (``curl -N``, ``EventSource``); resumes from ``Last-Event-ID``."""
    feed = _feed(g.live_cursor)
    poll_s = float(current_app.config["LIVE_POLL_S"])
    beat_s = float(current_app.config["LIVE_HEARTBEAT_S"])

    def stream() -> Iterator[str]:
        yield "retry: 3000\n\n"
        for message in feed.start():
            yield _sse(message)
        last_beat = time.monotonic()
        while True:
            time.sleep(poll_s)
            for message in feed.poll():
                yield _sse(message)
            if time.monotonic() - last_beat >= beat_s:
                # A write per heartbeat is also how a vanished client is noticed (GeneratorExit).
                yield _sse(feed.heartbeat())
                last_beat = time.monotonic()

    return Response(
        stream_with_context(stream()),
        mimetype="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
