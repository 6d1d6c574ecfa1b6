"""Limits on live-feed connections (checked before the WebSocket upgrade).

Two limits, both answered with 429 + ``Retry-After``:

- per web process, ``LIVE_MAX_CONNECTIONS``: each feed holds one of the process's threads, so this is
  counted in memory and keeps threads free for plain requests;
- per identity, ``LIVE_MAX_PER_IDENTITY``, across every web process on every host: a row per
  connection in the job database (:mod:`accounts.live_slots`), renewed by the connection's streaming
  loop and expiring ``LIVE_SLOT_TTL_S`` after its last renewal when the process died.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass

from sqlalchemy import Engine

from accounts import live_slots

#: Live connections one web process accepts (keep it below gunicorn's threads so plain HTTP keeps some).
DEFAULT_MAX_CONNECTIONS = 64
#: Live connections one identity may hold across all web processes.
DEFAULT_MAX_PER_IDENTITY = 4
#: How long a connection's slot outlives its last renewal.
DEFAULT_SLOT_TTL_S = 30.0


@dataclass(frozen=True)
class Slot:
    """A connection's place in both limits."""

    identity: str
    id: str


class FeedLimits:
    """Both limits; thread-safe. The per-identity count lives in the job database (*engine*)."""

    def __init__(
        self,
        engine: Engine,
        max_total: int = DEFAULT_MAX_CONNECTIONS,
        max_per_identity: int = DEFAULT_MAX_PER_IDENTITY,
        slot_ttl_s: float = DEFAULT_SLOT_TTL_S,
    ) -> None:
        self.engine = engine
        self.max_total = max_total
        self.max_per_identity = max_per_identity
        self.ttl_ms = int(slot_ttl_s * 1000)
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self._lock = threading.Lock()
        self._total = 0

    def _take_local(self) -> bool:
        with self._lock:
            if self._total >= self.max_total:
                return False
            self._total += 1
            return True

    def _give_back_local(self) -> None:
        with self._lock:
            self._total = max(0, self._total - 1)

    def acquire(self, identity: str) -> Slot | None:
        """A slot for *identity* in both limits, or ``None`` when either is full (answer 429)."""
        if not self._take_local():
            return None
        try:
            slot_id = live_slots.acquire(
                self.engine, identity, self.max_per_identity, holder=self.holder, ttl_ms=self.ttl_ms
            )
        except BaseException:
            self._give_back_local()
            raise
        if slot_id is None:
            self._give_back_local()
            return None
        return Slot(identity, slot_id)

    def available(self, identity: str) -> bool:
        """Whether :meth:`acquire` would succeed now (it takes nothing)."""
        with self._lock:
            if self._total >= self.max_total:
                return False
        return live_slots.held(self.engine, identity) < self.max_per_identity

    def renew(self, slot: Slot) -> bool:
        """Keep *slot* for another TTL; False when it had expired (the connection must end)."""
        return live_slots.renew(self.engine, slot.id, ttl_ms=self.ttl_ms)

    def release(self, slot: Slot) -> None:
        try:
            live_slots.release(self.engine, slot.id)
        finally:
            self._give_back_local()

    @property
    def renew_every_s(self) -> float:
        """How often a connection renews its slot: a third of the TTL."""
        return self.ttl_ms / 3000

    @property
    def total(self) -> int:
        """Live connections of this process."""
        with self._lock:
            return self._total
