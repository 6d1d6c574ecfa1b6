"""A per-endpoint circuit breaker whose state lives in shared storage, so every worker process agrees.

States (stored): ``closed`` — calls flow, failures are counted; ``open`` — calls are refused until
``reset_timeout_s`` has passed since it opened, then exactly one caller (across all processes, by
an atomic claim with a lease) is let through as the *half-open probe*: its success closes the
breaker, its failure re-opens it; ``disabled`` — the endpoint said 410 Gone: refused until an
operator re-enables it. Only failures that say "the endpoint is unwell" count (5xx, timeouts,
connection errors); a 429 is flow control with its own ``Retry-After`` and a 4xx is our request's
fault, so neither trips the breaker.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

BreakerStateName = Literal["closed", "open", "disabled"]

#: Consecutive failures that open the breaker.
DEFAULT_FAILURE_THRESHOLD = 5
#: How long an open breaker refuses calls before letting one probe through.
DEFAULT_RESET_TIMEOUT_S = 60.0
#: How long a probe owns the half-open slot (a probe that crashed frees it after this).
DEFAULT_PROBE_LEASE_S = 30.0


@dataclass(frozen=True)
class BreakerState:
    """One endpoint's stored health."""

    endpoint: str
    state: BreakerStateName = "closed"
    consecutive_failures: int = 0
    opened_at: float | None = None
    probe_until: float | None = None
    last_error: str | None = None


class BreakerStore(Protocol):
    """Shared storage for breaker state; every method is one atomic statement (see ``store``)."""

    def endpoint_health_get(self, endpoint: str) -> BreakerState | None: ...

    def endpoint_health_record_failure(self, endpoint: str, now: float, threshold: int, error: str) -> BreakerState: ...

    def endpoint_health_record_success(self, endpoint: str, now: float) -> BreakerState: ...

    def endpoint_health_claim_probe(
        self, endpoint: str, now: float, reset_timeout_s: float, lease_s: float
    ) -> bool: ...

    def endpoint_health_set_disabled(self, endpoint: str, now: float, disabled: bool, reason: str) -> None: ...


@dataclass(frozen=True)
class BreakerDecision:
    """Whether a call may go out now."""

    allowed: bool
    state: BreakerStateName
    probe: bool = False  # this caller holds the half-open probe slot
    retry_in_s: float | None = None  # when refused: how long until a probe may go


class CircuitBreaker:
    """Decide per call, and record outcomes, against a :class:`BreakerStore`.

    Parameters
    ----------
    store:
        Shared state (e.g. :class:`~tasks.domain.notify.store.SQLBreakerStore`).
    failure_threshold, reset_timeout_s, probe_lease_s:
        See the module constants.
    clock:
        Unix-time source; tests inject a fake one instead of sleeping.
    """

    def __init__(
        self,
        store: BreakerStore,
        *,
        failure_threshold: int = DEFAULT_FAILURE_THRESHOLD,
        reset_timeout_s: float = DEFAULT_RESET_TIMEOUT_S,
        probe_lease_s: float = DEFAULT_PROBE_LEASE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.failure_threshold = failure_threshold
        self.reset_timeout_s = reset_timeout_s
        self.probe_lease_s = probe_lease_s
        self.clock = clock

    def state(self, endpoint: str) -> BreakerState:
        """The stored state (``closed`` with no failures for an endpoint never seen)."""
        return self.store.endpoint_health_get(endpoint) or BreakerState(endpoint)

    def before_call(self, endpoint: str) -> BreakerDecision:
        """Ask whether a call to ``endpoint`` may go out now.

        Parameters
        ----------
        endpoint:
            The breaker key (one per configured endpoint).

        Returns
        -------
        BreakerDecision
            Allowed when closed; when open, allowed only for the one caller that claims the probe.
        """
        current = self.state(endpoint)
        if current.state == "closed":
            return BreakerDecision(True, "closed")
        if current.state == "disabled":
            return BreakerDecision(False, "disabled")
        now = self.clock()
        if self.store.endpoint_health_claim_probe(endpoint, now, self.reset_timeout_s, self.probe_lease_s):
            return BreakerDecision(True, "open", probe=True)
        reopen_at = (current.opened_at or now) + self.reset_timeout_s
        lease_end = current.probe_until or 0.0
        return BreakerDecision(False, "open", retry_in_s=max(0.0, max(reopen_at, lease_end) - now))

    def record_success(self, endpoint: str) -> BreakerState:
        """The call succeeded: close the breaker and reset the count."""
        return self.store.endpoint_health_record_success(endpoint, self.clock())

    def record_failure(self, endpoint: str, error: str) -> BreakerState:
        """The endpoint looked unwell: count it; opens at the threshold, re-opens after a failed probe."""
        return self.store.endpoint_health_record_failure(endpoint, self.clock(), self.failure_threshold, error)

    def disable(self, endpoint: str, reason: str) -> None:
        """The endpoint is gone (410): refuse every call until :meth:`enable`."""
        self.store.endpoint_health_set_disabled(endpoint, self.clock(), True, reason)

    def enable(self, endpoint: str) -> None:
        """An operator re-enabled the endpoint: back to closed."""
        self.store.endpoint_health_set_disabled(endpoint, self.clock(), False, "re-enabled")
