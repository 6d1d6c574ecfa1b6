"""Retention: delete finished jobs, and old events of kept jobs, once they are past their retention.

The 30-second resync (``tasks/maintenance.py``) calls :func:`prune` with :func:`effective_policy`
(``TENURE_RETENTION_*`` ← runtime settings ``retention.*``). All SQL is in
:mod:`jobs.retention_store`. What is deleted, and what is deliberately kept:

- **Units, not rows.** A top-level job and its workflow steps (``parent_job_id``, any depth) are one
  unit, deleted together in one statement, and only when every member is terminal and past the
  retention of its own status (``succeeded``: 7 days by default; ``failed``, ``cancelled``,
  ``interrupted``: 30 days; counted from ``completed_at``). A unit with a queued or running member
  (a step retried inside a finished workflow) is kept whole. Rows of a non-terminal job are never
  deleted, by this or by the event rule below.
- **Retries keep what they retry.** A manual retry is a new job whose ``retry_of_job_id`` names the
  old one, and a retried workflow's new steps depend on the old run's succeeded steps
  (``job_dependencies``). A unit that a kept job references either way is kept until that job goes
  too, rather than nulling the reference: the kept job's record stays exactly as written (its "retry
  of" link resolves, a reused step's result is still there), nothing rewrites a row another
  execution may be reading, and the cost is bounded (a retry finishes after what it retries, so the
  older unit waits at most one retention period longer). Both go in the same run once both are due.
- **With the job go** its events, idempotency keys and dependency edges (ON DELETE CASCADE; events
  first, in bounded batches) and its published outbox rows; a pending outbox row only loses its job
  id (SET NULL) and its message, when delivered, finds no job and does nothing.
- **Events of kept jobs.** A finished job kept longer than ``events`` (say failed jobs 30 days,
  events 7 days) loses its events, except its last one (how it ended), once it finished more than
  ``events`` ago. Events of a job that has not finished are kept whatever their age.
- **The live feed's cursor never goes back, and never skips silently.** The feed's global cursor is
  the ``job_events`` rowid on SQLite, and SQLite reuses the highest rowid after it is deleted.
  Retention never deletes the newest event row: a unit owning it waits for the next event anywhere
  (see :func:`jobs.retention_store.newest_event_job`). It also records the highest rowid it deleted
  (``retention_marks``); the feed reports the position after it as the oldest retained one, so a
  client resuming from an older cursor is told to resync (``cursor_expired``) instead of missing a
  deleted event. Operators must not ``VACUUM`` the live database either: VACUUM may renumber the
  rowids of a table without an INTEGER PRIMARY KEY.

Bounded and concurrent-safe: candidates are found in read transactions; each write transaction
re-verifies its units (with row locks on PostgreSQL) and deletes at most ``batch`` events or one
batch of units, so the SQLite write lock is held for milliseconds; a run stops after
``time_budget_s`` and the next run continues. Deleting is idempotent and re-verified, so two runs at
once delete each row once and never a row the rules keep. A manual retry racing the deletion of the
job it retries either commits first (the job is then kept) or fails as "no such job".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError

from settings.environment import DEFAULT_RETENTION_DAYS, DEFAULT_RETENTION_EVENTS_DAYS, Settings, current_settings
from settings.runtime import effective_values

from . import db
from . import retention_store as store
from .outbox import PUBLISHED_RETENTION_MS
from .status import TERMINAL_STATUSES
from .store import now_ms

logger = logging.getLogger(__name__)

DAY_S = 86_400.0
#: Rows per statement: events deleted per transaction, candidate roots read per query.
DEFAULT_BATCH = 1000
#: Units verified and deleted per write transaction (their jobs are one DELETE statement).
UNITS_PER_TX = 100
#: A run stops starting new transactions after this long; the next resync continues.
DEFAULT_TIME_BUDGET_S = 10.0

TERMINAL = tuple(sorted(s.value for s in TERMINAL_STATUSES))


def _days(days: Mapping[str, int]) -> dict[str, float]:
    return {status: d * DAY_S for status, d in days.items()}


@dataclass(frozen=True)
class RetentionPolicy:
    """How long finished rows are kept, in seconds, and how much one run may do.

    Attributes:
      jobs_s: Terminal status → how long a job of that status is kept after it finished.
      events_s: How long a finished job's events are kept after it finished (its last one stays
        while the job is kept); only matters where it is shorter than the job's retention.
      outbox_published_s: How long published outbox rows are kept (the relay prunes them too).
      batch: Rows per statement (events per transaction; candidates per read; jobs per DELETE).
      time_budget_s: A run starts no transaction after this long.
    """

    jobs_s: Mapping[str, float] = field(
        default_factory=lambda: {s: d * DAY_S for s, d in DEFAULT_RETENTION_DAYS.items()}
    )
    events_s: float = DEFAULT_RETENTION_EVENTS_DAYS * DAY_S
    outbox_published_s: float = PUBLISHED_RETENTION_MS / 1000
    batch: int = DEFAULT_BATCH
    time_budget_s: float = DEFAULT_TIME_BUDGET_S

    def __post_init__(self) -> None:
        missing = set(TERMINAL) - set(self.jobs_s)
        if missing:
            raise ValueError(f"RetentionPolicy.jobs_s lacks {sorted(missing)}")
        if self.batch < 1:
            raise ValueError("RetentionPolicy.batch must be at least 1")


@dataclass(frozen=True)
class PruneReport:
    """What one :func:`prune` run deleted.

    Attributes:
      jobs: Job rows deleted (workflow steps included).
      events: Event rows deleted (with their jobs, and old events of kept jobs).
      outbox: Published outbox rows deleted.
      held: Units past their retention kept because a kept job references them (a retry, a
        dependency) or because they own the live feed's newest event.
      complete: False when the time budget ended the run early (the next run continues).
    """

    jobs: int = 0
    events: int = 0
    outbox: int = 0
    held: int = 0
    complete: bool = True


def effective_policy(engine: Engine, settings: Settings | None = None) -> RetentionPolicy:
    """The policy in force: ``TENURE_RETENTION_*`` (*settings*) overlaid by saved runtime settings.

    Read on every resync, so a saved ``retention.*`` change applies from the next run.
    """
    settings = settings or current_settings()
    values = effective_values(engine, settings)
    days = {status: int(values[f"retention.{status}_jobs_days"]) for status in TERMINAL}
    return RetentionPolicy(
        jobs_s=_days(days),
        events_s=int(values["retention.events_days"]) * DAY_S,
    )


class _Counts:
    def __init__(self) -> None:
        self.jobs = self.events = self.outbox = self.held = 0


def prune(engine: Engine, policy: RetentionPolicy | None = None, *, now: int | None = None) -> PruneReport:
    """Delete what is past its retention, in bounded transactions; safe to run twice at once.

    Parameters:
      engine: The job database.
      policy: Retention and batch sizes (default: :class:`RetentionPolicy`'s defaults).
      now: The current time in epoch milliseconds (tests pass a later time instead of waiting).

    Raises:
      sqlalchemy.exc.OperationalError: The database is unavailable (what was deleted stays deleted).

    Returns:
      Counts of deleted rows.
    """
    policy = policy or RetentionPolicy()
    now = now_ms() if now is None else now
    deadline = time.monotonic() + policy.time_budget_s
    counts = _Counts()
    cutoffs = {status: now - int(policy.jobs_s[status] * 1000) for status in TERMINAL}
    complete = _prune_units(engine, policy, cutoffs, counts, deadline)
    complete = _prune_old_events(engine, policy, now, counts, deadline) and complete
    complete = _prune_outbox(engine, policy, now, counts, deadline) and complete
    report = PruneReport(counts.jobs, counts.events, counts.outbox, counts.held, complete)
    if report.jobs or report.events or report.outbox:
        logger.info(
            "Retention: pruned %d job(s), %d event(s), %d outbox row(s)%s%s",
            report.jobs,
            report.events,
            report.outbox,
            f"; {report.held} unit(s) held by references" if report.held else "",
            "" if complete else "; time budget reached, continuing next run",
        )
    return report


# -- whole units ---------------------------------------------------------------------------------------
def _prune_units(
    engine: Engine, policy: RetentionPolicy, cutoffs: Mapping[str, int], counts: _Counts, deadline: float
) -> bool:
    """Delete every unit past retention, oldest first per status; False when out of time.

    A unit held by a reference from another due unit (a retry, a reused step) is freed once that
    one is deleted, possibly later in the same pass or in a pass over another status; so passes
    repeat while one both deleted and held something.
    """
    while True:
        jobs_before = counts.jobs
        counts.held = 0
        if not _units_pass(engine, policy, cutoffs, counts, deadline):
            return False
        if not counts.held or counts.jobs == jobs_before:
            return True


def _units_pass(
    engine: Engine, policy: RetentionPolicy, cutoffs: Mapping[str, int], counts: _Counts, deadline: float
) -> bool:
    for status in TERMINAL:
        after = (-1, "")
        while True:
            if time.monotonic() >= deadline:
                return False
            with db.read(engine) as conn:
                candidates = store.candidate_roots(conn, status, cutoffs[status], after, policy.batch)
            if not candidates:
                break
            after = candidates[-1]
            roots = [job_id for _, job_id in candidates]
            for i in range(0, len(roots), UNITS_PER_TX):
                if time.monotonic() >= deadline:
                    return False
                _delete_units(engine, roots[i : i + UNITS_PER_TX], policy, cutoffs, counts)
            if len(candidates) < policy.batch:
                break
    return True


def _delete_units(
    engine: Engine, roots: Sequence[str], policy: RetentionPolicy, cutoffs: Mapping[str, int], counts: _Counts
) -> None:
    """Delete the units of *roots* that are still prunable: events first (``batch`` per
    transaction), then, in the last transaction, outbox rows and the jobs themselves."""
    held_counted = False
    while True:
        try:
            with db.write(engine) as tx:
                ids, held = _verify(tx.conn, roots, cutoffs)
                if len(ids) > policy.batch and len(roots) > 1:
                    split = True  # too many steps for one statement: halve the roots (nothing written)
                else:
                    split = False
                    if not held_counted:  # once per root, however many event transactions follow
                        counts.held += held
                        held_counted = True
                    if not ids:
                        return
                    deleted = store.delete_events(tx.conn, ids, policy.batch)
                    counts.events += deleted
                    if deleted < policy.batch:
                        counts.outbox += store.delete_published_outbox_of(tx.conn, ids)
                        counts.jobs += store.delete_jobs(tx.conn, ids)
                        return
        except IntegrityError as e:
            # PostgreSQL: a job referencing one of these was inserted concurrently (a manual retry);
            # the transaction rolled back and the next run decides again.
            logger.info("Retention: units changed while being pruned; retried next run (%s)", type(e).__name__)
            return
        if split:
            half = len(roots) // 2
            _delete_units(engine, roots[:half], policy, cutoffs, counts)
            _delete_units(engine, roots[half:], policy, cutoffs, counts)
            return


def _verify(conn: Any, roots: Sequence[str], cutoffs: Mapping[str, int]) -> tuple[list[str], int]:
    """The ids of the units of *roots* that may go now, and how many past-retention units are held.

    A unit may go when every member is terminal and past its status's cutoff, no job outside the
    deleted set references a member (retry or dependency), and (SQLite) no member owns the newest
    event. Holding a unit can hold another that it references, so this iterates to a fixed point.
    """
    store.lock_jobs(conn, roots)
    members = store.unit_members(conn, roots)
    store.lock_jobs(conn, [m.id for m in members if m.root_id != m.id])
    by_root: dict[str, list[store.Member]] = {}
    for m in members:
        by_root.setdefault(m.root_id, []).append(m)
    ok = {
        root
        for root, ms in by_root.items()
        if all(m.status in cutoffs and m.completed_at is not None and m.completed_at < cutoffs[m.status] for m in ms)
    }
    root_of = {m.id: m.root_id for m in members}
    references = store.references_into(conn, [m.id for m in members if m.root_id in ok])
    newest = store.newest_event_job(conn)
    due = len(ok)
    if newest is not None and root_of.get(newest) in ok:
        ok.discard(root_of[newest])
    changed = True
    while changed:
        changed = False
        for referenced, referencing in references:
            root = root_of.get(referenced)
            if root in ok and root_of.get(referencing) not in ok:
                ok.discard(root)
                changed = True
    return [m.id for m in members if m.root_id in ok], due - len(ok)


# -- old events of kept jobs ---------------------------------------------------------------------------
#: Per (database, status): the keyset position up to which every job is known to have no event
#: left but its last. Terminal jobs get no new events and new jobs finish later than any cutoff, so
#: the position stays true; it only saves re-reading that prefix (a new process starts from zero).
_event_marks: dict[tuple[str, str], tuple[int, str]] = {}
_marks_lock = threading.Lock()


def _prune_old_events(engine: Engine, policy: RetentionPolicy, now: int, counts: _Counts, deadline: float) -> bool:
    before = now - int(policy.events_s * 1000)
    chunk = max(1, policy.batch // 10)
    for status in TERMINAL:
        if policy.events_s >= policy.jobs_s[status]:
            continue  # events go with their jobs
        key = (engine.url.render_as_string(hide_password=True), status)
        with _marks_lock:
            after = _event_marks.get(key, (-1, ""))
        while True:
            if time.monotonic() >= deadline:
                return False
            with db.read(engine) as conn:
                found = store.jobs_with_old_events(conn, status, before, after, chunk)
            if not found:
                break
            ids = [job_id for _, job_id in found]
            while True:
                with db.write(engine) as tx:
                    deleted = store.delete_events(tx.conn, ids, policy.batch, finished_before=before)
                counts.events += deleted
                if deleted < policy.batch:
                    break
                if time.monotonic() >= deadline:
                    return False
            after = found[-1]
            with _marks_lock:
                _event_marks[key] = max(_event_marks.get(key, (-1, "")), after)
            if len(found) < chunk:
                break
    return True


# -- published outbox rows -----------------------------------------------------------------------------
def _prune_outbox(engine: Engine, policy: RetentionPolicy, now: int, counts: _Counts, deadline: float) -> bool:
    before = now - int(policy.outbox_published_s * 1000)
    while True:
        if time.monotonic() >= deadline:
            return False
        with db.write(engine) as tx:
            deleted = store.delete_published_outbox_before(tx.conn, before, policy.batch)
        counts.outbox += deleted
        if deleted < policy.batch:
            return True
