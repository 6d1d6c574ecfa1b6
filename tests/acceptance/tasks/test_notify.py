"""Notification jobs through a real worker: Standard Webhooks with Retry-After and 410, email over STARTTLS."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator

import pytest
import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tasks.domain.notify.signing import new_secret
from tests.integration.domain.receivers import WebhookReceiver, free_port

from .conftest import Fleet

SMTP_PASSWORD = "smtp-Pa55word-for-tests"


@pytest.fixture()
def receiver() -> Iterator[WebhookReceiver]:
    r = WebhookReceiver(new_secret().reveal()).start()
    try:
        yield r
    finally:
        r.stop()


class MailHandler:
    def __init__(self) -> None:
        self.messages: list[tuple[bool, bool, object]] = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd hook
        self.messages.append((session.authenticated, bool(session.ssl), envelope))
        return "250 2.0.0 Queued"


def channels_file(fleet: Fleet, channels: dict) -> None:
    path = fleet.tmp / "channels.json"
    path.write_text(json.dumps(channels), encoding="utf-8")
    path.chmod(0o600)
    fleet.env_extra["TENURE_NOTIFY_CHANNELS"] = str(path)


def secret_nowhere(fleet: Fleet, job_id: str, secret: str) -> None:
    """The secret is in no payload, event, error or worker log."""
    [(payload, config, error)] = fleet.sql("SELECT payload, config, error FROM jobs WHERE id = :j", j=job_id)
    events = fleet.sql("SELECT data FROM job_events WHERE job_id = :j", j=job_id)
    for text in (payload, config, error or "", *(e.data for e in events), fleet.logs()):
        assert secret not in text


@pytest.mark.timeout(90)
def test_webhook_503_with_retry_after_then_delivered_keeps_its_id(fleet: Fleet, receiver: WebhookReceiver) -> None:
    # Given a receiver that answers 503 + Retry-After: 3 once, then 204
    channels_file(fleet, {"hook": {"type": "webhook", "url": receiver.url("/hook"), "secret": receiver.secret}})
    receiver.script["/hook"].append((503, {"Retry-After": "3"}))
    fleet.worker("main", ("notify",))

    job = fleet.wait_terminal(
        fleet.submit("notify_webhook", {"channel": "hook", "event_type": "clip.ready", "data": {"clip": "c1"}}).id, 60
    )

    # Then the job's second attempt delivered it, no sooner than Retry-After, with the same webhook-id
    assert job.status == "succeeded", job.error
    assert job.attempt == 2 and job.result["http_status"] == 204
    first, second = receiver.received
    assert first.verified and second.verified
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == f"msg_{job.id}"
    assert first.body == second.body and json.loads(second.body)["data"] == {"clip": "c1"}
    attempts = [e for e in fleet.events(job.id) if e.type == "delivery_attempt"]
    assert [e.data["status"] for e in attempts] == ["retry", "delivered"]
    assert (attempts[1].created_at - attempts[0].created_at).total_seconds() >= 2.9
    secret_nowhere(fleet, job.id, receiver.secret)


@pytest.mark.timeout(60)
def test_webhook_410_fails_the_job_and_disables_the_endpoint(fleet: Fleet, receiver: WebhookReceiver) -> None:
    channels_file(fleet, {"hook": {"type": "webhook", "url": receiver.url("/gone"), "secret": receiver.secret}})
    receiver.default["/gone"] = 410
    fleet.worker("main", ("notify",))

    job = fleet.wait_terminal(fleet.submit("notify_webhook", {"channel": "hook", "event_type": "x", "data": {}}).id)

    assert job.status == "failed" and job.attempt == 1 and "410" in (job.error or "")
    assert receiver.count("/gone") == 1
    assert fleet.sql("SELECT endpoint, state FROM endpoint_health") == [("hook", "disabled")]
    secret_nowhere(fleet, job.id, receiver.secret)


@pytest.mark.timeout(60)
def test_email_delivered_to_a_local_starttls_server(fleet: Fleet) -> None:
    # Given an aiosmtpd server requiring STARTTLS and AUTH, its CA trusted through the channel file
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    ca_file = fleet.tmp / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    handler, port = MailHandler(), free_port()

    def authenticate(server, session, envelope, mechanism, auth_data) -> AuthResult:  # type: ignore[no-untyped-def]
        ok = isinstance(auth_data, LoginPassword) and auth_data.password == SMTP_PASSWORD.encode()
        return AuthResult(success=ok, handled=False)

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
        mail = {"type": "email", "host": "127.0.0.1", "port": port, "username": "tenure", "password": SMTP_PASSWORD}
        mail |= {"sender": "tenure@example.test", "to": ["ops@example.test"], "ca_file": str(ca_file)}
        channels_file(fleet, {"mail": mail})
        fleet.worker("main", ("notify",))

        job = fleet.wait_terminal(
            fleet.submit("notify_email", {"channel": "mail", "subject": "渲染完成", "text": "Your clip is ready."}).id
        )
    finally:
        controller.stop()

    assert job.status == "succeeded", job.error
    [(authenticated, over_tls, envelope)] = handler.messages
    assert authenticated and over_tls and envelope.rcpt_tos == ["ops@example.test"]
    assert f"<{job.id}@tenure.local>".encode() in envelope.content
    secret_nowhere(fleet, job.id, SMTP_PASSWORD)


def test_email_kind_is_not_safe_to_rerun() -> None:
    from jobs.registry import registry

    assert registry.get("notify_email").safe_to_rerun is False
    assert registry.get("notify_webhook").safe_to_rerun is True


@pytest.mark.timeout(90)
def test_a_webhook_secret_saved_in_the_runtime_settings_signs_the_next_delivery(
    fleet: Fleet, receiver: WebhookReceiver
) -> None:
    from settings import runtime as runtime_settings

    # Given a channel signed with the file's secret, and a worker running
    channels_file(fleet, {"hook": {"type": "webhook", "url": receiver.url("/hook"), "secret": receiver.secret}})
    fleet.worker("main", ("notify",))
    first = fleet.wait_terminal(fleet.submit("notify_webhook", {"channel": "hook", "event_type": "a", "data": {}}).id)
    assert first.status == "succeeded" and receiver.received[-1].verified
    file_secret = receiver.secret

    # When an admin saves a new secret (the settings API's call), with no restart
    rotated = new_secret().reveal()
    runtime_settings.put_settings(fleet.engine, {"notify.webhook_secret": rotated}, 0, "root")
    receiver.secret = rotated  # the receiver now only accepts the new one
    second = fleet.wait_terminal(fleet.submit("notify_webhook", {"channel": "hook", "event_type": "b", "data": {}}).id)

    # Then the next delivery verifies with the new secret; neither secret is in any job row, event or log
    assert second.status == "succeeded", second.error
    assert receiver.received[-1].verified, receiver.received[-1].error
    for job in (first, second):
        secret_nowhere(fleet, job.id, rotated)
        secret_nowhere(fleet, job.id, file_secret)
