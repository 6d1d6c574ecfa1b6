"""The UI's account pages: your API tokens (``tokens.manage_own``), users and roles (``users.manage``).

Every change goes through :mod:`webapp.people` (one transaction with its audit record); a refused
change shows its reason as a flash message on the page it came from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import flash, g, make_response, redirect, render_template, request, session, url_for

import accounts
from accounts import permissions as catalogue

from .. import people
from ..errors import ApiError
from ..permissions import permission
from ..services import services
from .blueprint import bp
from .forms import EmptyForm, TokenForm

#: Session key holding a just-created token's secret until the page after the redirect shows it.
NEW_TOKEN_KEY = "new_token"
MANAGE = "users.manage"


def _chosen_actions(form: Any) -> list[str] | None:
    """The actions ticked on a form that offers them (``scoped`` marks it), else None (the default)."""
    if not form.get("scoped"):
        return None
    return [a for a in form.getlist("permission") if a in catalogue.ACTIONS]


@bp.route("/tokens", methods=["GET", "POST"])
@permission("tokens.manage_own", audit_as="token.create")
def tokens():
    form = TokenForm()
    if form.validate_on_submit():
        try:
            _, secret = people.create_token(g.identity, form.name.data, _chosen_actions(request.form))
        except ApiError as exc:
            flash(exc.message, "error")
            return redirect(url_for("ui.tokens"), code=303)
        # Post/Redirect/Get: reloading the page that shows the secret must not post the form again (a
        # second token). The secret rides the session to the next GET only, which pops it.
        session[NEW_TOKEN_KEY] = secret
        return redirect(url_for("ui.tokens"), code=303)
    response = make_response(
        render_template(
            "tokens.html",
            tokens=accounts.list_tokens(services().engine, g.identity.user.id),
            form=form,
            revoke_form=EmptyForm(),
            new_secret=session.pop(NEW_TOKEN_KEY, None) if request.method == "GET" else None,
            offered=catalogue.ordered(g.identity.permissions),
            actions=catalogue.ACTIONS,
        )
    )
    response.headers["Cache-Control"] = "no-store"  # the back button must not show a secret again
    return response


@bp.route("/tokens/<int:token_id>/revoke", methods=["POST"])
@permission("tokens.manage_own", audit_as="token.revoke")
def revoke_token(token_id: int):
    try:
        people.revoke_token(g.identity, min(token_id, 2**62))  # no id is larger; SQLite's integers end there
        flash("Token revoked.", "info")
    except ApiError:
        flash("No such active token.", "error")
    return redirect(url_for("ui.tokens"))


@bp.route("/users")
@permission(MANAGE)
def users():
    engine = services().engine
    return render_template(
        "users.html",
        users=accounts.list_users(engine),
        roles=accounts.list_roles(engine),
        actions=catalogue.ACTIONS,
        ordered=catalogue.ordered,
        form=EmptyForm(),
        min_password=accounts.MIN_PASSWORD_LENGTH,
    )


def _apply(change: Callable[[], object], done: str) -> Any:
    """Make one change of the Users page, flash *done* or why it was refused, and go back to the page."""
    try:
        change()
    except ApiError as exc:
        flash(exc.message, "error")
    else:
        flash(done, "info")
    return redirect(url_for("ui.users"))


@bp.route("/users/new", methods=["POST"])
@permission(MANAGE, audit_as="user.create")
def user_create():
    name = (request.form.get("name") or "").strip()
    return _apply(
        lambda: people.create_user(name, request.form.get("role") or "user", request.form.get("password") or ""),
        f"User {name} created.",
    )


@bp.route("/users/<name>/role", methods=["POST"])
@permission(MANAGE, audit_as="user.role")
def user_role(name: str):
    role = request.form.get("role") or ""
    return _apply(lambda: people.set_role(name, role), f"{name} now has the role {role}.")


@bp.route("/users/<name>/disabled", methods=["POST"])
@permission(MANAGE, audit_as="user.disable")
def user_disabled(name: str):
    disabled = request.form.get("disabled") == "1"
    return _apply(lambda: people.set_disabled(name, disabled), f"{name} {'disabled' if disabled else 'enabled'}.")


@bp.route("/users/<name>/password", methods=["POST"])
@permission(MANAGE, audit_as="user.password")
def user_password(name: str):
    return _apply(lambda: people.set_password(name, request.form.get("password") or ""), f"Password of {name} set.")


@bp.route("/roles/new", methods=["POST"])
@permission(MANAGE, audit_as="role.create")
def role_create():
    name = (request.form.get("name") or "").strip()
    chosen = _chosen_actions(request.form) or []
    return _apply(
        lambda: people.create_role(name, request.form.get("description") or "", chosen), f"Role {name} created."
    )


@bp.route("/roles/<name>/save", methods=["POST"])
@permission(MANAGE, audit_as="role.update")
def role_update(name: str):
    return _apply(
        lambda: people.update_role(name, request.form.get("description") or "", _chosen_actions(request.form) or []),
        f"Role {name} saved.",
    )


@bp.route("/roles/<name>/delete", methods=["POST"])
@permission(MANAGE, audit_as="role.delete")
def role_delete(name: str):
    return _apply(lambda: people.delete_role(name), f"Role {name} deleted.")
