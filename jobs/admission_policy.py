"""What admission applies now: fair share (on or off, its window, owners' weights) and each limit's values.

The kinds declare their limits (:mod:`jobs.limits`, by name for the whole process) and the settings
catalogue holds fair share's defaults; an admin's saved runtime settings override both
(``fair_share.enabled``, ``fair_share.window``, ``owners.<name>.weight``, ``concurrency.<name>.limit``,
``rate.<name>.starts`` / ``….period_s``). A process reads the saved batch on the connection of the
transaction that needs it, at most every :data:`REFRESH_S` seconds per database, so a save reaches
every worker and web process within that time.

Weights name owners as people know them (user names); the composition root that knows accounts installs
:data:`resolve_owners` to turn them into the owner ids jobs carry (by default a name is the owner id).
"""

from __future__ import annotations

import sqlite3
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from settings.environment import DEFAULT_FAIR_SHARE_WINDOW
from settings.runtime import saved_on

from . import limits
from .limits import limit_name

#: How long a process keeps a database's policy before reading the saved settings again.
REFRESH_S = 2.0

#: Owner names (as weights are saved) → owner ids; installed by the composition root (``tasks.compose``).
resolve_owners: Callable[[Sequence[str]], Mapping[str, str]] = lambda names: {n: n for n in names}  # noqa: E731


@dataclass(frozen=True)
class Policy:
    """Effective admission settings of one database."""

    fair_share: bool = True
    window: int = DEFAULT_FAIR_SHARE_WINDOW
    #: owner id → weight (absent: 1).
    weights: Mapping[str, int] = field(default_factory=dict)
    #: limit name → at most this many running jobs per key.
    concurrency: Mapping[str, int] = field(default_factory=dict)
    #: limit name → (starts, period in ms).
    rates: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def weight(self, owner_id: str) -> int:
        return self.weights.get(owner_id, 1)

    def concurrency_limit(self, key: str) -> int | None:
        """The limit of concurrency key *key* (None: its limit is declared by no kind this process knows)."""
        return self.concurrency.get(limit_name(key))

    def rate(self, key: str) -> tuple[int, int] | None:
        """``(starts, period_ms)`` of rate key *key* (None: undeclared here)."""
        return self.rates.get(limit_name(key))


def build(saved: Mapping[str, Any]) -> Policy:
    """The policy of a saved settings batch over the kinds' declared limits."""
    concurrency, rates = limits.declared()
    weights_by_name: dict[str, int] = {}
    for key, value in saved.items():
        if value is None:
            continue
        family, _, rest = key.partition(".")
        if family == "owners" and rest.endswith(".weight"):
            weights_by_name[rest.removesuffix(".weight")] = int(value)
        elif family == "concurrency" and rest.endswith(".limit"):
            concurrency[rest.removesuffix(".limit")] = int(value)
        elif family == "rate" and rest.endswith(".starts"):
            name = rest.removesuffix(".starts")
            rates[name] = (int(value), rates.get(name, (1, 1000))[1])
        elif family == "rate" and rest.endswith(".period_s"):
            name = rest.removesuffix(".period_s")
            rates[name] = (rates.get(name, (1, 1000))[0], int(value) * 1000)
    ids = resolve_owners(sorted(weights_by_name)) if weights_by_name else {}
    weights = {ids[name]: weight for name, weight in weights_by_name.items() if name in ids}
    return Policy(
        fair_share=bool(saved.get("fair_share.enabled", True)),
        window=int(saved.get("fair_share.window") or DEFAULT_FAIR_SHARE_WINDOW),
        weights=weights,
        concurrency=concurrency,
        rates=rates,
    )


class _Cache:
    """Policies by database: engines weakly, raw sqlite3 connections (which cannot be weakly referenced)
    by identity in a small LRU that keeps them alive, so an identity is never reused while cached."""

    def __init__(self, size: int = 64) -> None:
        self._lock = threading.Lock()
        self._engines: weakref.WeakKeyDictionary[Any, tuple[float, int, Policy]] = weakref.WeakKeyDictionary()
        self._raw: OrderedDict[int, tuple[sqlite3.Connection, float, int, Policy]] = OrderedDict()
        self._size = size

    def get(self, conn: Any) -> Policy | None:
        now = time.monotonic()
        with self._lock:
            if isinstance(conn, sqlite3.Connection):
                found = self._raw.get(id(conn))
                if found is None or found[0] is not conn:
                    return None
                at, generation, policy = found[1:]
            else:
                cached = self._engines.get(conn.engine)
                if cached is None:
                    return None
                at, generation, policy = cached
        return policy if now - at < REFRESH_S and generation == limits.generation else None

    def put(self, conn: Any, policy: Policy, generation: int) -> None:
        now = time.monotonic()
        with self._lock:
            if isinstance(conn, sqlite3.Connection):
                self._raw[id(conn)] = (conn, now, generation, policy)
                self._raw.move_to_end(id(conn))
                while len(self._raw) > self._size:
                    self._raw.popitem(last=False)
            else:
                self._engines[conn.engine] = (now, generation, policy)

    def clear(self) -> None:
        with self._lock:
            self._engines.clear()
            self._raw.clear()


_cache = _Cache()


def policy(conn: Any) -> Policy:
    """The policy of the database behind *conn* (read on *conn* when this process's copy is stale)."""
    found = _cache.get(conn)
    if found is None:
        generation = limits.generation
        found = build(saved_on(conn))
        _cache.put(conn, found, generation)
    return found


def forget() -> None:
    """Read the saved settings again at the next use (after this process saved them)."""
    _cache.clear()
