"""Local test servers on 127.0.0.1: a Standard Webhooks receiver and an aiosmtpd SMTP server with STARTTLS."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import standardwebhooks


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    verified: bool
    error: str | None


@dataclass
class WebhookReceiver:
    """Scripted responses per path (consumed in order, then the default); verifies every signature."""

    secret: str
    server: ThreadingHTTPServer | None = None
    received: list[Received] = field(default_factory=list)
    script: dict[str, list[tuple[int, dict[str, str]]]] = field(default_factory=lambda: defaultdict(list))
    default: dict[str, int] = field(default_factory=dict)
    delay_s: dict[str, float] = field(default_factory=dict)

    def url(self, path: str) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def count(self, path: str) -> int:
        return sum(1 for r in self.received if r.path == path)

    def start(self) -> WebhookReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    standardwebhooks.Webhook(receiver.secret).verify(body, headers)
                    verified, error = True, None
                except (standardwebhooks.WebhookVerificationError, ValueError) as exc:
                    verified, error = False, str(exc)
                receiver.received.append(Received(self.path, headers, body, verified, error))
                time.sleep(receiver.delay_s.get(self.path, 0.0))
                queue = receiver.script[self.path]
                status, extra = queue.pop(0) if queue else (receiver.default.get(self.path, 204), {})
                try:
                    self.send_response(status)
                    for k, v in extra.items():
                        self.send_header(k, v)
                    self.send_header("content-length", "0")
                    self.end_headers()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and went away

            def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tls_contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts from a throw-away CA; the certificate has SAN IP:127.0.0.1."""
    import trustme

    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client
