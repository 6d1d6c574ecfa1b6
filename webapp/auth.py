"""Who is calling: session cookies (UI), bearer tokens and HTTP Basic (API).

- The UI logs people in with Flask-Login; every form and htmx request carries a CSRF token
  (Flask-WTF's ``CSRFProtect``; htmx sends it in ``X-CSRFToken``).
- The API accepts ``Authorization: Bearer tnr_…`` or ``Authorization: Basic …``, and also the
  session cookie — but then unsafe methods need the CSRF header too, since browsers send cookies on
  cross-site requests.
- Credentials are only ever read from headers and the form body; never from the URL, never logged,
  never echoed. Failures say "invalid credentials" and nothing more.
- An :class:`Identity` carries what its caller may do (``permissions``): a session or Basic caller
  their role's actions, a token those of its actions its user's role grants now. Both are read from
  the database on every request. What a view needs is checked by :mod:`webapp.permissions`.
- Logins (the form) and credentials that do not authenticate (the API) are recorded in the audit
  log: the name that was tried, never the password or token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

from flask import Blueprint, flash, g, redirect, render_template, request, session, url_for
from flask_login import LoginManager, UserMixin, current_user, login_user, logout_user
from flask_wtf import FlaskForm
from flask_wtf.csrf import CSRFError, CSRFProtect
from wtforms import PasswordField, StringField
from wtforms.validators import DataRequired, Length

import accounts
from accounts import sessions

from .audit_log import record_event
from .errors import Forbidden, Unauthorized
from .services import services

logger = logging.getLogger(__name__)
login_manager = LoginManager()
login_manager.login_view = "auth.login"
login_manager.login_message = "Please log in."
login_manager.session_protection = "strong"
csrf = CSRFProtect()

bp = Blueprint("auth", __name__)


#: Reading all owners' jobs (otherwise a caller sees their own).
READ_ALL = "jobs.read_all"


@dataclass(frozen=True, eq=False)
class Identity(UserMixin):
    """An authenticated caller, how they proved it (``session`` | ``token`` | ``basic``) and what they may do."""

    user: accounts.User
    via: str = "session"
    #: The token a ``token`` caller used (its metadata; never the secret).
    token: accounts.ApiToken | None = None
    #: The actions this caller may do now (a token: its actions that its user's role still grants).
    permissions: frozenset[str] = frozenset()

    @classmethod
    def of(cls, user: accounts.User, via: str) -> Identity:
        """A person who proved who they are (session or Basic): their role's actions."""
        return cls(user, via, None, user.permissions)

    def get_id(self) -> str:
        return str(self.user.id)

    @property
    def scope(self) -> str | None:
        """The owner whose jobs this caller sees; ``None`` means all (``jobs.read_all``)."""
        return None if READ_ALL in self.permissions else self.user.owner_id

    @property
    def key(self) -> str:
        """A stable identity key (for per-identity limits)."""
        return f"user:{self.user.id}"


#: The session cookie's key for the login session's secret (accounts.sessions): without a live session
#: on the server the cookie authenticates nobody, so a logout or a password change ends it everywhere.
SESSION_SECRET = "tenure_session"


@login_manager.user_loader
def _load_user(user_id: str) -> Identity | None:
    user = sessions.session_user(services().engine, session.get(SESSION_SECRET))
    return Identity.of(user, "session") if user is not None and str(user.id) == user_id else None


def _refused_credentials(via: str, username: str | None = None) -> None:
    """Record credentials that did not authenticate (once per request)."""
    if g.get("credentials_refused"):
        return
    g.credentials_refused = True
    try:
        record_event(
            "auth.failed",
            outcome="refused",
            reason="invalid credentials",
            target_type="user" if username else None,
            target=username,
            details={"via": via},
        )
    except Exception:  # the caller is refused (401) whatever the log does
        logger.exception("Could not record refused credentials.")


