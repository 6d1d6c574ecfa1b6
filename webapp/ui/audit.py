"""The audit log page (``audit.read``): filters by actor, action, outcome and time range; older pages by cursor.
The export link is the API's (``/api/v1/audit/export``) with the same filters."""

from __future__ import annotations

from typing import Any

from flask import render_template, request, url_for

from accounts import audit

from ..permissions import permission
from ..services import services
from .blueprint import bp
from .forms import datetime_field

PAGE_SIZE = 50


@bp.route("/audit")
@permission("audit.read")
def audit_log():
    args = request.args
    shown: dict[str, Any] = {
        "actor": (args.get("actor") or "").strip()[:64],
        "action": args.get("action") if args.get("action") in audit.ACTIONS else "",
        "outcome": args.get("outcome") if args.get("outcome") in audit.OUTCOMES else "",
        "since": args.get("since", "") if datetime_field(args.get("since")) else "",
        "until": args.get("until", "") if datetime_field(args.get("until")) else "",
    }
    where = audit.AuditFilter(
        actor=shown["actor"] or None,
        action=shown["action"] or None,
        outcome=shown["outcome"] or None,
        since=datetime_field(shown["since"]),
        until=datetime_field(shown["until"]),
    )
    cursor = args.get("cursor") or None
    try:
        page = audit.page(services().engine, where, cursor=cursor, limit=PAGE_SIZE)
    except ValueError:
        page = audit.page(services().engine, where, limit=PAGE_SIZE)
    filters = {k: v for k, v in shown.items() if v}
    export = {k: (datetime_field(v).isoformat() if k in ("since", "until") else v) for k, v in filters.items()}  # type: ignore[union-attr]
    return render_template(
        "audit.html",
        page=page,
        filters=shown,
        actions=audit.ACTIONS,
        outcomes=audit.OUTCOMES,
        next_url=url_for("ui.audit_log", **filters, cursor=page.next_cursor) if page.next_cursor else None,
        export_url=url_for("audit_api.AuditExport", **export),
    )
