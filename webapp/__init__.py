"""Tenure's web app: UI, JSON API, live feed and health (docs/architecture.md).

``create_app(test_config=None)`` is the factory (flaskr style); gunicorn runs
``webapp:create_app()``. Services are built once and kept in ``app.extensions["tenure"]``.

Configuration comes from ``settings.environment.Settings`` (``TENURE_*``) plus the web's own keys
(defaults below; any ``TENURE_WEB_<KEY>`` variable overrides ``<KEY>``; *test_config* last).
``TASKS_APP`` names the composition root that declares the job kinds (``module:callable``, called with
the settings, or a ``module`` that composes itself when imported; ``""``: none). A test may inject
``TENURE_ENGINE``, ``TENURE_BROKER`` and ``TENURE_REGISTRY`` (its own job kinds) instead.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from flask import Flask

#: The web layer's settings and their defaults (overridable by ``TENURE_WEB_<KEY>`` and test_config).
DEFAULTS: dict[str, Any] = {
    "API_TITLE": "Tenure",
    "API_VERSION": "v1",
    "OPENAPI_VERSION": "3.1.0",
    "OPENAPI_URL_PREFIX": "/api",
    "OPENAPI_JSON_PATH": "openapi.json",
    "SESSION_COOKIE_HTTPONLY": True,
    "SESSION_COOKIE_SAMESITE": "Lax",
    "REMEMBER_COOKIE_HTTPONLY": True,
    "WTF_CSRF_TIME_LIMIT": None,  # the token lives as long as the session
    # Every valid submit fits: notify_email's text and html hold up to 100,000 characters each, and a client that
    # escapes JSON to ASCII (Python's json.dumps does) sends a character outside the BMP as 12 bytes, 2.4 MB.
    "MAX_CONTENT_LENGTH": 4 * 1024 * 1024,
    "JSON_SORT_KEYS": False,
    #: Live feed (see docs/api.md).
    "LIVE_MAX_CONNECTIONS": 64,
    "LIVE_MAX_PER_IDENTITY": 4,
    "LIVE_HEARTBEAT_S": 10.0,
    "LIVE_POLL_S": 0.5,
    "LIVE_MAX_BACKLOG": 1000,
    "LIVE_RETRY_AFTER_S": 5,
    #: How often an open stream checks that its credentials and permissions still hold.
    "LIVE_REAUTH_S": 1.0,
    #: A connection's slot in the per-identity limit expires this long after its last renewal (a killed
    #: web process's connections stop counting then); the stream renews it every third of this.
    "LIVE_SLOT_TTL_S": 30.0,
    #: A send that cannot proceed for this long ends the connection (a client that stopped reading).
    "LIVE_SEND_TIMEOUT_S": 10.0,
    #: The kernel's send buffer of a live connection: what a client that stopped reading is owed at most
    #: before a send blocks.
    "LIVE_SEND_BUFFER_BYTES": 65536,
    #: How long a WebSocket client has to send its first message (the cursor) before it is closed.
    "LIVE_SUBSCRIBE_TIMEOUT_S": 10.0,
    "SOCK_SERVER_OPTIONS": {"ping_interval": 25, "max_message_size": 65536},
    #: Origins (scheme://host[:port]) allowed to open the live feed with a session cookie, besides this host.
    "ALLOWED_ORIGINS": (),
    #: How often the UI polls when the live feed is unavailable.
    "UI_POLL_S": 30,
    #: Serve /metrics without credentials (for a scraper on a private network).
    "METRICS_PUBLIC": False,
    #: scrypt cost (N) of the passwords this process hashes and of a failed login with an unknown name
    #: (see accounts.set_scrypt_cost: a power of two, 1024 … 1048576).
    "PASSWORD_SCRYPT_N": 2**15,
    #: The composition root that declares the job kinds and their broker (called at start so submit knows them).
    "TASKS_APP": "tasks:compose",
}


def create_app(test_config: dict[str, Any] | None = None) -> Flask:
    """Build the Flask app: config, services, extensions, blueprints, error handlers."""
    app = Flask(__name__, instance_relative_config=False)
    app.config.from_mapping(DEFAULTS)
    # JSON answers and the pages' ``tojson`` keep non-ASCII text as text ("录制", not "\u5f55\u5236");
    # the bodies are UTF-8, and tojson still escapes what HTML would read (<, >, &, ').
    app.json.ensure_ascii = False  # type: ignore[attr-defined]
    app.config.from_prefixed_env("TENURE_WEB")
    if test_config:
        app.config.from_mapping(test_config)

    import accounts

    from . import errors
    from .auth import bp as auth_bp
    from .auth import csrf, login_manager

    try:
        accounts.set_scrypt_cost(int(app.config["PASSWORD_SCRYPT_N"]))
    except ValueError as exc:
        raise RuntimeError(f"TENURE_WEB_PASSWORD_SCRYPT_N: {exc}") from None
    services = _build_services(app)
    app.extensions["tenure"] = services
    if not app.config.get("SECRET_KEY"):
        from .services import secret_key_from

        app.config["SECRET_KEY"] = secret_key_from(os.environ, Path(app.config.get("TENURE_VAR_DIR", "var")))

    from .request_bodies import read_chunked_body
    from .uploads import allow_upload_bodies

    app.before_request(allow_upload_bodies)  # before CSRF reads the form: it sets this request's size limit
    app.before_request(read_chunked_body)  # then a body without Content-Length is held to that limit
    login_manager.init_app(app)
    csrf.init_app(app)

    from .api import register_api
    from .live import bp as live_bp
    from .live import end_streams, sock
    from .metrics import bp as metrics_bp
    from .ui import bp as ui_bp

    sock.init_app(app)
    # For the server's shutdown hook (gunicorn.conf.py), which reaches the app, not this package.
    app.extensions["tenure.end_live_streams"] = end_streams
    register_api(app)
    csrf.exempt(live_bp)  # live GETs only; Origin is checked instead
    app.register_blueprint(live_bp)
    app.register_blueprint(auth_bp)
    app.register_blueprint(ui_bp)
    app.register_blueprint(metrics_bp)
    errors.register(app)
    app.after_request(_security_headers)
    _quiet_credentials_in_logs()
    return app


#: Everything the UI loads is served by this app (vendored htmx, one stylesheet, one script).
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'self'; form-action 'self'"
)


def _security_headers(response):  # type: ignore[no-untyped-def]
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    if response.mimetype == "text/html":
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        response.headers.setdefault("X-Frame-Options", "DENY")
    return response


def _build_services(app: Flask):  # type: ignore[no-untyped-def]
    import importlib

    from .live_limits import FeedLimits
    from .services import Services

    cfg = app.config
    settings = cfg.get("TENURE_SETTINGS")
    if settings is None:
        from settings.environment import Settings

        settings = Settings.from_env()
    from .tracing import trace_requests

    trace_requests(app, settings)
    engine = cfg.get("TENURE_ENGINE")
    if engine is None:
        from jobs import check_database_at_head, make_engine

        engine = make_engine(settings.database_url, busy_timeout_ms=settings.sqlite_busy_timeout_ms)
        check_database_at_head(engine)  # refuse an unknown or newer schema at start, like every process
        from settings.runtime import overlay_settings

        settings = overlay_settings(engine, settings)  # saved restart keys (jobs.default_max_attempts)
    broker = cfg.get("TENURE_BROKER")
    if cfg.get("TASKS_APP"):
        # The job kinds (and their actors, on the broker the composition sets) must be known to submit.
        module_name, _, attr = cfg["TASKS_APP"].partition(":")
        module = importlib.import_module(module_name)  # Dramatiq's forms: `module`, or `module:callable`
        if attr:
            getattr(module, attr)(settings)
        if broker is None:
            import dramatiq

            broker = dramatiq.get_broker()
    if broker is None:
        from broker import make_broker

        broker = make_broker(settings.broker_url, rabbitmq_management_url=settings.rabbitmq_management_url)
    from .jobs_adapter import JobLayerGateway

    gateway = JobLayerGateway(engine=engine, broker=broker, settings=settings, registry=cfg.get("TENURE_REGISTRY"))
    return Services(
        engine=engine,
        broker=broker,
        settings=settings,
        jobs=gateway,
        feed_limits=FeedLimits(
            engine, int(cfg["LIVE_MAX_CONNECTIONS"]), int(cfg["LIVE_MAX_PER_IDENTITY"]), float(cfg["LIVE_SLOT_TTL_S"])
        ),
        output_root=Path(getattr(settings, "output_root", "var/outputs")),
    )


class _NoCredentials(logging.Filter):
    """Drops access-log lines that would carry credentials (none should: they never go in URLs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "Authorization" not in message and "tnr_" not in message


def _quiet_credentials_in_logs() -> None:
    for name in ("werkzeug", "gunicorn.access"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoCredentials) for f in logger.filters):
            logger.addFilter(_NoCredentials())
