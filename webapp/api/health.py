"""Health: ``/api/health/live`` (no auth: the process answers) and ``/api/health/ready``."""

from __future__ import annotations

from flask import jsonify
from flask_smorest import Blueprint

from ..auth import require_identity
from ..services import services
from .schemas import HealthSchema

blp = Blueprint("health", __name__, url_prefix="/api/health", description="Liveness and readiness")


@blp.route("/live")
@blp.response(200, HealthSchema)
@blp.doc(security=[])
def live():
    """The process is up (no auth, no dependencies)."""
    return {"status": "ok"}


@blp.route("/ready")
@blp.response(200, HealthSchema)
@blp.alt_response(503, schema=HealthSchema, description="a component is failing")
def ready():
    """Database at the head revision, broker reachable, output directory writable (503 otherwise)."""
    require_identity()
    components = services().readiness()
    ok = all(c["ok"] for c in components.values())
    response = jsonify({"status": "ready" if ok else "unavailable", "components": components})
    response.status_code = 200 if ok else 503
    return response
