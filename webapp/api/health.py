"""Health: ``/api/health/live`` (no auth: the process answers) and ``/api/health/ready``."""

from __future__ import annotations

from flask import jsonify

from ..permissions import AUTHENTICATED, PUBLIC, can, permission
from ..services import services
from .blueprint import Blueprint
from .schemas import HealthSchema

blp = Blueprint("health", __name__, url_prefix="/api/health", description="Liveness and readiness")


@blp.route("/live")
@permission(PUBLIC)
@blp.response(200, HealthSchema)
@blp.doc(security=[])
def live():
    """The process is up (no auth, no dependencies)."""
    return {"status": "ok", "components": {}}


@blp.route("/ready")
@permission(AUTHENTICATED)
@blp.response(200, HealthSchema)
@blp.alt_response(503, schema=HealthSchema, description="a component is failing")
def ready():
    """Database at the head revision, broker reachable, output directory writable, no output root
    degraded (the workers' write gate; 503 otherwise).

    Every caller sees each component's status (so the failing one is named); callers with metrics.read
    also see details.
    """
    report = services().readiness()
    response = jsonify(report.to_dict(details=can("metrics.read")))
    response.status_code = report.http_status
    return response
