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
"""

from __future__ import annotations

import json
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .domain.control import DomainError
from .domain.notify.mail import SmtpConfig
from .domain.notify.secret import Secret
from .domain.notify.webhook import WebhookEndpoint
from .runtime import task_settings


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
                out[name] = WebhookChannel(name, WebhookEndpoint(spec["url"], Secret(spec["secret"]), key=name))
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
