"""Job kinds: a Dramatiq actor name plus the policy the job layer applies to it.

    from jobs import registry

    @registry.kind("render", queue="render", safe_to_rerun=True, never_retry=(ValueError,))
    def render(ctx: JobContext, *, recording_id: str) -> dict: ...

Declaring a kind declares a Dramatiq actor whose function runs the job (see
:mod:`jobs.middleware`): the job's own retry policy applies, never Dramatiq's ``Retries`` (the
actor has ``max_retries=0`` and never raises to Dramatiq).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dramatiq
from dramatiq.broker import Broker

from .errors import UnknownKind

#: Backoff of attempt *n* (1-based), before jitter: ``min(BACKOFF_CAP_S, 2 ** n)`` seconds.
BACKOFF_CAP_S = 30.0
#: Jitter: the delay is multiplied by a uniform factor in ``[1 - JITTER, 1 + JITTER]``.
JITTER = 0.2
#: What a workflow kind shows as its queue: its parent is driven by its steps and is on no queue.
WORKFLOW_QUEUE = "workflow"
#: Dramatiq's TimeLimit must never fire on a job actor: the job layer enforces ``timeout_s`` itself.
ACTOR_TIME_LIMIT_MS = 10 * 365 * 24 * 3600 * 1000


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
    """

    name: str
    fn: Callable[..., Any]
    queue: str = "default"
    safe_to_rerun: bool = True
    backoff: Callable[[int], float] = default_backoff
    never_retry: tuple[type[BaseException], ...] = ()
    max_attempts: int | None = None
    timeout_s: int | None = None
    actor: Any = field(default=None, compare=False)
    workflow: bool = False


class Registry:
    """Kinds by name (one per process by default: :data:`registry`)."""

    def __init__(self) -> None:
        self._kinds: dict[str, Kind] = {}
        self._lock = threading.Lock()

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
        broker: Broker | None = None,
    ) -> Callable[[Callable[..., Any]], Kind]:
        """Decorator declaring a job kind and its Dramatiq actor.

        Parameters:
          name: Kind (and actor) name; default: the function's name.
          queue, safe_to_rerun, backoff, never_retry, max_attempts, timeout_s: See :class:`Kind`.
          priority: Dramatiq actor priority (worker-local ordering).
          broker: The broker of the actor (default: Dramatiq's global broker).

        Raises:
          ValueError: The name is already registered to another function.

        Returns:
          The :class:`Kind`.
        """

        def decorator(fn: Callable[..., Any]) -> Kind:
            kind_name = name or fn.__name__
            from .middleware import run_current_job  # the actor body; imported late to avoid a cycle

            def actor_fn() -> None:
                run_current_job()

            actor_fn.__name__ = kind_name
            target = broker or dramatiq.get_broker()
            # Only options the broker's middleware knows (Dramatiq refuses others): no Retries on
            # top of the job's own policy, and no TimeLimit under the job's own timeout.
            wanted = {"max_retries": 0, "time_limit": ACTOR_TIME_LIMIT_MS}
            options = {k: v for k, v in wanted.items() if k in target.actor_options}
            actor = dramatiq.actor(
                actor_fn, actor_name=kind_name, queue_name=queue, priority=priority, broker=target, **options
            )
            k = Kind(
                name=kind_name,
                fn=fn,
                queue=queue,
                safe_to_rerun=safe_to_rerun,
                backoff=backoff,
                never_retry=tuple(never_retry),
                max_attempts=max_attempts,
                timeout_s=timeout_s,
                actor=actor,
            )
            self.add(k)
            return k

        return decorator

    def workflow(self, name: str | None = None) -> Callable[[Callable[..., Any]], Kind]:
        """Decorator declaring a workflow kind: submitting it (from any entry point) creates a workflow.

        ``fn(request, **payload)`` gets a :class:`jobs.workflows.WorkflowRequest` and the payload and
        returns the workflow's first steps (:class:`jobs.workflows.Step`); a step may add more while it
        completes (:func:`jobs.workflows.extend_workflow`). The payload's fields are ``fn``'s keyword
        parameters, exactly as for a job kind, so forms and validation work the same.

        Raises:
          ValueError: The name is already registered to another function.
        """

        def decorator(fn: Callable[..., Any]) -> Kind:
            k = Kind(name=name or fn.__name__, fn=fn, queue=WORKFLOW_QUEUE, safe_to_rerun=True, workflow=True)
            self.add(k)
            return k

        return decorator

    def add(self, kind: Kind) -> None:
        with self._lock:
            existing = self._kinds.get(kind.name)
            if existing is not None and existing.fn is not kind.fn:
                raise ValueError(f"job kind {kind.name!r} is already registered")
            self._kinds[kind.name] = kind

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


#: The process-wide registry.
registry = Registry()