def _from_authorization_header() -> Identity | None | bool:
    """The identity from ``Authorization``; ``False`` when the header is absent."""
    header = request.headers.get("Authorization")
    if not header:
        return False
    scheme, _, credentials = header.partition(" ")
    credentials = credentials.strip()
    engine = services().engine
    if scheme.lower() == "bearer" and credentials:
        touch = services().should_touch_token(hashlib.sha256(credentials.encode()).hexdigest())
        found = accounts.token_identity(engine, credentials, touch=touch)
        if found is None:
            _refused_credentials("token")
            return None
        return Identity(found.user, "token", found.token, found.permissions)
    if scheme.lower() == "basic" and credentials:
        try:
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            _refused_credentials("basic")
            return None
        username, sep, password = decoded.partition(":")
        if not sep:
            _refused_credentials("basic")
            return None
        user = accounts.authenticate(engine, username, password)
        if user is None:
            _refused_credentials("basic", username[:64])
            return None
        return Identity.of(user, "basic")
    _refused_credentials(scheme.lower()[:16] or "none")
    return None


def resolve_identity() -> Identity | None:
    """The caller of this request (cached in ``g``), or ``None``.

    Raises: :class:`Unauthorized` when an ``Authorization`` header is present but wrong (a bad
    header never falls back to the cookie).
    """
    if "identity" in g:
        return g.identity
    found = _from_authorization_header()
    if found is None:
        raise Unauthorized("Invalid credentials.")
    if found is False:
        found = current_user if current_user.is_authenticated else None
    g.identity = found
    return found


def require_identity() -> Identity:
    identity = resolve_identity()
    if identity is None:
        raise Unauthorized()
    return identity


def api_guard() -> None:
    """``before_request`` of API blueprints: authenticate; session callers need CSRF on unsafe methods."""
    identity = require_identity()
    if identity.via == "session" and request.method not in ("GET", "HEAD", "OPTIONS"):
        try:
            csrf.protect()
        except CSRFError as exc:
            raise Forbidden("Missing or invalid CSRF token (send X-CSRFToken).") from exc


def origin_allowed() -> bool:
    """Whether the request's ``Origin`` (if any) is this host or a configured allowed origin."""
    from flask import current_app

    origin = request.headers.get("Origin")
    if origin is None:
        return True  # not a browser cross-site request (browsers always send Origin on WebSocket/CORS)
    allowed = {o.rstrip("/") for o in current_app.config.get("ALLOWED_ORIGINS", ())}
    if origin.rstrip("/") in allowed:
        return True
    parts = urlsplit(origin)
    return parts.netloc == request.host and parts.scheme in ("http", "https")


class LoginForm(FlaskForm):
    username = StringField("User name", validators=[DataRequired(), Length(max=64)])
    password = PasswordField("Password", validators=[DataRequired(), Length(max=1024)])


def _safe_next(target: str | None) -> str:
    # Only local paths: an absolute URL here would be an open redirect.
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return url_for("ui.jobs")


@bp.route("/login", methods=["GET", "POST"])
def login():
    form = LoginForm()
    if form.validate_on_submit():
        user = accounts.authenticate(services().engine, form.username.data, form.password.data)
        if user is None:
            record_event(
                "login",
                outcome="refused",
                reason="invalid user name or password",
                target_type="user",
                target=form.username.data[:64],
            )
            flash("Invalid user name or password.", "error")
            return render_template("login.html", form=form)
        identity = Identity.of(user, "session")
        g.identity = identity
        # Recorded before the session exists: a login the log cannot record does not happen.
        record_event("login", target_type="user", target=user.username)
        secret = sessions.start_session(services().engine, user.id)
        session.clear()  # a fresh session on login: no fixation
        login_user(identity)
        session[SESSION_SECRET] = secret
        return redirect(_safe_next(request.args.get("next")))
    return render_template("login.html", form=form)


@bp.route("/logout", methods=["POST"])
def logout():
    sessions.end_session(services().engine, session.get(SESSION_SECRET))
    logout_user()
    session.clear()
    flash("You are logged out.", "info")
    return redirect(url_for("auth.login"))
