"""``submit``: create a job, its idempotency key and its broker message in one transaction."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from settings.environment import Settings, current_settings

from . import db, events, store
from .errors import IdempotencyConflict
from .publish import prepare_broker, publish_in_transaction
from .records import JobRecord
from .registry import Registry
from .registry import registry as default_registry
from .status import JobStatus
from .store import JobRow

#: Longest idempotency key, owner id, resource type/id accepted.
MAX_KEY_CHARS = 200


def retry_key(job_id: str) -> str:
    """The idempotency key a retry of *job_id* is submitted with (scoped, like any key, by owner and kind)."""
    return f"tenure:retry-of:{job_id}"


def request_digest(kind: str, payload: Mapping[str, Any], resource: tuple[str, str] | None) -> str:
    """SHA-256 of the canonical request: what "the same request" means for an idempotency key."""
    doc = {"kind": kind, "payload": payload, "resource": list(resource) if resource else None}
    return hashlib.sha256(store.dumps(doc).encode()).hexdigest()


def _seconds(delay: float | timedelta | None) -> float:
    if delay is None:
        return 0.0
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    if seconds < 0:
        raise ValueError(f"delay must not be negative, got {delay!r}")
    return seconds


def _check_text(name: str, value: Any, *, required: bool) -> None:
    if value is None and not required:
        return
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_CHARS:
        raise ValueError(f"{name} must be a non-empty string of at most {MAX_KEY_CHARS} characters, got {value!r}")


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
      payload: JSON object passed to the kind's function as keyword arguments.
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

    Raises:
      UnknownKind: The kind is not registered.
      IdempotencyConflict: The key was used for a different request by this owner and kind.
      ValueError: A malformed argument (payload not a JSON object, negative delay, …).

    Returns:
      The job's public record; ``created`` says whether this call created it.
    """
    k = (registry or default_registry).get(kind)
    settings = settings or current_settings()
    if k.workflow:  # one entry point for every kind: a workflow kind's submit creates its workflow
        from .workflows import submit_workflow_kind  # late: workflows builds on this module

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
    row = new_job_row(
        owner_id=owner_id,
        kind=k.name,
        actor_name=k.actor.actor_name,
        queue_name=k.actor.queue_name,
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
    )
    delay_ms = row["run_after"] - row["created_at"]
    broker = k.actor.broker
    prepare_broker(broker, k.queue)
    if isinstance(target, Session):
        return _submit_in(db.session_tx(target), row, broker, delay_ms)
    with db.write(target) as tx:
        return _submit_in(tx, row, broker, delay_ms)


def new_job_row(
    *,
    owner_id: str,
    kind: str,
    actor_name: str,
    queue_name: str,
    safe_to_rerun: bool,
    payload: Mapping[str, Any] | None,
    resource: tuple[str, str] | None,
    idempotency_key: str | None,
    priority: int,
    delay: float | timedelta | None,
    max_attempts: int,
    timeout_s: int,
    config: Mapping[str, Any],
    retry_of_job_id: str | None = None,
    parent_job_id: str | None = None,
    digest: str | None = None,
) -> dict[str, Any]:
    """Validate a request and build the ``jobs`` row :func:`jobs.store.job_insert` expects.

    Raises:
      ValueError: A malformed argument.
    """
    _check_text("owner_id", owner_id, required=True)
    _check_text("idempotency_key", idempotency_key, required=False)
    payload = dict(payload or {})
    try:
        payload_text = store.dumps(payload)
    except (TypeError, ValueError) as e:
        raise ValueError(f"payload must be JSON-serialisable: {e}") from None
    if resource is not None:
        if len(resource) != 2:
            raise ValueError("resource must be a (type, id) pair")
        resource = (str(resource[0]), str(resource[1]))
    if max_attempts < 1 or timeout_s < 1:
        raise ValueError("max_attempts and timeout_s must be at least 1")
    now = store.now_ms()
    return {
        "id": uuid.uuid4().hex,
        "owner_id": owner_id,
        "kind": kind,
        "actor_name": actor_name,
        "queue_name": queue_name,
        "resource_type": resource[0] if resource else None,
        "resource_id": resource[1] if resource else None,
        "idempotency_key": idempotency_key,
        "request_digest": digest or request_digest(kind, payload, resource),
        "payload": payload_text,
        "config": store.dumps(dict(config)),
        "priority": int(priority),
        "max_attempts": int(max_attempts),
        "timeout_s": int(timeout_s),
        "safe_to_rerun": bool(safe_to_rerun),
        "run_after": now + int(_seconds(delay) * 1000),
        "created_at": now,
        "retry_of_job_id": retry_of_job_id,
        "parent_job_id": parent_job_id,
    }


