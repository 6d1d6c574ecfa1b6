"""A live-feed subscriber that never reads again: a raw socket with a small receive window, subscribed over
the WebSocket (its first message sends the cursor) or SSE, for tests of the feed's send deadline."""

from __future__ import annotations

import socket


def stalled_subscriber(host: str, port: int, token: str, transport: str) -> socket.socket:
    """A socket subscribed to ``/api/v1/live`` (``ws``) or ``/api/v1/live.sse`` (``sse``) as *token*'s
    identity; the caller never reads from it, so the server's sends soon block."""
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the server's sends block soon
    raw.connect((host, port))
    auth = f"Authorization: Bearer {token}\r\n"
    if transport == "ws":
        raw.sendall(
            f"GET /api/v1/live HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{auth}\r\n".encode()
        )
        assert b" 101 " in raw.recv(4096).split(b"\r\n")[0]
        payload = b'{"cursor": null}'
        raw.sendall(bytes([0x81, 0x80 | len(payload)]) + b"\x00\x00\x00\x00" + payload)  # masked, key 0
    else:
        raw.sendall(f"GET /api/v1/live.sse HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}\r\n".encode())
    return raw
