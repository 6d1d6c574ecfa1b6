"""Notification channels: where ``notify`` jobs deliver, with their secrets, read from a file the workers own.

A job's payload only *names* a channel; URLs, webhook secrets and SMTP passwords live in the file
named by ``TENURE_NOTIFY_CHANNELS`` (JSON, readable by the worker user only), so they never enter a
job payload, its config snapshot, its events or its error text::

    {
      "ops-hook": {"type": "webhook", "url": "https://example.org/hooks/tenure", "secret": "whsec_…"},
      "ops-mail": {"type": "email", "host": "smtp.example.org", "port": 587, "security": "starttls",
                   "username": "tenure", "password": "…", "sender": "tenure@example.org",
                   "to": ["ops@example.org"], "ca_file": null}
    }

The file is re-read when its modification time changes, so a rotated secret applies to the next attempt.

The runtime setting ``notify.webhook_secret`` (``/ops/settings``, ``PUT /api/v1/settings``; saved in the
database, write-only) signs every webhook channel when it is set, in place of the file's secrets, and a
webhook channel may then omit ``secret`` in the file. It is read on every delivery attempt
(:func:`webhook_endpoint`), so a saved rotation applies to the next attempt of any job; clearing it
(``null``) returns to the file's secrets. Like the file's, it only ever lives in a :class:`Secret`.
"""

from __future__ import annotations

import binascii
import dataclasses
import json
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from settings.runtime import effective_values

from .domain.control import DomainError
from .domain.notify.mail import SmtpConfig
from .domain.notify.secret import Secret
from .domain.notify.signing import secret_key
from .domain.notify.webhook import WebhookEndpoint
from .runtime import domain_engine, task_settings

#: The runtime setting that signs every webhook channel when set.
WEBHOOK_SECRET_KEY = "notify.webhook_secret"
#: What a webhook channel without a ``secret`` in the file holds until the runtime secret is applied.
_NO_SECRET = Secret("")


class ChannelError(DomainError):
    """A notification channel is unknown or misconfigured (the message never carries its secrets)."""


@dataclass(frozen=True)
class WebhookChannel:
    name: str
    endpoint: WebhookEndpoint
    type: Literal["webhook"] = "webhook"


@dataclass(frozen=True)
class EmailChannel:
    name: str
    smtp: SmtpConfig
    sender: str
    to: tuple[str, ...]
    type: Literal["email"] = "email"


Channel = WebhookChannel | EmailChannel


@dataclass
class _Cache:
    path: str | None = None
    mtime_ns: int = -1
    channels: dict[str, Channel] = field(default_factory=dict)


_cache = _Cache()
_lock = threading.Lock()


def parse_channels(doc: dict[str, Any]) -> dict[str, Channel]:
    """Build channels from the file's JSON object.

    Raises:
      ChannelError: A channel lacks a required field or has an unknown type.
    """
    out: dict[str, Channel] = {}
    for name, spec in doc.items():
        if not isinstance(spec, dict):
            raise ChannelError(f"channel {name!r}: expected an object")
        try:
            if spec["type"] == "webhook":
                # "secret" may be left out when the runtime setting notify.webhook_secret signs instead.
                secret = Secret(spec["secret"]) if spec.get("secret") else _NO_SECRET
                out[name] = WebhookChannel(name, WebhookEndpoint(spec["url"], secret, key=name))
            elif spec["type"] == "email":
                context = None
                if spec.get("ca_file"):
                    context = ssl.create_default_context(cafile=spec["ca_file"])
                smtp = SmtpConfig(
                    host=spec["host"],
                    port=int(spec.get("port", 587)),
                    username=spec.get("username"),
                    password=Secret(spec["password"]) if spec.get("password") else None,
                    security=spec.get("security", "starttls"),
                    timeout_s=float(spec.get("timeout_s", 30.0)),
                    ssl_context=context,
                )
                out[name] = EmailChannel(name, smtp, spec["sender"], tuple(spec["to"]))
            else:
                raise ChannelError(f"channel {name!r}: unknown type {spec.get('type')!r}")
        except KeyError as exc:
            raise ChannelError(f"channel {name!r}: missing field {exc.args[0]!r}") from None
    return out


def channel(name: str) -> Channel:
    """The channel called *name* from the channels file (re-read when it changed).

    Raises:
      ChannelError: No channels file configured, or no such channel.
    """
    path = task_settings().notify_channels
    if not path:
        raise ChannelError("no notification channels configured (set TENURE_NOTIFY_CHANNELS to a channels file)")
    with _lock:
        try:
            mtime = Path(path).stat().st_mtime_ns
        except OSError as exc:
            raise ChannelError(f"cannot read the channels file: {type(exc).__name__}") from None
        if _cache.path != path or _cache.mtime_ns != mtime:
            try:
                doc = json.loads(Path(path).read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ChannelError(f"cannot read the channels file: {type(exc).__name__}") from None
            _cache.channels = parse_channels(doc)
            _cache.path, _cache.mtime_ns = path, mtime
        found = _cache.channels.get(name)
    if found is None:
        raise ChannelError(f"no notification channel named {name!r}")
    return found


def webhook_endpoint(ch: WebhookChannel, engine: Any = None) -> WebhookEndpoint:
    """Where and how to deliver *ch* now: its URL, signed with the secret in force.

    The secret in force is the saved runtime setting ``notify.webhook_secret`` when set (read now,
    from the job database), else the channels file's. The value is wrapped in a :class:`Secret` at
    once and never reaches a log line, an event, a payload or an error message.

    Raises:
      ChannelError: Neither secret is set, or the one in force is not a Standard Webhooks secret.
    """
    runtime = effective_values(engine if engine is not None else domain_engine(), task_settings()).get(
        WEBHOOK_SECRET_KEY
    )
    if isinstance(runtime, str) and runtime:
        endpoint = dataclasses.replace(ch.endpoint, secret=Secret(runtime))
        source = f"the runtime setting {WEBHOOK_SECRET_KEY}"
    else:
        endpoint = ch.endpoint
        source = f"channel {ch.name!r}'s secret"
    if endpoint.secret is _NO_SECRET:
        raise ChannelError(
            f'channel {ch.name!r} has no secret: set "secret" in the channels file or the runtime '
            f"setting {WEBHOOK_SECRET_KEY}"
        )
    try:
        secret_key(endpoint.secret)  # what signing does: fail here with a clear reason instead
    except (binascii.Error, ValueError):
        raise ChannelError(f"{source} is not a Standard Webhooks secret (whsec_ + base64)") from None
    return endpoint
