"""The UI blueprint itself: every page needs a session; the globals and filters its templates share."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, current_app, g
from flask_login import login_required

from ..gateway import STATUSES
from ..owners import event_data, owner_name, waiting
from ..permissions import can

bp = Blueprint("ui", __name__, template_folder="../templates")

PAGE_SIZE = 50


@bp.before_request
@login_required
def _logged_in() -> None:
    """Every UI page needs a session (login/logout live in the auth blueprint)."""
    from flask_login import current_user

    g.identity = current_user


@bp.app_context_processor
def _globals() -> dict[str, Any]:
    return {
        "STATUSES": STATUSES,
        "now": datetime.now(UTC),
        "ui_poll_s": current_app.config["UI_POLL_S"],
        "owner_name": owner_name,
        "event_data": event_data,
        "waiting": waiting,
        "can": can,
    }


@bp.app_template_filter("ago")
def _ago(value: datetime | None) -> str:
    if value is None:
        return "—"
    seconds = (datetime.now(UTC) - value).total_seconds()
    if seconds < 0:
        return "in " + _ago_span(-seconds)
    return _ago_span(seconds) + " ago"


def _ago_span(seconds: float) -> str:
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"


@bp.app_template_filter("span")
def _span(seconds: float | None) -> str:
    """A duration in its largest whole unit (``1 h``, ``10 min``), else in seconds (``2.5 s``)."""
    if seconds is None:
        return "—"
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    return f"{seconds:g} s"


@bp.app_template_filter("tail")
def _tail(text: str, chars: int = 60) -> str:
    """*text*, its beginning elided when too long: a summary's end tells jobs apart (a folder's name)."""
    return text if len(text) <= chars else "…" + text[-(chars - 1) :]


@bp.app_template_filter("clock")
def _clock(seconds: float) -> str:
    """A position in a recording: ``m:ss.s`` (``h:mm:ss.s`` from an hour on)."""
    minutes, secs = divmod(max(0.0, seconds), 60)
    hours, minutes = divmod(int(minutes), 60)
    return f"{hours}:{minutes:02d}:{secs:04.1f}" if hours else f"{minutes}:{secs:04.1f}"


@bp.app_template_filter("ts")
def _ts(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "—"
