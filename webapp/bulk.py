"""Bulk cancel / retry by filter, shared by the API and the UI (with a dry-run count)."""

from __future__ import annotations

from typing import Any

from .errors import Conflict, JobNotFoundError
from .gateway import JobQuery, JobsGateway


def bulk_apply(
    gateway: JobsGateway, scope: str | None, by: str, query: JobQuery, action: str, *, limit: int, dry_run: bool
) -> dict[str, Any]:
    """Apply *action* (``cancel`` | ``retry``) to up to *limit* jobs matching *query* that allow it now.

    Returns: ``{"dry_run", "matched", "affected", "skipped", "job_ids"}`` — on a dry run, what would be
    affected; otherwise what was (for retry, the NEW jobs' ids). A job that finished or vanished
    between the listing and the action counts as skipped.
    """
    applies = (lambda j: j.can_cancel) if action == "cancel" else (lambda j: j.can_retry)
    candidates: list[Any] = []
    cursor = None
    while len(candidates) < limit:
        page = gateway.list_jobs(scope, query, cursor=cursor, limit=min(200, limit))
        candidates.extend(j for j in page.items if applies(j))
        cursor = page.next_cursor
        if cursor is None:
            break
    candidates = candidates[:limit]
    # The count scans a bounded number of the newest jobs (MAX_COUNT_ROWS); the candidates may come from
    # further back. Every candidate matches, so the count is at least their number (skipped never < 0).
    matched = max(gateway.count_jobs(scope, query), len(candidates))
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
            if action == "cancel":
                changed.append(gateway.cancel(scope, job.id, by=by)[0].id)
            else:
                changed.append(gateway.retry(scope, job.id, by=by).id)
        except (Conflict, JobNotFoundError):
            continue
    return {
        "dry_run": False,
        "matched": matched,
        "affected": len(changed),
        "skipped": matched - len(changed),
        "job_ids": changed,
    }
