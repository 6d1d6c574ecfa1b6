"""Deliver one webhook attempt, signed per Standard Webhooks, and classify the outcome.

Outcomes: ``delivered`` (2xx); ``retry`` (429, 408, 425, 5xx, timeouts, connection errors — with
``retry_after_s`` from the receiver when it sent one); ``dead`` (3xx — redirects are not followed —
and other 4xx: re-sending the same request cannot succeed; 410 also disables the endpoint in the
breaker); ``refused`` (the circuit breaker is open or the endpoint disabled: nothing was sent).

A message keeps its ``webhook-id`` and body across re-sends so receivers can dedupe; only
``webhook-timestamp`` and the signature are new on each attempt. Secrets never appear in the
outcome, the log, or an exception message.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from .breaker import CircuitBreaker
from .retry import next_retry_delay_s, parse_retry_after
from .secret import Secret, redact
from .signing import secret_key, signed_headers

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger(__name__)

#: Per-phase timeouts (s): the spec suggests 15–30 s; connecting should fail faster.
TIMEOUT_S = 15.0
CONNECT_TIMEOUT_S = 5.0
#: Statuses that mean "try again later".
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
#: Statuses that count against the breaker (the endpoint is unwell, not merely throttling us).
UNHEALTHY_STATUSES = frozenset({500, 502, 503, 504})

DeliveryStatus = Literal["delivered", "retry", "dead", "refused"]


@dataclass(frozen=True)
class WebhookEndpoint:
    """Where to deliver; ``key`` identifies the endpoint to the breaker (defaults to the URL)."""

    url: str
    secret: Secret = field(repr=False)
    key: str | None = None

    @property
    def breaker_key(self) -> str:
        return self.key or self.url


@dataclass(frozen=True)
class WebhookMessage:
    """One event to deliver; ``msg_id`` and ``body`` stay the same across re-sends."""

    msg_id: str
    event_type: str
    body: bytes

    @classmethod
    def create(
        cls, event_type: str, data: Mapping[str, Any], *, msg_id: str | None = None, at: datetime | None = None
    ) -> WebhookMessage:
        """Build the spec's ``{"type", "timestamp", "data"}`` envelope once, so re-sends are byte-identical.

        Parameters
        ----------
        event_type:
            E.g. ``"job.succeeded"``.
        data:
            JSON-serialisable event data (no secrets).
        msg_id:
            Stable id (e.g. derived from the job and event); a random ``msg_`` id when omitted.
        at:
            Event time (UTC now when omitted).

        Returns
        -------
        WebhookMessage
        """
        when = (at or datetime.now(UTC)).astimezone(UTC).isoformat().replace("+00:00", "Z")
        body = json.dumps({"type": event_type, "timestamp": when, "data": data}, separators=(",", ":"))
        return cls(msg_id or f"msg_{uuid.uuid4().hex}", event_type, body.encode())


@dataclass(frozen=True)
class DeliveryOutcome:
    """The result of one attempt."""

    status: DeliveryStatus
    msg_id: str
    http_status: int | None = None
    retry_after_s: float | None = None  # the receiver's Retry-After, if any
    error: str | None = None  # short, secret-free reason for anything but delivered
    elapsed_s: float = 0.0
    disabled_endpoint: bool = False  # a 410 disabled the endpoint


def deliver_webhook(
    endpoint: WebhookEndpoint,
    message: WebhookMessage,
    *,
    client: httpx.Client | None = None,
    breaker: CircuitBreaker | None = None,
    timeout: httpx.Timeout | None = None,
    now: Callable[[], float] = time.time,
) -> DeliveryOutcome:
    """Make one signed delivery attempt.

    Parameters
    ----------
    endpoint:
        URL, secret and breaker key.
    message:
        The event (same ``msg_id`` and body on every attempt).
    client:
        An ``httpx.Client`` to reuse (redirects must stay off); a short-lived one otherwise.
    breaker:
        Shared circuit breaker; when given, a refused call sends nothing.
    timeout:
        Per-phase timeouts (default: :data:`TIMEOUT_S`, connecting :data:`CONNECT_TIMEOUT_S`).
    now:
        Unix-time source for ``webhook-timestamp`` (receivers allow ±5 minutes).

    Returns
    -------
    DeliveryOutcome
        Never raises for HTTP or network failures; they are outcomes.
    """
    key = endpoint.breaker_key
    if breaker is not None:
        decision = breaker.before_call(key)
        if not decision.allowed:
            logger.info("webhook %s to %s refused: breaker %s", message.msg_id, key, decision.state)
            return DeliveryOutcome(
                "refused", message.msg_id, retry_after_s=decision.retry_in_s, error=f"circuit breaker {decision.state}"
            )
    # Imported at the first delivery, not with the actors: httpx costs every worker process ~50–100 ms
    # at start, and only the notification actor sends a webhook.
    import httpx

    if timeout is None:
        timeout = httpx.Timeout(TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    headers = signed_headers(endpoint.secret, message.msg_id, int(now()), message.body)
    started = time.monotonic()
    try:
        if client is not None:
            response = client.post(endpoint.url, content=message.body, headers=headers, timeout=timeout)
        else:
            with httpx.Client(follow_redirects=False) as own:
                response = own.post(endpoint.url, content=message.body, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        # Transport trouble (timeout, refused, reset): the endpoint may be fine later.
        error = _safe_error(exc, endpoint)
        if breaker is not None:
            breaker.record_failure(key, error)
        outcome = DeliveryOutcome("retry", message.msg_id, error=error, elapsed_s=time.monotonic() - started)
        logger.info("webhook %s to %s: %s", message.msg_id, key, error)
        return outcome
    elapsed = time.monotonic() - started
    code = response.status_code
    outcome = classify_response(message.msg_id, code, response.headers.get("retry-after"), elapsed)
    if breaker is not None:
        if outcome.status == "delivered":
            breaker.record_success(key)
        elif code in UNHEALTHY_STATUSES:
            breaker.record_failure(key, f"HTTP {code}")
        elif code == 410:
            breaker.disable(key, "HTTP 410 Gone")
            outcome = replace(outcome, disabled_endpoint=True)
    logger.info("webhook %s to %s: %s (HTTP %d, %.3f s)", message.msg_id, key, outcome.status, code, elapsed)
    return outcome


def classify_response(msg_id: str, code: int, retry_after: str | None, elapsed_s: float = 0.0) -> DeliveryOutcome:
    """Map an HTTP status (and ``Retry-After``) to an outcome.

    Parameters
    ----------
    msg_id:
        The message's id.
    code:
        HTTP status.
    retry_after:
        The ``Retry-After`` header, if any.
    elapsed_s:
        How long the attempt took.

    Returns
    -------
    DeliveryOutcome
    """
    if 200 <= code < 300:
        return DeliveryOutcome("delivered", msg_id, http_status=code, elapsed_s=elapsed_s)
    if code in RETRY_STATUSES:
        return DeliveryOutcome(
            "retry",
            msg_id,
            http_status=code,
            retry_after_s=parse_retry_after(retry_after),
            error=f"HTTP {code}",
            elapsed_s=elapsed_s,
        )
    reason = "gone: endpoint disabled" if code == 410 else "not retryable"
    return DeliveryOutcome("dead", msg_id, http_status=code, error=f"HTTP {code} ({reason})", elapsed_s=elapsed_s)


def deliver_with_retries(
    endpoint: WebhookEndpoint,
    message: WebhookMessage,
    *,
    max_attempts: int = 4,
    sleep: Callable[[float], None] = time.sleep,
    delay: Callable[[int, float | None], float] = next_retry_delay_s,
    **kwargs: Any,
) -> tuple[DeliveryOutcome, int]:
    """Attempt until delivered, dead, refused, or out of attempts — for callers without durable retries.

    Workers should rather return the outcome to the job layer, which re-enqueues with the delay
    (that survives a crash and frees the worker); this loop is for scripts and tests.

    Parameters
    ----------
    endpoint, message:
        As for :func:`deliver_webhook`.
    max_attempts:
        Total attempts.
    sleep:
        How to wait (tests inject a recorder).
    delay:
        ``delay(attempt, retry_after_s) -> seconds``; honours ``Retry-After`` by default.
    kwargs:
        Passed to :func:`deliver_webhook`.

    Returns
    -------
    tuple
        The last outcome and the number of attempts made.
    """
    attempt = 0
    while True:
        attempt += 1
        outcome = deliver_webhook(endpoint, message, **kwargs)
        if outcome.status != "retry" or attempt >= max_attempts:
            return outcome, attempt
        sleep(delay(attempt, outcome.retry_after_s))


def _safe_error(exc: Exception, endpoint: WebhookEndpoint) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    key = secret_key(endpoint.secret)
    return redact(text, [endpoint.secret.reveal(), base64.b64encode(key).decode()])[:300]
