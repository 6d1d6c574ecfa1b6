"""The job status machine, written down three times: here (the enum and :data:`ALLOWED`), drawn in
docs/jobs.md, and enforced by the database (CHECKs in jobs/models.py; the ``jobs_status_moves`` trigger
of revision 0009, which since revision 0013 checks every write of ``status``, not only a change).

queued ──claim──► running ──► succeeded | failed | cancelled
   ▲                 │  └──► interrupted   (lease expired on an unsafe kind)
   └──retry/recover──┘
queued ──cancel──► cancelled           queued ──no handler──► failed

Every move is one function of :mod:`jobs.transitions`; nothing else changes a job's status.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    #: Waiting for a worker. Left by a worker's claim (→ running) or by ``cancel`` (→ cancelled);
    #: a message for a kind no worker knows ends it ``failed``.
    QUEUED = "queued"
    #: Owned by one worker (``worker_id``, ``attempt``) while its lease is renewed. Left by that
    #: worker (→ succeeded / failed / cancelled / queued for a retry) or, once the lease expired, by
    #: recovery (→ queued if the kind is safe to rerun, cancelled if cancel was requested, failed on
    #: its last attempt, else interrupted; a claim that meets the expired lease recovers it first).
    RUNNING = "running"
    #: Terminal. Nobody moves a job out of it; in particular it never becomes cancelled.
    SUCCEEDED = "succeeded"
    #: Terminal (errors exhausted the attempts, never-retry error, timeout, unknown kind).
    #: A person may ``retry`` it, which creates a NEW job.
    FAILED = "failed"
    #: Terminal (cancelled while queued, or the execution honoured a cancel request).
    CANCELLED = "cancelled"
    #: Terminal: the worker was lost while running a kind with external effects. Parked for a
    #: person to review; only a manual ``retry`` (a NEW job) runs it again.
    INTERRUPTED = "interrupted"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.INTERRUPTED})
#: Statuses a manual retry may start from.
RETRYABLE_STATUSES = frozenset({JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.INTERRUPTED})


S = JobStatus
#: Every status move a job may make, and the transition (:mod:`jobs.transitions`) that makes it. The
#: database refuses any other write of ``status``: a finished job's status is never written again, not
#: even to the same value (tests/integration/jobs/test_transition_walk.py walks every pair).
ALLOWED: frozenset[tuple[JobStatus, JobStatus]] = frozenset(
    {
        (S.QUEUED, S.RUNNING),  # claim; start_workflow
        (S.QUEUED, S.CANCELLED),  # cancel_queued
        (S.QUEUED, S.FAILED),  # fail_queued (no worker can run its kind)
        (S.RUNNING, S.SUCCEEDED),  # complete; finish_workflow
        (S.RUNNING, S.FAILED),  # fail; recover (last attempt lost); finish_workflow
        (S.RUNNING, S.CANCELLED),  # cancel_running (a checkpoint honoured the request); recover; finish_workflow
        (S.RUNNING, S.QUEUED),  # requeue_for_retry; recover (a safe kind's lease expired)
        (S.RUNNING, S.INTERRUPTED),  # interrupt (an unsafe kind's lease expired)
    }
)
