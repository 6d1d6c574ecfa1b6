"""What a kind declares about how many of its jobs may start: per-key concurrency and rate limits.

    @registry.kind("render_clip", queue="render",
                   concurrency=ConcurrencyLimit("render_clip.owner", limit=2))          # per owner
    @registry.kind("notify_webhook",
                   concurrency=ConcurrencyLimit("webhook.host", limit=4, key=url_host("url")),
                   rate=RateLimit("webhook.host", starts=60, per_s=60, key=url_host("url")))

A limit has a **name** (its key class: shown in the UI, labelled in metrics, and the runtime setting that
changes it, ``concurrency.<name>.limit`` / ``rate.<name>.starts`` and ``rate.<name>.period_s``) and a
**key** that splits jobs into groups limited separately: ``"owner"`` (the job's owner), ``"payload:<field>"``
(a payload field's value) or a function ``key(owner_id, payload) -> str | None`` (None: this job is not
limited). A job's key is computed once, at submit, and stored as ``<name>=<value>``; a kind whose limit
says ``from_submit=True`` also lets a submit name the value itself (``submit(…, concurrency_key=…)``).

Kinds with the same limit name share its keys: two kinds declaring ``ConcurrencyLimit("gpu", limit=1,
key=…)`` never run more than one job of a key between them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

#: A key function: ``(owner_id, payload) -> value`` (None: not limited).
KeyFn = Callable[[str, Mapping[str, Any]], str | None]
#: Longest stored key (``<name>=<value>``); longer values are cut, which merges keys only past this length.
MAX_KEY_CHARS = 200


def _key_fn(key: str | KeyFn) -> KeyFn:
    if callable(key):
        return key
    if key == "owner":
        return lambda owner_id, _payload: owner_id
    if key.startswith("payload:"):
        field = key.removeprefix("payload:")
        return lambda _owner_id, payload: None if payload.get(field) is None else str(payload[field])
    raise ValueError(f"a limit's key is 'owner', 'payload:<field>' or a function, not {key!r}")


def url_host(field: str) -> KeyFn:
    """A key function: the host of the URL in payload field *field* (webhook deliveries per destination)."""

    def host(_owner_id: str, payload: Mapping[str, Any]) -> str | None:
        value = payload.get(field)
        if not isinstance(value, str):
            return None
        try:
            return (urlsplit(value).hostname or "").lower() or None
        except ValueError:
            return None

    return host


@dataclass(frozen=True)
class _Limit:
    name: str
    key: str | KeyFn = "owner"
    from_submit: bool = False

    def __post_init__(self) -> None:
        if not self.name or "=" in self.name or len(self.name) > 80:
            raise ValueError(f"a limit's name is 1-80 characters without '=', not {self.name!r}")
        _key_fn(self.key)  # refuse a malformed key at declaration, not at the first submit

    def key_of(self, owner_id: str, payload: Mapping[str, Any], given: str | None = None) -> str | None:
        """The stored key of a job (``<name>=<value>``), or None when the job is not limited.

        Raises:
          ValueError: *given* although the limit does not take a key from the submit.
        """
        if given is not None and not self.from_submit:
            raise ValueError(f"limit {self.name} takes no key from the submit")
        value = given if given is not None else _key_fn(self.key)(owner_id, payload)
        if value is None or value == "":
            return None
        return f"{self.name}={value}"[:MAX_KEY_CHARS]


@dataclass(frozen=True)
class ConcurrencyLimit(_Limit):
    """At most ``limit`` jobs of one key run at once, across every worker process on every host."""

    limit: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.limit < 1:
            raise ValueError("a concurrency limit is at least 1")


@dataclass(frozen=True)
class RateLimit(_Limit):
    """At most ``starts`` attempts of one key start in any ``per_s`` seconds."""

    starts: int = 1
    per_s: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.starts < 1 or self.per_s <= 0:
            raise ValueError("a rate limit allows at least 1 start per positive period")


_declared_concurrency: dict[str, int] = {}
_declared_rates: dict[str, tuple[int, int]] = {}
#: Limits whose keys are owner ids (``key="owner"``): shown with the owner's name.
_owner_keyed: set[str] = set()
#: Bumped by every declaration, so a policy built before it is rebuilt (jobs.admission_policy).
generation = 0


def declare(limit: ConcurrencyLimit | RateLimit | None) -> None:
    """Record a kind's limit under its name (every registry's kinds: the limits are the process's)."""
    global generation
    if limit is not None and limit.key == "owner":
        _owner_keyed.add(limit.name)
    if isinstance(limit, ConcurrencyLimit):
        _declared_concurrency[limit.name] = limit.limit
    elif isinstance(limit, RateLimit):
        _declared_rates[limit.name] = (limit.starts, int(limit.per_s * 1000))
    else:
        return
    generation += 1


def declared() -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
    """The declared limits by name: concurrency limits, and rates as ``(starts, period_ms)``."""
    return dict(_declared_concurrency), dict(_declared_rates)


def owner_keyed(name: str) -> bool:
    """Whether limit *name*'s keys are owner ids."""
    return name in _owner_keyed


def limit_name(key: str) -> str:
    """The limit (key class) of a stored key: ``render_clip.owner=bob`` → ``render_clip.owner``."""
    return key.split("=", 1)[0]


def key_value(key: str) -> str:
    """The value part of a stored key: ``render_clip.owner=bob`` → ``bob``."""
    return key.split("=", 1)[1] if "=" in key else key
