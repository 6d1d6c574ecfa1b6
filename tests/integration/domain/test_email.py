"""Email through a local aiosmtpd server with STARTTLS and AUTH required."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tasks.domain.notify.mail import Email, SmtpConfig, send_email
from tasks.domain.notify.secret import Secret

from .receivers import free_port, tls_contexts

PASSWORD = "s3cret-Pa55word"


@dataclass
class Handler:
    """Stores accepted messages; some recipients are refused with 452 (retry) or 550 (dead)."""

    messages: list = field(default_factory=list)
    drop_during_data: bool = False

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # noqa: N802 - aiosmtpd hook
        if address.startswith("full@"):
            return "452 4.2.2 Mailbox full"
        if address.startswith("nobody@"):
            return "550 5.1.1 No such user"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd hook
        if self.drop_during_data:
            server.transport.close()  # the server dies after receiving the message: outcome unknown
            return "421 closing"
        self.messages.append((session.authenticated, bool(session.ssl), envelope))
        return "250 2.0.0 Queued"


def authenticate(server, session, envelope, mechanism, auth_data) -> AuthResult:
    ok = isinstance(auth_data, LoginPassword) and auth_data.password == PASSWORD.encode()
    return AuthResult(success=ok, handled=False)


@dataclass
class SmtpServer:
    handler: Handler
    port: int
    client_context: ssl.SSLContext

    def config(self, password: str = PASSWORD, **kwargs) -> SmtpConfig:
        return SmtpConfig(
            "127.0.0.1",
            self.port,
            username="tenure",
            password=Secret(password),
            ssl_context=self.client_context,
            timeout_s=10,
            **kwargs,
        )


@pytest.fixture()
def smtp_server() -> Iterator[SmtpServer]:
    server_ctx, client_ctx = tls_contexts()
    handler = Handler()
    port = free_port()
    controller = Controller(
        handler,
        hostname="127.0.0.1",
        port=port,
        tls_context=server_ctx,
        require_starttls=True,
        authenticator=authenticate,
        auth_required=True,
    )
    controller.start()
    try:
        yield SmtpServer(handler, port, client_ctx)
    finally:
        controller.stop()


EMAIL = Email(
    sender="tenure@example.test",
    to=("ops@example.test",),
    subject="渲染完成 · clip ready",
    text="Your clip is ready.",
    html="<p>Your clip is <b>ready</b>.</p>",
    message_id="<job-42.notify@tenure.local>",
)


def test_email_delivered_over_starttls_with_auth(smtp_server: SmtpServer) -> None:
    outcome = send_email(smtp_server.config(), EMAIL)
    assert (outcome.status, outcome.code, outcome.message_id) == ("delivered", 250, "<job-42.notify@tenure.local>")
    [(authenticated, over_tls, envelope)] = smtp_server.handler.messages
    assert authenticated and over_tls
    assert envelope.rcpt_tos == ["ops@example.test"]
    content = envelope.content.decode()
    assert "Message-ID: <job-42.notify@tenure.local>" in content and "=?utf-8?" in content  # RFC 2047 subject


def test_wrong_password_is_dead_and_never_echoed(smtp_server: SmtpServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    config = smtp_server.config(password="wrong-Pa55word-123")
    outcome = send_email(config, EMAIL)
    assert (outcome.status, outcome.code) == ("dead", 535)
    for text in (caplog.text, repr(outcome), repr(config)):
        assert "wrong-Pa55word-123" not in text and PASSWORD not in text


def test_recipient_refusals_map_to_retry_and_dead(smtp_server: SmtpServer) -> None:
    full = send_email(smtp_server.config(), Email("a@example.test", ("full@example.test",), "s", "t"))
    assert (full.status, full.code) == ("retry", 452)
    unknown = send_email(smtp_server.config(), Email("a@example.test", ("nobody@example.test",), "s", "t"))
    assert (unknown.status, unknown.code) == ("dead", 550)
    assert smtp_server.handler.messages == []


def test_connection_lost_during_data_is_unknown_not_retry(smtp_server: SmtpServer) -> None:
    smtp_server.handler.drop_during_data = True
    outcome = send_email(smtp_server.config(), EMAIL)
    assert outcome.status == "unknown"  # may have been delivered: the job layer parks it, never re-sends


def test_plaintext_server_without_starttls_gets_no_credentials() -> None:
    handler = Handler()
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        config = SmtpConfig("127.0.0.1", port, username="tenure", password=Secret(PASSWORD), timeout_s=10)
        outcome = send_email(config, EMAIL)
    finally:
        controller.stop()
    assert outcome.status == "dead" and "STARTTLS" in (outcome.error or "")


def test_nothing_listening_is_retry() -> None:
    outcome = send_email(SmtpConfig("127.0.0.1", free_port(), timeout_s=2), EMAIL)
    assert outcome.status == "retry" and "ConnectionRefusedError" in (outcome.error or "")
