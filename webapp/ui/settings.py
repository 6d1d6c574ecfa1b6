"""Runtime settings page (``settings.change``): saved vs effective values, revision, pending restarts, a form.
A save runs in one transaction with its audit record."""

from __future__ import annotations

from typing import Any

from flask import flash, g, redirect, render_template, request, url_for

from settings import runtime as rs

from .. import runtime_settings
from ..audit_log import audited
from ..errors import ApiError, Invalid
from ..permissions import permission
from ..services import services
from .blueprint import bp
from .forms import EmptyForm


def _rows(view: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per concrete key: fixed keys, then each known queue and schedule."""
    svc = services()
    rows = []
    for spec in rs.CATALOGUE:
        if not spec.pattern:
            rows.append({"key": spec.key, "spec": spec})
            continue
        family = spec.key.split(".", 1)[0]
        names = runtime_settings.queue_names(svc) if family == "queues" else runtime_settings.schedule_names(svc)
        saved_names = {k.split(".", 1)[1].rsplit(".", 1)[0] for k in view["saved"] if k.startswith(family + ".")}
        for name in sorted(names | saved_names):
            rows.append({"key": spec.key.replace("<name>", name), "spec": spec})
    for row in rows:
        row["saved"] = view["saved"].get(row["key"])
        row["is_saved"] = row["key"] in view["saved"]
        row["effective"] = view["effective"].get(row["key"], row["spec"].default)
        row["pending"] = row["key"] in view["pending_restart"]
    return rows


@bp.app_template_filter("setting_words")
def setting_words(value: Any, unset: str = "default") -> str:
    """A setting's value in the UI's words: booleans as on/off, no value as *unset*."""
    if value is None:
        return unset
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _parse(spec: rs.SettingSpec, raw: str) -> Any:
    """A form string as the JSON value the service validates (the service reports what is wrong)."""
    raw = raw.strip()
    if spec.type == "bool":
        return {"true": True, "false": False}.get(raw, raw)
    if spec.type == "int":
        if raw.lower() == "null" and spec.nullable:
            return None
        try:
            return int(raw)
        except ValueError:
            return raw
    return raw


@bp.route("/ops/settings", methods=["GET", "POST"])
@permission("settings.change", audit_as="settings.save")
def ops_settings():
    svc = services()
    form = EmptyForm()
    if request.method == "POST" and form.validate_on_submit():
        values: dict[str, Any] = {}
        for key in request.form:
            if not key.startswith("v:"):
                continue
            name = key[2:]
            found = rs.spec_for(name)
            raw = request.form.get(key, "")
            if found is None:
                values[name] = raw  # reported as unknown by the service
            elif found[0].secret:
                if request.form.get(f"clear:{name}"):
                    values[name] = None
                elif raw:
                    values[name] = raw  # empty: keep the saved secret
            elif raw.strip() != "":
                values[name] = _parse(found[0], raw)
        try:
            expected = int(request.form.get("expected_revision", "-1"))
        except ValueError:
            expected = -1
        try:
            with audited("settings.save", target_type="settings") as act:
                view = runtime_settings.save(svc, values, expected, g.identity.user.owner_id, act=act)
        except Invalid as e:
            reasons = "; ".join(f"{k} {v}" for k, v in sorted((e.details or {}).items()))
            flash(f"Nothing was saved: {reasons or e.message}", "error")
        except ApiError as e:
            flash(e.message, "error")
        else:
            flash(f"Saved revision {view['revision']}.", "info")
            for warning in view.get("warnings", []):
                flash(warning, "error")
        return redirect(url_for("ui.ops_settings"))
    view = runtime_settings.current(svc)
    return render_template("ops_settings.html", view=view, rows=_rows(view), form=form)
