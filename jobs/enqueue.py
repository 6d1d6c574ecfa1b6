"""Writing a new job: its row, its idempotency key, its first event and its first message, in one transaction.

Used by :func:`jobs.submit` for one job and by :mod:`jobs.workflows` for a workflow's parent and steps.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from functools import partial
from typing import Any

from . import admission, db, events, store, tracing
from .admission_policy import policy
from .admission_store import HeldJob
from .errors import IdempotencyConflict
from .lifecycle import lifecycle
from .records import JobRecord
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
    summary: str | None = None,
    limit_keys: tuple[str | None, str | None] = (None, None),
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
        "summary": summary,
        "trace_context": tracing.stored_context(),
        "concurrency_key": limit_keys[0],
        "rate_key": limit_keys[1],
        "held": None,
        "held_on": None,
    }


def candidate(row: Mapping[str, Any]) -> HeldJob:
    """What admission needs of a new job's row."""
    return HeldJob(**{name: row[name] for name in HeldJob.__dataclass_fields__})


def _existing(tx: db.Tx, found: tuple[str, str], digest: str) -> JobRecord:
    found_digest, job_id = found
    if found_digest != digest:
        raise IdempotencyConflict()
    job = store.job_get(tx.conn, job_id)
    assert job is not None, "idempotency row without its job (FK)"
    return JobRecord.from_row(job, created=False)


class _KeyTaken(Exception):
    pass


def insert(
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
    decided = None
    if broker is not None and after_insert is None:
        # Decided before the row exists, so the job does not count against itself; it is written waiting.
        decided = admission.verdict(tx, candidate(row), now=now, delay_ms=delay_ms, rules=policy(conn))
        row["held"], row["held_on"] = decided.held, decided.on
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
    events.status_event(tx, job_id=row["id"], sequence=1, status="queued", now=now)
    tx.after_commit(partial(lifecycle, "job.queued", row["id"], row["kind"], 0))
    if after_insert is not None:
        after_insert(tx, row)
        job = store.job_get(conn, row["id"])
        assert job is not None
        return JobRecord.from_row(job, created=True)
    if decided is not None and decided.held is None:
        admission.publish(tx, candidate(row), decided.delay_ms, now, broker)
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
