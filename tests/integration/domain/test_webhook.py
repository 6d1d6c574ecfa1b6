"""Webhook delivery to a local receiver that verifies with ``standardwebhooks``; the shared circuit breaker."""

from __future__ import annotations

import logging
import random
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import standardwebhooks
from sqlalchemy import create_engine

from tasks.domain.notify.breaker import CircuitBreaker
from tasks.domain.notify.retry import SPEC_SCHEDULE_S, next_retry_delay_s, parse_retry_after
from tasks.domain.notify.secret import Secret
from tasks.domain.notify.signing import new_secret, sign
from tasks.domain.notify.store import SQLBreakerStore
from tasks.domain.notify.webhook import WebhookEndpoint, WebhookMessage, deliver_webhook, deliver_with_retries

from .receivers import WebhookReceiver

SECRET = new_secret()


@pytest.fixture()
def receiver() -> Iterator[WebhookReceiver]:
    server = WebhookReceiver(SECRET.reveal()).start()
    yield server
    server.stop()


class FakeClock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_breaker(path: Path, clock: FakeClock, **kwargs) -> CircuitBreaker:
    store = SQLBreakerStore(create_engine(f"sqlite:///{path}"))
    store.create_schema()
    return CircuitBreaker(store, clock=clock, **kwargs)


def endpoint(receiver: WebhookReceiver, path: str) -> WebhookEndpoint:
    return WebhookEndpoint(receiver.url(path), SECRET)


def test_delivered_and_verified_by_standardwebhooks(receiver: WebhookReceiver) -> None:
    message = WebhookMessage.create("job.succeeded", {"job_id": "j1", "title": "直播 & clip"}, msg_id="msg_j1_done")
    outcome = deliver_webhook(endpoint(receiver, "/ok"), message)
    assert (outcome.status, outcome.http_status, outcome.msg_id) == ("delivered", 204, "msg_j1_done")
    [got] = receiver.received
    assert got.verified, got.error
    assert got.headers["webhook-id"] == "msg_j1_done"
    assert standardwebhooks.Webhook(SECRET.reveal()).verify(got.body, got.headers)["data"]["title"] == "直播 & clip"


def test_503_with_retry_after_then_success_keeps_the_webhook_id(receiver: WebhookReceiver) -> None:
    # Given a receiver that answers 503 + Retry-After: 7 twice, then 200
    receiver.script["/flaky"] = [(503, {"Retry-After": "7"}), (503, {"Retry-After": "7"}), (200, {})]
    slept: list[float] = []
    message = WebhookMessage.create("job.failed", {"job_id": "j2"})

    # When
    outcome, attempts = deliver_with_retries(endpoint(receiver, "/flaky"), message, sleep=slept.append)

    # Then: delivered on the third attempt, waits honoured Retry-After, same id, fresh valid signatures
    assert (outcome.status, attempts) == ("delivered", 3)
    assert len(slept) == 2 and all(s >= 7 for s in slept)
    assert [r.verified for r in receiver.received] == [True, True, True]
    assert {r.headers["webhook-id"] for r in receiver.received} == {message.msg_id}
    assert {r.body for r in receiver.received} == {message.body}


def test_retry_outcome_carries_retry_after(receiver: WebhookReceiver) -> None:
    receiver.script["/busy"] = [(429, {"Retry-After": "120"})]
    outcome = deliver_webhook(endpoint(receiver, "/busy"), WebhookMessage.create("x", {}))
    assert (outcome.status, outcome.http_status, outcome.retry_after_s) == ("retry", 429, 120.0)


def test_410_is_dead_and_disables_the_endpoint(receiver: WebhookReceiver, tmp_path: Path) -> None:
    breaker = make_breaker(tmp_path / "b.db", FakeClock())
    receiver.default["/gone"] = 410
    target = endpoint(receiver, "/gone")
    first = deliver_webhook(target, WebhookMessage.create("x", {}), breaker=breaker)
    assert (first.status, first.http_status, first.disabled_endpoint) == ("dead", 410, True)
    assert breaker.state(target.breaker_key).state == "disabled"
    second = deliver_webhook(target, WebhookMessage.create("x", {}), breaker=breaker)
    assert second.status == "refused" and receiver.count("/gone") == 1  # nothing sent
    breaker.enable(target.breaker_key)
    assert breaker.state(target.breaker_key).state == "closed"


def test_other_4xx_is_dead_without_tripping_the_breaker(receiver: WebhookReceiver, tmp_path: Path) -> None:
    breaker = make_breaker(tmp_path / "b.db", FakeClock(), failure_threshold=1)
    receiver.default["/bad"] = 400
    outcome, attempts = deliver_with_retries(
        endpoint(receiver, "/bad"), WebhookMessage.create("x", {}), breaker=breaker
    )
    assert (outcome.status, attempts) == ("dead", 1)
    assert breaker.state(receiver.url("/bad")).state == "closed"