def _existing(tx: db.Tx, found: tuple[str, str], digest: str) -> JobRecord:
    found_digest, job_id = found
    if found_digest != digest:
        raise IdempotencyConflict()
    job = store.job_get(tx.conn, job_id)
    assert job is not None, "idempotency row without its job (FK)"
    return JobRecord.from_row(job, created=False)


class _KeyTaken(Exception):
    pass


def _submit_in(
    tx: db.Tx,
    row: dict[str, Any],
    broker: Any,
    delay_ms: int,
    *,
    after_insert: Callable[[db.Tx, dict[str, Any]], None] | None = None,
) -> JobRecord:
    """Insert *row* (unless its idempotency key already names a job) with its first event and message.

    ``broker=None`` writes no message (a workflow parent); ``after_insert`` runs once the row exists.
    """
    conn = tx.conn
    key = row["idempotency_key"]
    if key is not None:
        # On SQLite this read runs under the write lock (BEGIN IMMEDIATE), so no other submit can
        # insert the key between it and our insert. PostgreSQL can: see the savepoint below.
        found = store.idempotency_get(conn, row["owner_id"], row["kind"], key)
        if found is not None:
            return _existing(tx, found, row["request_digest"])
    now = row["created_at"]
    if key is not None and conn.dialect.name != "sqlite":
        try:
            with tx.savepoint():
                store.job_insert(conn, row)
                if not store.idempotency_insert(
                    conn, row["owner_id"], row["kind"], key, row["request_digest"], row["id"], now
                ):
                    raise _KeyTaken
        except _KeyTaken:
            found = store.idempotency_get(conn, row["owner_id"], row["kind"], key)
            assert found is not None
            return _existing(tx, found, row["request_digest"])
    else:
        store.job_insert(conn, row)
        if key is not None:
            store.idempotency_insert(conn, row["owner_id"], row["kind"], key, row["request_digest"], row["id"], now)
    events.status_event(tx, job_id=row["id"], owner_id=row["owner_id"], sequence=1, status="queued", now=now)
    if after_insert is not None:
        after_insert(tx, row)
        job = store.job_get(conn, row["id"])
        assert job is not None
        return JobRecord.from_row(job, created=True)
    if broker is None:
        return JobRecord.from_row(_new_row(row), created=True)
    publish_in_transaction(
        conn,
        broker,
        job_id=row["id"],
        actor_name=row["actor_name"],
        queue_name=row["queue_name"],
        priority=row["priority"],
        delay_ms=delay_ms,
        now=now,
    )
    return JobRecord.from_row(_new_row(row), created=True)


def _new_row(row: dict[str, Any]) -> JobRow:
    return JobRow(
        **{k: row[k] for k in row if k in JobRow.__dataclass_fields__},
        status=JobStatus.QUEUED.value,
        attempt=0,
        worker_id=None,
        lease_expires_at=None,
        progress=None,
        progress_message=None,
        result=None,
        error=None,
        cancel_requested_at=None,
        event_seq=1,
        updated_at=row["created_at"],
        started_at=None,
        completed_at=None,
    )
