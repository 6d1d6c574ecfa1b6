"""The UI: server-rendered pages (Jinja + htmx), session login, CSRF on every form.

One blueprint (:mod:`webapp.ui.blueprint`), its pages in a module per area: jobs, operations, runtime
settings, accounts (tokens, users and roles), the audit log. Each page and action names the permission
it needs; the templates show only what the caller may use (``can(action)``).

Live updates: ``static/live.js`` listens to ``/api/v1/live`` and re-fetches the partial of each job a
notice names (``data-live-src``); without the feed it polls every ``UI_POLL_S`` seconds. A submit form
is checked in the browser before it is sent (``static/submit.js``, the rules rendered by :mod:`.forms`
from the kind's schema); the server checks it again.
"""

from . import accounts, audit, jobs, ops, settings
from .blueprint import bp

__all__ = ["accounts", "audit", "bp", "jobs", "ops", "settings"]