def test_redirect_is_not_followed(receiver: WebhookReceiver) -> None:
    receiver.script["/moved"] = [(301, {"Location": receiver.url("/ok")})]
    outcome = deliver_webhook(endpoint(receiver, "/moved"), WebhookMessage.create("x", {}))
    assert outcome.status == "dead" and receiver.count("/ok") == 0


def test_timeout_and_refused_connection_are_retryable(receiver: WebhookReceiver) -> None:
    receiver.delay_s["/slow"] = 1.0
    slow = deliver_webhook(endpoint(receiver, "/slow"), WebhookMessage.create("x", {}), timeout=httpx.Timeout(0.2))
    assert (slow.status, slow.error) == ("retry", "ReadTimeout: timed out")
    closed = WebhookEndpoint("http://127.0.0.1:9/hook", SECRET)  # discard port: nothing listens
    refused = deliver_webhook(closed, WebhookMessage.create("x", {}))
    assert refused.status == "retry" and refused.error.startswith("ConnectError")


def test_breaker_opens_after_repeated_failures_and_closes_after_recovery(
    receiver: WebhookReceiver, tmp_path: Path
) -> None:
    # Given a breaker (threshold 3, reset 60 s, fake clock) and an endpoint answering 500
    clock = FakeClock()
    breaker = make_breaker(tmp_path / "b.db", clock, failure_threshold=3, reset_timeout_s=60)
    receiver.default["/down"] = 500
    target = endpoint(receiver, "/down")
    key = target.breaker_key

    def send() -> str:
        return deliver_webhook(target, WebhookMessage.create("x", {}), breaker=breaker).status

    # When three calls fail, the breaker opens; further calls are refused without a request
    assert [send(), send(), send()] == ["retry", "retry", "retry"]
    assert breaker.state(key).state == "open"
    assert send() == "refused" and receiver.count("/down") == 3

    # Another worker process (its own engine on the same database) sees the same open breaker
    other = make_breaker(tmp_path / "b.db", clock, failure_threshold=3, reset_timeout_s=60)
    assert other.before_call(key).allowed is False

    # After the reset timeout exactly one probe goes out; it fails, so the breaker re-opens
    clock.now += 61
    assert send() == "retry" and receiver.count("/down") == 4
    assert breaker.state(key).state == "open" and send() == "refused"

    # The endpoint recovers; after the next timeout the probe succeeds and the breaker closes
    receiver.default["/down"] = 200
    clock.now += 61
    decision = other.before_call(key)
    assert decision.allowed and decision.probe
    assert breaker.before_call(key).allowed is False  # the probe slot is taken
    other.record_success(key)
    assert breaker.state(key).state == "closed" and breaker.state(key).consecutive_failures == 0
    assert send() == "delivered"


def test_breaker_state_is_shared_with_a_separate_process(tmp_path: Path) -> None:
    db = tmp_path / "b.db"
    breaker = make_breaker(db, FakeClock(), failure_threshold=2)
    breaker.record_failure("https://example.invalid/hook", "HTTP 503")
    code = (
        "import sys; from sqlalchemy import create_engine;"
        "from tasks.domain.notify.breaker import CircuitBreaker;"
        "from tasks.domain.notify.store import SQLBreakerStore;"
        f"b = CircuitBreaker(SQLBreakerStore(create_engine('sqlite:///{db}')), failure_threshold=2);"
        "print(b.record_failure('https://example.invalid/hook', 'HTTP 502').state)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "open"
    assert breaker.state("https://example.invalid/hook").state == "open"


def test_secrets_never_in_logs_outcomes_or_reprs(receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    receiver.default["/down"] = 503
    target = endpoint(receiver, "/down")
    outcomes = [
        deliver_webhook(target, WebhookMessage.create("x", {})),
        deliver_webhook(WebhookEndpoint("http://127.0.0.1:9/", SECRET), WebhookMessage.create("x", {})),
    ]
    raw = SECRET.reveal()
    key_b64 = raw.removeprefix("whsec_")
    for text in [caplog.text, repr(target), str(SECRET), *map(repr, outcomes)]:
        assert raw not in text and key_b64 not in text


def test_signature_is_byte_identical_to_standardwebhooks() -> None:
    secret = Secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    body = '{"type":"x","data":{"k":"值"}}'
    ours = sign(secret, "msg_1", 1_700_000_000, body.encode())
    theirs = standardwebhooks.Webhook(secret.reveal()).sign("msg_1", datetime.fromtimestamp(1_700_000_000, UTC), body)
    assert ours == theirs


def test_retry_after_and_backoff() -> None:
    assert parse_retry_after("30") == 30.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now=1445412480.0) == 30.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None
    assert parse_retry_after("99999999") == 24 * 3600
    rng = random.Random(1)
    assert 4.5 <= next_retry_delay_s(1, rng=rng) <= 5.5
    assert next_retry_delay_s(1, 120.0, rng=rng) == 120.0  # Retry-After wins when longer
    assert next_retry_delay_s(99, rng=rng) >= SPEC_SCHEDULE_S[-1] * 0.9
