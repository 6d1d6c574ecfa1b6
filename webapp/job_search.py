"""The job search box's grammar, the same in the UI and the API (``q``): qualifiers and text.

``kind:render_clip status:failed status:cancelled owner:bob queue:render parent:<id> "session-2026" words``

- ``status:`` may repeat (a job in any of them matches); ``kind:``, ``queue:``, ``owner:`` (a user
  NAME) and ``parent:`` (a workflow's id: its steps) once each. A value may be quoted: ``kind:"a b"``.
- Everything else — words and ``"quoted phrases"`` — is text search (:mod:`jobs.read_store`): a job
  matches every word and phrase (an id prefix, or a substring of its kind, summary or error). A word of
  one or two ASCII characters matches the start of a job id only, so it must be hex digits.
- An unknown qualifier or status, a qualifier without a value or given twice, a short word that can
  be no id is refused with a reason (:class:`SearchInvalid`: 400 in the API, a message in the UI).
  Text with a colon that is no qualifier is searched when quoted: ``"Error: disk"``.

Parsing is here; every filter it yields is SQL of the job layer (:func:`jobs.queries.page_jobs`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import accounts
from jobs.queries import unsearchable

from .errors import ApiError, Forbidden
from .gateway import STATUSES, JobQuery

#: The qualifiers and what each filters (the UI offers them as suggestions).
QUALIFIERS = {
    "kind": "the job kind",
    "status": "a status (may repeat: any of them)",
    "owner": "the owner's user name",
    "queue": "the queue",
    "parent": "a workflow's id: its steps",
}
#: Longest search box content accepted.
MAX_QUERY_CHARS = 500

# A qualifier with a quoted or bare value, a quoted phrase (closing quote optional), or a word.
_TOKEN = re.compile(r'\s*(?:([A-Za-z_]\w*):(?:"([^"]*)"?|(\S*))|"([^"]*)"?|(\S+))')


class SearchInvalid(ApiError):
    """The search cannot be understood."""

    status, code = 400, "invalid_search"


@dataclass(frozen=True)
class Search:
    """A parsed search box: its qualifiers and its text terms (``owner`` is a user name)."""

    statuses: tuple[str, ...] = ()
    kind: str | None = None
    queue: str | None = None
    owner: str | None = None
    parent: str | None = None
    text: tuple[str, ...] = ()


def parse(q: str) -> Search:
    """The qualifiers and text terms of *q*.

    Raises:
      SearchInvalid: An unknown qualifier or status; a qualifier without a value, or one that may
        be given once given twice; a word of one or two ASCII characters that are not all hex digits; a
        query longer than :data:`MAX_QUERY_CHARS`.
    """
    if len(q) > MAX_QUERY_CHARS:
        raise SearchInvalid(f"The search is longer than {MAX_QUERY_CHARS} characters.")
    found: dict[str, str] = {}
    statuses: list[str] = []
    text: list[str] = []
    for match in _TOKEN.finditer(q):
        key, quoted_value, bare_value, phrase, word = match.groups()
        if key is None:
            term = (phrase if phrase is not None else word or "").strip()
            if term:
                _check_short(term)
                text.append(term)
            continue
        name = key.lower()
        value = (quoted_value if quoted_value is not None else bare_value or "").strip()
        if name not in QUALIFIERS:
            known = ", ".join(f"{k}:" for k in QUALIFIERS)
            raise SearchInvalid(
                f"Unknown qualifier {key}: (known: {known}); put text with a colon in quotes.",
                details={"q": [f"unknown qualifier {key}:"]},
            )
        if not value:
            raise SearchInvalid(f"The qualifier {name}: needs a value.", details={"q": [f"{name}: without a value"]})
        if name == "status":
            if value.lower() not in STATUSES:
                raise SearchInvalid(
                    f"Unknown status {value!r} (one of {', '.join(STATUSES)}).",
                    details={"q": [f"unknown status {value!r}"]},
                )
            statuses.append(value.lower())
        elif name in found and found[name] != value:
            raise SearchInvalid(f"The qualifier {name}: is given twice.", details={"q": [f"{name}: twice"]})
        else:
            found[name] = value
    return Search(tuple(dict.fromkeys(statuses)), text=tuple(text), **found)


def _check_short(term: str) -> None:
    """Refuses a word too short to search as text that is not the start of a job id either."""
    searched = term.replace("\x00", "")  # as the job layer searches it: a NUL is dropped
    if searched and unsearchable(searched):
        raise SearchInvalid(
            f"Search words need three characters or more: {term!r} is too short (a word of one or two "
            "characters matches the start of a job id, so it must be hex digits).",
            details={"q": [f"{term!r}: too short"]},
        )


def apply(search: Search, query: JobQuery, identity: Any, engine: Any) -> JobQuery:
    """*query* (the form's or the API's other filters) narrowed by *search*; ``owner:`` resolved by name.

    Raises:
      SearchInvalid: A qualifier contradicts a filter given beside the box.
      Forbidden: ``owner:`` naming another user, asked by a non-admin.
    """
    changes: dict[str, Any] = {"search": search.text or None}
    if search.statuses:
        both = tuple(s for s in search.statuses if not query.statuses or s in query.statuses)
        if not both:
            raise SearchInvalid("The search's statuses and the filter's have none in common.")
        changes["statuses"] = both
    for name, field in (("kind", "kind"), ("queue", "queue"), ("parent", "parent_job_id")):
        value = getattr(search, name)
        if value is not None:
            given = getattr(query, field)
            if given is not None and given != value:
                raise SearchInvalid(f"The search says {name}:{value} but the filter says {given}.")
            changes[field] = value
    if search.owner is not None:
        user = accounts.get_user_by_name(engine, search.owner)
        if identity.scope is not None and search.owner != identity.user.username:
            raise Forbidden("Searching other users' jobs needs the jobs.read_all permission.")
        # An unknown name matches no job: no owner id is empty.
        changes["owner_id"] = user.owner_id if user is not None else ""
    return replace(query, **changes)
