"""Bulk cancel / retry by filter, shared by the API and the UI (with a dry-run count)."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from typing import Any

from sqlalchemy.orm import Session

from .errors import Conflict, JobNotFoundError
from .gateway import RETRYABLE, JobQuery, JobView
from .jobs_adapter import JobLayerGateway

#: The statuses each action can apply to (``JobView.can_cancel`` / ``can_retry``).
ACTION_STATUSES = {"cancel": ("queued", "running"), "retry": tuple(sorted(RETRYABLE))}


def bulk_apply(
    gateway: JobLayerGateway,
    scope: str | None,
    by: str,
    query: JobQuery,
    action: str,
    *,
    limit: int,
    dry_run: bool,
    session: Session | None = None,
) -> dict[str, Any]:
    """Apply *action* (``cancel`` | ``retry``) to up to *limit* jobs matching *query* that allow it now.

    With *session* (``jobs.db.write_session``) every job is changed in that one transaction, each under
    its own savepoint (a job that cannot be changed is skipped without undoing the others), so the whole
    action commits with its audit record.

    Returns: ``{"dry_run", "matched", "affected", "skipped", "job_ids"}`` — on a dry run, what would be
    affected; otherwise what was (for retry, the NEW jobs' ids). A job that finished or vanished
    between the listing and the action counts as skipped.
    """
    candidates = _candidates(gateway, scope, query, action, limit)
    matched = gateway.count_jobs(scope, query)  # exact (SQL); every candidate is one of them
    if dry_run:
        ids = [j.id for j in candidates]
        return {
            "dry_run": True,
            "matched": matched,
            "affected": len(ids),
            "skipped": matched - len(ids),
            "job_ids": ids,
        }
    changed = []
    for job in candidates:
        try:
            with session.begin_nested() if session is not None else nullcontext():
                if action == "cancel":
                    changed.append(gateway.cancel(scope, job.id, by=by, session=session)[0].id)
                else:
                    new, created = gateway.retry(scope, job.id, by=by, session=session)
                    if created:  # a job retried before answers its earlier retry: not retried again
                        changed.append(new.id)
        except (Conflict, JobNotFoundError):
            continue
    return {
        "dry_run": False,
        "matched": matched,
        "affected": len(changed),
        "skipped": matched - len(changed),
        "job_ids": changed,
    }


def _candidates(gateway: JobLayerGateway, scope: str | None, query: JobQuery, action: str, limit: int) -> list[JobView]:
    """The newest *limit* jobs matching *query* that *action* applies to now.

    Only the statuses the action applies to are listed (a status filter in SQL): listing every match
    instead read the whole history when few jobs qualified.
    """
    statuses = tuple(s for s in ACTION_STATUSES[action] if not query.statuses or s in query.statuses)
    if not statuses:
        return []
    applies = (lambda j: j.can_cancel) if action == "cancel" else (lambda j: j.can_retry)
    found: list[JobView] = []
    cursor = None
    while len(found) < limit:
        page = gateway.list_jobs(scope, replace(query, statuses=statuses), cursor=cursor, limit=min(500, limit))
        found.extend(j for j in page.items if applies(j))
        cursor = page.next_cursor
        if cursor is None:
            break
    return found[:limit]
