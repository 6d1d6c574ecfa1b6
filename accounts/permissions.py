"""The named actions a role grants, and the built-in roles (the one list; migrations copy it as data).

An action is a stable dotted name. A role is a set of actions stored in the database (``roles`` and
``role_permissions``, :mod:`accounts.store`); an API token carries a subset of its user's actions,
and what a token may do is that subset intersected with its user's role *now* (a role change narrows
every token of the role at once). The web app checks these names in one place
(``webapp.permissions.require``).

Job visibility follows from two actions: ``jobs.read_all`` sees every owner's jobs, otherwise a caller
sees only their own (``jobs.read_own``). The job actions (cancel, retry, bulk) apply to the jobs the
caller sees: a user's to their own, an operator's to everyone's.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Every action, with what it allows (shown in the UI, the API and the OpenAPI document).
ACTIONS: dict[str, str] = {
    "jobs.read_own": "see your own jobs: lists, pages, timelines, files, the live feed",
    "jobs.read_all": "see every owner's jobs (and act on them with the job actions you have)",
    "jobs.submit": "submit jobs and upload recordings",
    "jobs.cancel": "cancel queued or running jobs; delete finished ones",
    "jobs.retry": "retry failed, cancelled or interrupted jobs as new jobs",
    "jobs.bulk": "cancel or retry many jobs at once (with jobs.cancel or jobs.retry)",
    "queues.pause": "pause and resume queues, start a waiting job now, acknowledge unclean worker exits",
    "dead_letters.manage": "replay and purge dead letters",
    "schedules.manage": "run a schedule now, pause and resume schedules",
    "settings.change": "read and change the runtime settings",
    "users.manage": "create users, reset their passwords, give them roles, define roles",
    "tokens.manage_own": "create and revoke your own API tokens",
    "metrics.read": "read /metrics and the operations pages: queues, dead letters, workers, schedules, activity",
    "audit.read": "read and export the audit log",
}
ALL: frozenset[str] = frozenset(ACTIONS)

_USER = frozenset({"jobs.read_own", "jobs.submit", "jobs.cancel", "jobs.retry", "jobs.bulk", "tokens.manage_own"})
#: The built-in roles (revision 0017 stores them; they can be neither changed nor deleted):
#: ``viewer`` watches the whole workbench and changes nothing (it submits no jobs of its own, so it
#: reads everyone's); ``user`` works with their own jobs; ``operator`` runs the queues, dead letters,
#: schedules and everyone's jobs but changes neither settings nor users; ``admin`` has every action.
BUILTIN_ROLES: dict[str, tuple[str, frozenset[str]]] = {
    "viewer": (
        "reads every job and the operations pages; changes nothing",
        frozenset({"jobs.read_own", "jobs.read_all", "metrics.read", "tokens.manage_own"}),
    ),
    "user": ("submits and manages their own jobs", _USER),
    "operator": (
        "runs queues, dead letters, schedules and everyone's jobs; no settings, no users",
        _USER | {"jobs.read_all", "queues.pause", "dead_letters.manage", "schedules.manage", "metrics.read"},
    ),
    "admin": ("every action", ALL),
}


def unknown(actions: Iterable[str]) -> list[str]:
    """The names in *actions* that are no action, sorted."""
    return sorted(set(actions) - ALL)


def ordered(actions: Iterable[str]) -> list[str]:
    """*actions* in the catalogue's order (how lists show them)."""
    wanted = set(actions)
    return [name for name in ACTIONS if name in wanted]
