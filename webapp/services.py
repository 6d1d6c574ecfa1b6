"""The services a web process holds: built once by :func:`webapp.create_app`, kept in
``app.extensions["tenure"]`` and reached from views through :func:`services`."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flask import current_app
from sqlalchemy import Engine, text

from .gateway import JobsGateway
from .live_limits import FeedLimits


@dataclass
class Services:
    """Everything a request may need; views reach it via :func:`services`."""

    engine: Engine
    broker: Any
    settings: Any
    jobs: JobsGateway
    feed_limits: FeedLimits
    output_root: Path
    migrations_dir: Path | None = None
    #: token sha256 → last time its ``last_used_at`` was written (throttles those writes).
    token_touches: dict[str, float] = field(default_factory=dict)

    def should_touch_token(self, key: str, *, every_s: float = 60.0) -> bool:
        now = time.monotonic()
        if now - self.token_touches.get(key, -every_s) < every_s:
            return False
        if len(self.token_touches) > 10_000:
            self.token_touches.clear()  # bounded memory; worst case a few extra writes
        self.token_touches[key] = now
        return True

    # -- readiness ------------------------------------------------------------------------------
    def readiness(self) -> dict[str, dict[str, Any]]:
        """Each component's state: ``{"ok": bool, "detail": str}`` (never a URL or a secret)."""
        try:
            from monitoring import health as monitoring_health  # optional: the monitoring layer's checks
        except ImportError:
            monitoring_health = None
        checks = getattr(monitoring_health, "readiness_checks", None)
        if checks is not None:
            try:
                return {name: {"ok": bool(ok), "detail": str(detail)} for name, (ok, detail) in checks(self).items()}
            except Exception:  # fall back to ours rather than failing the probe on a bug elsewhere
                pass
        return {"database": self._check_database(), "broker": self._check_broker(), "output": self._check_output()}

    def _check_database(self) -> dict[str, Any]:
        try:
            with self.engine.connect() as conn:
                current = {row[0] for row in conn.execute(text("SELECT version_num FROM alembic_version"))}
        except Exception as exc:
            return {"ok": False, "detail": f"cannot read the schema revision ({type(exc).__name__})"}
        heads = self._alembic_heads()
        if heads is None:
            return {"ok": bool(current), "detail": f"revision {', '.join(sorted(current)) or 'none'}"}
        if current != heads:
            return {"ok": False, "detail": f"at {sorted(current)}, head is {sorted(heads)}"}
        return {"ok": True, "detail": f"at head {', '.join(sorted(heads))}"}

    def _alembic_heads(self) -> set[str] | None:
        if self.migrations_dir is None or not (self.migrations_dir / "env.py").exists():
            return None
        from alembic.config import Config
        from alembic.script import ScriptDirectory

        config = Config()
        config.set_main_option("script_location", str(self.migrations_dir))
        return set(ScriptDirectory.from_config(config).get_heads())

    def _check_broker(self) -> dict[str, Any]:
        try:
            if hasattr(self.broker, "stats"):
                self.broker.stats()
            else:
                self.broker.get_declared_queues()
        except Exception as exc:
            return {"ok": False, "detail": f"unreachable ({type(exc).__name__})"}
        return {"ok": True, "detail": type(self.broker).__name__}

    def _check_output(self) -> dict[str, Any]:
        try:
            self.output_root.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.output_root, prefix=".ready-"):
                pass
        except OSError as exc:
            return {"ok": False, "detail": f"not writable ({exc.strerror or type(exc).__name__})"}
        return {"ok": True, "detail": "writable"}


def services() -> Services:
    """This app's :class:`Services`."""
    return current_app.extensions["tenure"]


def default_migrations_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "migrations"


def secret_key_from(env: dict[str, str] | os._Environ, var_dir: Path) -> str:
    """``TENURE_SECRET_KEY``, or a random key persisted in ``var/secret_key`` (mode 0600).

    Persisted, not per process: gunicorn's workers must all accept the same session cookies.
    """
    key = env.get("TENURE_SECRET_KEY")
    if key:
        return key
    path = var_dir / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    import secrets

    var_dir.mkdir(parents=True, exist_ok=True)
    candidate = secrets.token_hex(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()  # another worker won the race
    with os.fdopen(fd, "w") as handle:
        handle.write(candidate)
    return candidate
