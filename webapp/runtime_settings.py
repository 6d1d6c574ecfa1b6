"""Runtime settings for the API and UI: read, save, and apply a save to the broker and the schedules.

The job layer (:mod:`settings.runtime`) validates and stores; this module supplies the names that
exist (queues on the broker, declared schedules), turns its exceptions into the web layer's (422 with
per-key reasons, 409 on a stale revision) and applies keys whose effect is immediate: a changed
``queues.<name>.paused`` pauses/resumes the queue on the broker, a changed ``schedules.<name>.paused``
pauses/resumes the schedule. An apply that fails (broker down) is logged and reported in ``warnings``;
the saved revision stands.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any

from jobs.queries import running_jobs_submitted_before
from settings import runtime as rs

from . import operations
from .errors import ApiError, Conflict, Invalid
from .services import Services

if TYPE_CHECKING:
    from .audit_log import Audited

logger = logging.getLogger(__name__)


def current(svc: Services) -> dict[str, Any]:
    """The runtime settings view (secrets masked)."""
    return rs.get_settings(svc.engine, svc.settings, older_snapshots=partial(running_jobs_submitted_before, svc.engine))


def queue_names(svc: Services) -> set[str]:
    """Queues that can be paused (none when the broker has no pause operation)."""
    try:
        return operations.known_queues(svc.broker) if hasattr(svc.broker, "pause") else set()
    except ApiError:
        return set()


def schedule_names(svc: Services) -> set[str]:
    return {s.name for s in svc.jobs.schedules()}


def save(svc: Services, values: Any, expected_revision: int, by: str, *, act: Audited) -> dict[str, Any]:
    """Save a batch and apply its immediate keys; the new view with ``changed`` and ``warnings``.

    The revision is written in *act*'s transaction (it commits with its audit record); the queue and
    schedule pause keys it changed are applied after that commit, each on its own.

    Raises:
      Invalid: Some values do not validate (``details``: key → reason); nothing was saved.
      Conflict: ``expected_revision`` is stale; nothing was saved.
    """
    try:
        view = rs.put_settings(
            svc.engine,
            values,
            expected_revision,
            by,
            settings=svc.settings,
            older_snapshots=partial(running_jobs_submitted_before, svc.engine),
            # Any well-formed queue/schedule name is accepted (the OpenAPI document says so): pausing a
            # queue before its first message is useful, and a name nothing uses comes back as a warning.
            queues=None,
            schedules=None,
            connection=act.connection,
        )
    except rs.SettingsInvalid as e:
        raise Invalid("Runtime settings did not validate; nothing was saved.", details=e.errors) from None
    except rs.SettingsConflict as e:
        raise Conflict(str(e), details={"current_revision": e.current}) from None
    changed = view.get("changed", {})
    act.note(revision=view["revision"], changed=sorted(changed))
    warnings: list[str] = []
    view["warnings"] = warnings
    act.after_commit(lambda: warnings.extend(apply(svc, changed, by=by)))
    return view


def apply(svc: Services, changed: dict[str, Any], *, by: str) -> list[str]:
    """Apply changed queue/schedule pause keys now; the reasons of those that could not be applied."""
    warnings: list[str] = []
    for key, value in sorted(changed.items()):
        found = rs.spec_for(key)
        if found is None or found[1] is None:
            continue
        name = found[1]
        try:
            if key.startswith("queues."):
                operations.set_paused(svc.broker, name, bool(value))
            elif key.startswith("schedules."):
                svc.jobs.set_schedule_paused(name, bool(value), by=by)
        except Exception as e:  # the save stands; report what did not apply
            logger.warning("Runtime setting %s saved but not applied: %s", key, type(e).__name__)
            warnings.append(f"{key}: saved, but not applied now ({type(e).__name__})")
    return warnings
