"""Job kinds: a name, the function that runs it, its payload schema, and the policy the job layer applies.

    from jobs import payloads, registry

    @registry.kind("render", queue="render", safe_to_rerun=True, never_retry=(ValueError,),
                   payload=payloads.schema("Render", recording_id=payloads.field("string", "Recording", required=True)),
                   summary=lambda p: p["recording_id"])
    def render(ctx: JobContext, *, recording_id: str) -> dict: ...

Declaring a kind records it and nothing more: no broker is touched. :meth:`Registry.bind` (called by
the process's composition root, e.g. ``tasks.compose``) declares one Dramatiq actor per job kind on
the broker; the actor's body runs the job bound to its thread (:mod:`jobs.current`). The job's own
retry policy applies, never Dramatiq's ``Retries`` (the actor has ``max_retries=0`` and never raises
to Dramatiq).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dramatiq
from dramatiq.broker import Broker

from . import current, limits
from .errors import UnknownKind
from .limits import ConcurrencyLimit, RateLimit
from .payloads import PayloadSchema, any_object

logger = logging.getLogger(__name__)

#: Backoff of attempt *n* (1-based), before jitter: ``min(BACKOFF_CAP_S, 2 ** n)`` seconds.
BACKOFF_CAP_S = 30.0
#: Jitter: the delay is multiplied by a uniform factor in ``[1 - JITTER, 1 + JITTER]``.
JITTER = 0.2
#: The queue of a workflow kind's parent: it is driven by its steps and is on no broker queue.
WORKFLOW_QUEUE = "workflow"
#: Dramatiq's TimeLimit must never fire on a job actor: the job layer enforces ``timeout_s`` itself.
ACTOR_TIME_LIMIT_MS = 10 * 365 * 24 * 3600 * 1000
#: Longest summary stored with a job.
MAX_SUMMARY_CHARS = 200


def default_backoff(attempt: int) -> float:
    """Seconds to wait before the attempt after *attempt*: ``min(30, 2**attempt)`` with ±20 % jitter."""
    base = min(BACKOFF_CAP_S, 2.0 ** max(0, attempt))
    return base * random.uniform(1 - JITTER, 1 + JITTER)


@dataclass(frozen=True)
class Kind:
    """A registered job kind.

    Attributes:
      name: The kind users submit (also the Dramatiq actor name).
      fn: ``fn(ctx, **payload)``; its return value is the job's result (JSON-serialisable).
      queue: Dramatiq queue of its messages.
      safe_to_rerun: Whether a run cut short by a lost worker may simply run again. False for
        kinds with external effects: such a job ends ``interrupted`` for review instead.
      backoff: ``backoff(attempt) -> seconds`` before the next attempt after a failed one.
      never_retry: Exception types that fail the job at once.
      max_attempts: Default attempts for this kind (None: the settings' default).
      timeout_s: Default per-attempt limit for this kind (None: the settings' default).
      workflow: A workflow kind (:meth:`Registry.workflow`): ``fn(request, **payload)`` returns the
        workflow's steps; submitting it creates a workflow parent and no Dramatiq actor runs it.
      payload: The payload's schema (title, fields, checks): submit validates with it, the API and
        the UI describe the kind from it.
      summary: ``summary(payload) -> str | None``: a short line saying which job this is (the import
        folder, the clip window), stored at submit, shown in lists and searchable. The payload itself
        is never shown.
      concurrency: At most so many of its jobs of one key run at once (:mod:`jobs.limits`).
      rate: At most so many of its jobs of one key start per period.
    """

    name: str
    fn: Callable[..., Any]
    queue: str = "default"
    safe_to_rerun: bool = True
    backoff: Callable[[int], float] = default_backoff
    never_retry: tuple[type[BaseException], ...] = ()
    max_attempts: int | None = None
    timeout_s: int | None = None
    workflow: bool = False
    payload: PayloadSchema | None = None
    summary: Callable[[dict[str, Any]], str | None] | None = None
    priority: int = 0
    concurrency: ConcurrencyLimit | None = None
    rate: RateLimit | None = None

    @property
    def schema(self) -> PayloadSchema:
        return self.payload or any_object(self.name.replace("_", " ").capitalize())

    def limit_keys(
        self, owner_id: str, payload: dict[str, Any], concurrency_key: str | None = None
    ) -> tuple[str | None, str | None]:
        """The job's ``(concurrency key, rate key)`` under this kind's limits (:mod:`jobs.limits`).

        Raises:
          ValueError: *concurrency_key* given although the kind's limit takes none from a submit.
        """
        if concurrency_key is not None and self.concurrency is None:
            raise ValueError(f"kind {self.name} has no concurrency limit to take a key for")
        return (
            self.concurrency.key_of(owner_id, payload, concurrency_key) if self.concurrency else None,
            self.rate.key_of(owner_id, payload) if self.rate else None,
        )

    def summarize(self, payload: dict[str, Any]) -> str | None:
        """This kind's summary of *payload* (a validated one), at most :data:`MAX_SUMMARY_CHARS`."""
        if self.summary is None:
            return None
        try:
            text = self.summary(payload)
        except Exception:  # a summary is a convenience: never the reason a submit fails
            logger.warning("The summary of a %s job could not be made.", self.name, exc_info=True)
            return None
        if not text:
            return None
        text = " ".join(str(text).split())
        return text if len(text) <= MAX_SUMMARY_CHARS else text[: MAX_SUMMARY_CHARS - 1] + "…"


class Registry:
    """Kinds by name (one per process by default: :data:`registry`) and the actors that run them."""

    def __init__(self) -> None:
        self._kinds: dict[str, Kind] = {}
        self._actors: dict[str, Any] = {}
        self._broker: Broker | None = None
        self._lock = threading.RLock()

    def kind(
        self,
        name: str | None = None,
        *,
        queue: str = "default",
        safe_to_rerun: bool = True,
        backoff: Callable[[int], float] = default_backoff,
        never_retry: tuple[type[BaseException], ...] = (),
        max_attempts: int | None = None,
        timeout_s: int | None = None,
        priority: int = 0,
        payload: PayloadSchema | None = None,
        summary: Callable[[dict[str, Any]], str | None] | None = None,
        concurrency: ConcurrencyLimit | None = None,
        rate: RateLimit | None = None,
        broker: Broker | None = None,
    ) -> Callable[[Callable[..., Any]], Kind]:
        """Decorator declaring a job kind.

        Parameters:
          name: Kind (and actor) name; default: the function's name.
          queue, safe_to_rerun, backoff, never_retry, max_attempts, timeout_s, payload, summary, concurrency,
            rate: See :class:`Kind`.
          priority: Dramatiq actor priority (worker-local ordering).
          broker: Declare its actor on this broker now (default: when the registry is bound, :meth:`bind`).

        Raises:
          ValueError: The name is already registered to another function.

        Returns:
          The :class:`Kind`.
        """

        def decorator(fn: Callable[..., Any]) -> Kind:
            k = Kind(
                name=name or fn.__name__,
                fn=fn,
                queue=queue,
                safe_to_rerun=safe_to_rerun,
                backoff=backoff,
                never_retry=tuple(never_retry),
                max_attempts=max_attempts,
                timeout_s=timeout_s,
                payload=payload,
                summary=summary,
                priority=priority,
                concurrency=concurrency,
                rate=rate,
            )
            self.add(k, broker=broker)
            return k

        return decorator

    def workflow(
        self,
        name: str | None = None,
        *,
        payload: PayloadSchema | None = None,
        summary: Callable[[dict[str, Any]], str | None] | None = None,
    ) -> Callable[[Callable[..., Any]], Kind]:
        """Decorator declaring a workflow kind: submitting it (from any entry point) creates a workflow.

        ``fn(request, **payload)`` gets a :class:`jobs.workflows.WorkflowRequest` and the payload and
        returns the workflow's first steps (:class:`jobs.workflows.Step`); a step may add more while it
        completes (:func:`jobs.workflows.extend_workflow`).

        Raises:
          ValueError: The name is already registered to another function.
        """

        def decorator(fn: Callable[..., Any]) -> Kind:
            k = Kind(
                name=name or fn.__name__,
                fn=fn,
                queue=WORKFLOW_QUEUE,
                safe_to_rerun=True,
                workflow=True,
                payload=payload,
                summary=summary,
            )
            self.add(k)
            return k

        return decorator

    def add(self, kind: Kind, *, broker: Broker | None = None) -> None:
        limits.declare(kind.concurrency)
        limits.declare(kind.rate)
        with self._lock:
            existing = self._kinds.get(kind.name)
            if existing is not None and existing.fn is not kind.fn:
                raise ValueError(f"job kind {kind.name!r} is already registered")
            self._kinds[kind.name] = kind
            target = broker or self._broker
            if target is not None and not kind.workflow:
                self._declare(kind, target)

    def bind(self, broker: Broker) -> None:
        """Declare the actor of every job kind (and of any kind added later) on *broker*. Idempotent; a
        process that composes itself anew (a test) binds its kinds to the new broker."""
        with self._lock:
            self._broker = broker
            for kind in self._kinds.values():
                actor = self._actors.get(kind.name)
                if not kind.workflow and (actor is None or actor.broker is not broker):
                    self._declare(kind, broker)

    def _declare(self, kind: Kind, broker: Broker) -> None:
        def actor_fn() -> None:
            current.run_bound()

        actor_fn.__name__ = kind.name
        # Only options the broker's middleware knows (Dramatiq refuses others): no Retries on top of the
        # job's own policy, and no TimeLimit under the job's own timeout.
        wanted = {"max_retries": 0, "time_limit": ACTOR_TIME_LIMIT_MS}
        options = {k: v for k, v in wanted.items() if k in broker.actor_options}
        self._actors[kind.name] = dramatiq.actor(
            actor_fn, actor_name=kind.name, queue_name=kind.queue, priority=kind.priority, broker=broker, **options
        )

    def broker_for(self, name: str) -> Broker:
        """The broker that runs kind *name*.

        Raises:
          UnknownKind: No such kind, or no broker runs it (the registry was never bound).
        """
        actor = self._actors.get(name)
        if actor is None:
            self.get(name)
            raise UnknownKind(f"job kind {name!r} is declared but not bound to a broker (Registry.bind)")
        return actor.broker

    def get(self, name: str) -> Kind:
        """The kind called *name*.

        Raises:
          UnknownKind: Nothing is registered under that name.
        """
        try:
            return self._kinds[name]
        except KeyError:
            raise UnknownKind(
                f"unknown job kind {name!r}; registered: {', '.join(sorted(self._kinds)) or 'none'}"
            ) from None

    def find(self, name: str) -> Kind | None:
        return self._kinds.get(name)

    def names(self) -> list[str]:
        return sorted(self._kinds)

    def remove(self, name: str) -> None:
        with self._lock:
            self._kinds.pop(name, None)
            self._actors.pop(name, None)


#: The process-wide registry.
registry = Registry()
