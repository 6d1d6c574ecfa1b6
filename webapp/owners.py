"""Job owners as people see them: user names, never the internal owner ids (``str(user.id)``).

Job records carry owner ids, and so do the timeline's ``by`` and the schedules' ``paused_by`` /
``fired_by``. The API and the UI show user names instead (an owner that is no user, such as a
schedule's ``scheduler``, shows as recorded), and filters take names: :func:`owner_name` and
:func:`owner_filter` are the one translation both use. Names are looked up once per request and owner
(a page of jobs: in one query, :func:`prefetch_owner_names`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flask import g

import accounts
from jobs.admission import describe
from jobs.enqueue import MAX_KEY_CHARS

from .services import services

#: An owner id no job carries (the job layer refuses owner ids longer than MAX_KEY_CHARS): the filter of a
#: name nobody has, so a list, a count and a bulk action over it find nothing.
NOBODY = "-" * (MAX_KEY_CHARS + 1)
#: Event types whose ``by`` is the acting user's owner id (other events' ``by`` names a workflow step).
USER_ACTIONS = frozenset({"status", "cancel_requested", "run_now"})


def _known() -> dict[str, str]:
    return g.setdefault("owner_names", {})


def prefetch_owner_names(owner_ids: Iterable[str]) -> None:
    """Look up the names of *owner_ids* in one query (a page of jobs), for :func:`owner_name` to find."""
    known = _known()
    wanted = {o for o in owner_ids if o not in known}
    if wanted:
        found = accounts.usernames(services().engine, wanted)
        known.update({o: found.get(o, o) for o in wanted})


def owner_name(owner_id: str | None) -> str | None:
    """The user name of *owner_id*, or *owner_id* as recorded when it is no user's."""
    if owner_id is None:
        return None
    prefetch_owner_names([owner_id])
    return _known()[owner_id]


def owner_filter(name: str) -> str:
    """The owner id an ``owner`` filter naming *name* selects (:data:`NOBODY` when no owner has that name)."""
    found = accounts.owner_id_of(services().engine, name)
    return NOBODY if found is None else found


def waiting(detail: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a waiting job waits for, as people see it: an owner key by the owner's name, and its line
    (``waiting: concurrency key render_clip.owner=bob, 2/2 running``)."""
    if detail is None:
        return None
    shown = {k: v for k, v in detail.items() if k != "key_is_owner"}
    if detail.get("key_is_owner"):
        shown["key"] = owner_name(detail["key"])
    if "running" in shown or "started" in shown or shown["reason"] in ("fair_share", "steps"):
        shown["text"] = describe(shown)
    return shown


def event_data(type_: str, data: dict[str, Any]) -> dict[str, Any]:
    """A timeline event's data with ``by`` as a user name where it names the acting user."""
    by = data.get("by")
    if type_ not in USER_ACTIONS or not isinstance(by, str):
        return data
    return {**data, "by": owner_name(by)}
