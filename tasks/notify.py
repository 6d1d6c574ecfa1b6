"""Notification kinds: ``notify_webhook`` (Standard Webhooks) and ``notify_email`` (SMTP), one channel per job.

Payloads name a channel of :mod:`tasks.channels`; its URL and secrets (the channels file's, or the
runtime setting ``notify.webhook_secret`` when set) never enter the job:

- ``notify_webhook``: ``{"channel", "event_type", "data"}``. Safe to re-run: every attempt sends the
  same ``webhook-id`` (``msg_<job id>``) and byte-identical body, so a receiver dedupes a re-send
  after a crash. 429/408/5xx/timeouts are retried by the job's retry policy, never sooner than the
  receiver's ``Retry-After``; other 4xx fail the job at once (410 also disables the endpoint). A
  per-endpoint circuit breaker in the database (``endpoint_health``) is shared by every worker:
  while it is open nothing is sent and the attempt is retried when a probe may go.
- ``notify_email``: ``{"channel", "subject", "text", "html"?}``. NOT safe to re-run: a worker lost
  while the message was being handed over leaves the job ``interrupted`` for review, never re-sent.
  A definite 4xx (or a connection failure before the message was handed over) is retried; a 5xx
  fails the job; a connection lost during DATA (outcome unknown) fails it without a re-send.

Results: ``{"channel", "delivered": true, "msg_id" | "message_id", "http_status" | "code"}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine

from jobs import JobContext, JobRecord, get_job, payloads, registry, submit

from .channels import ChannelError, EmailChannel, WebhookChannel, channel, webhook_endpoint
from .domain.control import DomainError
from .domain.notify.breaker import CircuitBreaker
from .domain.notify.mail import Email, send_email
from .domain.notify.store import SQLBreakerStore
from .domain.notify.webhook import WebhookMessage, deliver_webhook
from .runtime import RetryLater, domain_engine, hinted_backoff, retry_in

#: Queue of the notification kinds.
QUEUE = "notify"
#: Attempts of a webhook delivery (the first included).
WEBHOOK_MAX_ATTEMPTS = 6
#: Attempts of an email (only definite, not-delivered outcomes are retried).
EMAIL_MAX_ATTEMPTS = 4


class DeliveryDead(DomainError):
    """The receiver refused the notification for good (re-sending cannot succeed)."""


class DeliveryUnknown(DomainError):
    """The connection was lost while the message was handed over: it may have been delivered; not re-sent."""


def breaker() -> CircuitBreaker:
    """The circuit breaker on the shared ``endpoint_health`` table."""
    return CircuitBreaker(SQLBreakerStore(domain_engine()))


WEBHOOK_PAYLOAD = payloads.schema(
    "Deliver a webhook",
    "Send one event to a webhook channel (Standard Webhooks signature; retried on 429, 5xx and timeouts).",
    channel=payloads.field(
        "string", "Channel", "A webhook channel of the channels file.", required=True, max_length=100
    ),
    event_type=payloads.field(
        "string", "Event type", "What happened, e.g. recording.highlight_ready.", required=True, max_length=200
    ),
    data=payloads.field("object", "Data", "The event's data, a JSON object.", nullable=True),
)
EMAIL_PAYLOAD = payloads.schema(
    "Send an email",
    "Send one message through an email channel (never re-sent once it may have been delivered).",
    channel=payloads.field(
        "string", "Channel", "An email channel of the channels file.", required=True, max_length=100
    ),
    subject=payloads.field("string", "Subject", "The subject line of the message.", required=True, max_length=998),
    text=payloads.field("text", "Text", "The plain-text body.", required=True, max_length=100_000),
    html=payloads.field("text", "HTML", "An HTML body besides the text (optional).", max_length=100_000, nullable=True),
)


@registry.kind(
    "notify_webhook",
    queue=QUEUE,
    payload=WEBHOOK_PAYLOAD,
    summary=lambda p: f"{p['event_type']} → {p['channel']}",
    safe_to_rerun=True,
    backoff=hinted_backoff,
    max_attempts=WEBHOOK_MAX_ATTEMPTS,
    never_retry=(DeliveryDead, ChannelError),
)
def notify_webhook(ctx: JobContext, *, channel: str, event_type: str, data: Mapping[str, Any] | None = None) -> Any:
    """Deliver one event to a webhook channel (one attempt per job attempt).

    Raises:
      RetryLater: 429/5xx/timeout/breaker open: the job is retried (not before ``Retry-After``).
      DeliveryDead: 410 or another 4xx: the job fails.
      ChannelError: No such webhook channel.
    """
    ch = _channel(channel, WebhookChannel)
    # The envelope's timestamp is the job's creation: every re-send carries a byte-identical body.
    created = get_job(domain_engine(), ctx.job_id, owner_id=ctx.owner_id).created_at
    message = WebhookMessage.create(event_type, dict(data or {}), msg_id=f"msg_{ctx.job_id}", at=created)
    # The secret in force is read per attempt: a rotation saved in the runtime settings applies now.
    outcome = deliver_webhook(webhook_endpoint(ch), message, breaker=breaker())
    ctx.event(
        "delivery_attempt",
        channel=channel,
        status=outcome.status,
        http_status=outcome.http_status,
        retry_after_s=outcome.retry_after_s,
        error=outcome.error,
    )
    if outcome.status == "delivered":
        return {"channel": channel, "delivered": True, "msg_id": message.msg_id, "http_status": outcome.http_status}
    if outcome.status == "dead":
        raise DeliveryDead(f"channel {channel}: {outcome.error}")
    retry_in(ctx, outcome.retry_after_s or 0.0)
    raise RetryLater(f"channel {channel}: {outcome.error}")


@registry.kind(
    "notify_email",
    queue=QUEUE,
    payload=EMAIL_PAYLOAD,
    summary=lambda p: f"{p['subject']} → {p['channel']}",
    safe_to_rerun=False,
    backoff=hinted_backoff,
    max_attempts=EMAIL_MAX_ATTEMPTS,
    never_retry=(DeliveryDead, DeliveryUnknown, ChannelError),
)
def notify_email(ctx: JobContext, *, channel: str, subject: str, text: str, html: str | None = None) -> Any:
    """Send one email through an email channel.

    Raises:
      RetryLater: A 4xx reply or a failure before the message was handed over.
      DeliveryDead: A 5xx reply, bad credentials, no STARTTLS.
      DeliveryUnknown: The connection broke during DATA (never re-sent).
    """
    ch = _channel(channel, EmailChannel)
    email = Email(ch.sender, ch.to, subject, text, html, message_id=f"<{ctx.job_id}@tenure.local>")
    outcome = send_email(ch.smtp, email)
    ctx.event("delivery_attempt", channel=channel, status=outcome.status, code=outcome.code, error=outcome.error)
    if outcome.status == "delivered":
        return {"channel": channel, "delivered": True, "message_id": outcome.message_id, "code": outcome.code}
    if outcome.status == "dead":
        raise DeliveryDead(f"channel {channel}: {outcome.error}")
    if outcome.status == "unknown":
        raise DeliveryUnknown(f"channel {channel}: {outcome.error}; not re-sent (it may have been delivered)")
    raise RetryLater(f"channel {channel}: {outcome.error}")


def _channel(name: str, expected: type) -> Any:
    ch = channel(name)
    if not isinstance(ch, expected):
        raise ChannelError(f"channel {name!r} is a {ch.type} channel")
    return ch


def notification_request(channel_name: str, event_type: str, data: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The kind and payload that deliver *event_type* to a channel (by the channel's type).

    Raises:
      ChannelError: No such channel.
    """
    ch = channel(channel_name)
    if isinstance(ch, WebhookChannel):
        return "notify_webhook", {"channel": channel_name, "event_type": event_type, "data": dict(data)}
    body = json.dumps(dict(data), indent=2, ensure_ascii=False, sort_keys=True)
    return "notify_email", {"channel": channel_name, "subject": f"[Tenure] {event_type}", "text": body}


def submit_notification(
    engine: Engine, *, owner_id: str, channel_name: str, event_type: str, data: Mapping[str, Any], **kwargs: Any
) -> JobRecord:
    """Submit the notification job for one channel (extra keyword arguments go to :func:`jobs.submit`)."""
    kind, payload = notification_request(channel_name, event_type, data)
    return submit(engine, owner_id=owner_id, kind=kind, payload=payload, **kwargs)
