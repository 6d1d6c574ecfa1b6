"""How each attempt of a job ended, read back from the events that recorded it.

An attempt is recorded where it happens: the ``status`` event ``running`` opens it (the claim), and
the transition that ends it writes its ``outcome`` (and, when the job moved on, ``next``) into the
status event it writes (:mod:`jobs.transitions`). A lost lease adds a ``lease_expired`` event (which
worker, which host, when the lease ran out) before the recovery's status event. An attempt that timed
out while its thread would not stop reads ``timed out — still exiting`` while its ``job_exits`` row
is live (:mod:`jobs.exit_store`), and ``timed out`` once the thread returned or its worker died: a
finished job gets no event after its final status, so that end shows in the attempt, not the timeline.

Events written before outcomes were recorded carry none; their outcome is inferred from the status
as it was before (``queued`` after ``running``: a retry was scheduled).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

#: Attempt outcomes (the ``outcome`` of the status event that ends an attempt).
SUCCEEDED = "succeeded"
FAILED = "failed"
TIMED_OUT = "timed out"
TIMED_OUT_STILL_EXITING = "timed out — still exiting"
LEASE_LOST = "lease lost — worker died"
CANCELLED = "cancelled"
#: What an attempt still running shows.
RUNNING = "running"

#: What happened next (the ``next`` of that status event).
NEXT_RETRY = "retry scheduled"
NEXT_REQUEUED = "requeued"
NEXT_FAILED = "failed"
NEXT_CANCELLED = "cancelled"
NEXT_INTERRUPTED = "interrupted"

#: The event type the attempts are read from.
EVENT_TYPE = "status"


class _Event(Protocol):
    """What :func:`attempts_from` reads of an event (a :class:`jobs.records.JobEventRecord`)."""

    type: str
    data: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of a job: when it ran, how it ended, what happened next."""

    attempt: int
    started_at: datetime
    ended_at: datetime | None
    outcome: str
    #: What the job did after this attempt (None: it was the job's last word, or it is still running).
    next: str | None = None
    error: str | None = None
    #: The host that ran it when its lease was lost (else not recorded here).
    host: str | None = None


def attempts_from(events: Iterable[_Event], *, still_exiting: int | None = None) -> list[AttemptRecord]:
    """The attempts recorded by *events* (a job's events in sequence order), oldest first.

    *still_exiting*: the attempt whose thread is still exiting after its timeout, if any."""
    attempts: list[AttemptRecord] = []
    for event in events:
        data = event.data
        if event.type != EVENT_TYPE:
            continue
        status = data.get("status")
        open_ = attempts[-1] if attempts and attempts[-1].ended_at is None else None
        if status == "running":
            if open_ is not None:  # claimed over its expired lease before outcomes were recorded
                attempts[-1] = replace(open_, ended_at=event.created_at, outcome=LEASE_LOST, next=NEXT_REQUEUED)
            attempts.append(AttemptRecord(int(data.get("attempt", len(attempts) + 1)), event.created_at, None, RUNNING))
        elif open_ is not None:
            outcome, next_ = (data["outcome"], data.get("next")) if "outcome" in data else _legacy(data)
            attempts[-1] = replace(
                open_,
                ended_at=event.created_at,
                outcome=outcome,
                next=next_,
                error=data.get("error"),
                host=data.get("host"),
            )
    return [
        replace(a, outcome=TIMED_OUT_STILL_EXITING) if a.attempt == still_exiting and a.outcome == TIMED_OUT else a
        for a in attempts
    ]


def _legacy(data: dict[str, Any]) -> tuple[str, str | None]:
    """The outcome and next step of a status event written before outcomes were recorded."""
    status = str(data.get("status"))
    if data.get("reason") == "lease expired":
        return LEASE_LOST, NEXT_REQUEUED if status == "queued" else status
    if status == "queued":
        return FAILED, NEXT_RETRY
    return status, None
