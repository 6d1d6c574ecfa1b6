"""The runtime setting ``notify.webhook_secret`` signs webhook deliveries from the next attempt on.

A real migrated SQLite file holds the saved settings; a local receiver verifies every request with
the ``standardwebhooks`` package (``tests/integration/domain/receivers.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from jobs import db
from jobs.db import make_engine
from jobs.schema import upgrade
from jobs.store import dumps
from settings import runtime as rs
from tasks.channels import ChannelError, WebhookChannel, parse_channels, webhook_endpoint
from tasks.domain.notify.signing import new_secret
from tasks.domain.notify.webhook import WebhookMessage, deliver_webhook
from tests.integration.domain.receivers import WebhookReceiver


@pytest.fixture()
def engine(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'tenure.db'}"
    upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()


@pytest.fixture()
def receiver() -> Iterator[WebhookReceiver]:
    server = WebhookReceiver(new_secret().reveal()).start()
    yield server
    server.stop()


def _hook(receiver: WebhookReceiver, secret: str | None) -> WebhookChannel:
    spec = {"type": "webhook", "url": receiver.url("/hook")} | ({"secret": secret} if secret else {})
    channel = parse_channels({"hook": spec})["hook"]
    assert isinstance(channel, WebhookChannel)
    return channel


def _deliver(channel: WebhookChannel, engine: Engine, n: int) -> str:
    message = WebhookMessage.create("test.event", {"n": n}, msg_id=f"msg_{n}")
    return deliver_webhook(webhook_endpoint(channel, engine), message).status


def test_a_saved_secret_replaces_the_files_until_cleared(
    engine: Engine, receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    file_secret = receiver.secret
    channel = _hook(receiver, file_secret)
    assert _deliver(channel, engine, 1) == "delivered" and receiver.received[-1].verified

    rotated = new_secret().reveal()
    view = rs.put_settings(engine, {"notify.webhook_secret": rotated}, 0, "root")
    assert view["changed"] == {"notify.webhook_secret": {"set": True}}
    # A receiver still on the file's secret refuses the next delivery: it is signed with the new one
    _deliver(channel, engine, 2)
    assert not receiver.received[-1].verified
    receiver.secret = rotated
    assert _deliver(channel, engine, 3) == "delivered" and receiver.received[-1].verified

    # Cleared (null): the file's secret signs again
    rs.put_settings(engine, {"notify.webhook_secret": None}, 1, "root")
    receiver.secret = file_secret
    assert _deliver(channel, engine, 4) == "delivered" and receiver.received[-1].verified
    assert rotated not in caplog.text and file_secret not in caplog.text


def test_a_channel_may_leave_its_secret_to_the_runtime_setting(engine: Engine, receiver: WebhookReceiver) -> None:
    channel = _hook(receiver, None)
    with pytest.raises(ChannelError, match="has no secret") as info:
        webhook_endpoint(channel, engine)
    assert "notify.webhook_secret" in str(info.value)
    rs.put_settings(engine, {"notify.webhook_secret": receiver.secret}, 0, "root")
    assert _deliver(channel, engine, 1) == "delivered" and receiver.received[-1].verified
    assert receiver.secret not in repr(webhook_endpoint(channel, engine))


def test_a_secret_saved_before_it_was_validated_fails_clearly(engine: Engine, receiver: WebhookReceiver) -> None:
    # An older revision could hold any string; one that no receiver could decode (5 base64 characters)
    # fails the delivery with a reason, never the value
    bad = "whsec_abcde"
    _save_raw(engine, {"notify.webhook_secret": bad})  # as an older version, which did not check it, saved
    with pytest.raises(ChannelError, match="not a Standard Webhooks secret") as info:
        webhook_endpoint(_hook(receiver, receiver.secret), engine)
    assert bad not in str(info.value)


def _save_raw(engine: Engine, document: dict[str, str]) -> None:
    """Write a revision row directly, bypassing validation."""
    with db.write(engine) as tx:
        rs.store.insert_revision(tx.conn, 1, 0, "root", dumps(document))
