"""Per-process limits on live-feed connections (checked before the WebSocket upgrade)."""

from __future__ import annotations

import threading
from collections import Counter

#: Live connections one web process accepts (keep it below gunicorn's threads so plain HTTP keeps some).
DEFAULT_MAX_CONNECTIONS = 64
#: Live connections one identity may hold in one process.
DEFAULT_MAX_PER_IDENTITY = 4


class FeedLimits:
    """Counts live connections per process and per identity; thread-safe."""

    def __init__(
        self, max_total: int = DEFAULT_MAX_CONNECTIONS, max_per_identity: int = DEFAULT_MAX_PER_IDENTITY
    ) -> None:
        self.max_total = max_total
        self.max_per_identity = max_per_identity
        self._lock = threading.Lock()
        self._per_identity: Counter[str] = Counter()
        self._total = 0

    def acquire(self, identity: str) -> bool:
        """Take a slot for *identity*; False when a limit is reached (answer 429)."""
        with self._lock:
            if self._total >= self.max_total or self._per_identity[identity] >= self.max_per_identity:
                return False
            self._total += 1
            self._per_identity[identity] += 1
            return True

    def release(self, identity: str) -> None:
        with self._lock:
            if self._per_identity[identity] <= 0:
                return
            self._per_identity[identity] -= 1
            if not self._per_identity[identity]:
                del self._per_identity[identity]
            self._total -= 1

    @property
    def total(self) -> int:
        with self._lock:
            return self._total
