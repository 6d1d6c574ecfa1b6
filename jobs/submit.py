"""``submit``: create a job of any kind (or a workflow kind's workflow) and its message in one transaction."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from opentelemetry.trace import SpanKind
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from settings.environment import Settings, current_settings

from . import db, enqueue, tracing
from .errors import PayloadInvalid
from .publish import prepare_broker
from .records import JobRecord
from .registry import Registry
from .registry import registry as default_registry
from .workflows import submit_workflow_kind


def _traced(fn: Callable[..., JobRecord]) -> Callable[..., JobRecord]:
    """One ``tenure.job.submit`` span per submit: every message written inside it carries its context."""

    @functools.wraps(fn)
    def traced(target: Engine | Session, *, owner_id: str, kind: str, **kwargs: Any) -> JobRecord:
        with tracing.span("tenure.job.submit", kind=kind, owner_id=owner_id, span_kind=SpanKind.PRODUCER) as span:
            job = fn(target, owner_id=owner_id, kind=kind, **kwargs)
            if span is not None:
                span.set_attributes({"tenure.job.id": job.id, "tenure.job.created": job.created})
            return job

    return traced


@_traced
def submit(
    target: Engine | Session,
    *,
    owner_id: str,
    kind: str,
    payload: Mapping[str, Any] | None = None,
    resource: tuple[str, str] | None = None,
    idempotency_key: str | None = None,
    priority: int = 0,
    delay: float | timedelta | None = None,
    max_attempts: int | None = None,
    timeout_s: int | None = None,
    config: Mapping[str, Any] | None = None,
    registry: Registry | None = None,
    settings: Settings | None = None,
    retry_of_job_id: str | None = None,
    parent_job_id: str | None = None,
    concurrency_key: str | None = None,
) -> JobRecord:
    """Create a job (or return the one this idempotency key already made).

    With an Engine the job is committed before this returns; with a Session it is written in the
    session's transaction and commits (or rolls back) with the caller's own rows. The message goes
    into the same transaction when the kind's broker is SQLite on the same file, else into the outbox.

    Parameters:
      target: An Engine, or a Session whose transaction to join.
      owner_id: Who owns the job (idempotency keys and visibility are scoped by it).
      kind: A registered kind (see :mod:`jobs.registry`); a workflow kind creates its workflow
        (:func:`jobs.workflows.submit_workflow_kind`: priority, attempts and timeout apply per step).
      payload: JSON object passed to the kind's function as keyword arguments; it must fit the kind's
        payload schema (a retry re-submits the payload it retries as it was).
      resource: ``(type, id)`` of what the job works on, for listing and display.
      idempotency_key: Same key + same request → the existing job; scoped by (owner, kind).
      priority: Higher runs sooner (SQLite broker; other brokers ignore it).
      delay: Seconds (or a timedelta) before the first attempt may start.
      max_attempts: Attempts in all (default: the kind's, else the settings').
      timeout_s: Per-attempt limit (default: the kind's, else the settings').
      config: Extra settings to snapshot into the job (over :meth:`Settings.job_snapshot`).
      registry: Where to look the kind up (default: :data:`jobs.registry.registry`).
      settings: Default: this process's settings.
      retry_of_job_id, parent_job_id: Links to the job this one retries / belongs to.
      concurrency_key: The job's key under its kind's concurrency limit, where the limit takes one from
        the submit (``ConcurrencyLimit(from_submit=True)``; :mod:`jobs.limits`).

    Raises:
      UnknownKind: The kind is not registered (or no broker runs it).
      PayloadInvalid: The payload does not fit the kind's schema (``problems``: field → reasons).
      IdempotencyConflict: The key was used for a different request by this owner and kind.
      ValueError: A malformed argument (negative delay, …).

    Returns:
      The job's public record; ``created`` says whether this call created it.
    """
    registry = registry or default_registry
    k = registry.get(kind)
    settings = settings or current_settings()
    payload = dict(payload or {})
    if retry_of_job_id is None:
        problems = k.schema.problems(payload)
        if problems:
            raise PayloadInvalid(problems)
        payload = k.schema.normalized(payload)
    if k.workflow:  # one entry point for every kind: a workflow kind's submit creates its workflow
        return submit_workflow_kind(
            target,
            k,
            delay=delay,
            owner_id=owner_id,
            payload=payload,
            resource=resource,
            idempotency_key=idempotency_key,
            registry=registry,
            settings=settings,
            retry_of_job_id=retry_of_job_id,
        )
    broker = registry.broker_for(k.name)
    row = enqueue.new_job_row(
        owner_id=owner_id,
        kind=k.name,
        actor_name=k.name,
        queue_name=k.queue,
        safe_to_rerun=k.safe_to_rerun,
        payload=payload,
        resource=resource,
        idempotency_key=idempotency_key,
        priority=priority,
        delay=delay,
        max_attempts=max_attempts or k.max_attempts or settings.max_attempts,
        timeout_s=timeout_s or k.timeout_s or settings.job_timeout_s,
        config={**settings.job_snapshot(), **dict(config or {})},
        retry_of_job_id=retry_of_job_id,
        parent_job_id=parent_job_id,
        summary=k.summarize(payload),
        limit_keys=k.limit_keys(owner_id, payload, concurrency_key),
    )
    delay_ms = row["run_after"] - row["created_at"]
    prepare_broker(broker, k.queue)
    if isinstance(target, Session):
        return enqueue.insert(db.session_tx(target), row, broker, delay_ms)
    with db.write(target) as tx:
        return enqueue.insert(tx, row, broker, delay_ms)
