"""The JSON API under ``/api/v1`` (flask-smorest; OpenAPI 3.1 at ``/api/openapi.json``).

The document is generated from the schemas and views; nothing is written by hand. The WebSocket
and SSE routes of the live feed are described in docs/api.md instead (OpenAPI cannot express them).
"""

from __future__ import annotations

from flask import Flask, request
from flask_smorest import Api

from ..auth import csrf, require_identity
from .schemas import ErrorSchema


class TenureApi(Api):
    """flask-smorest's Api with Tenure's error envelope; :mod:`webapp.errors` handles every error."""

    ERROR_SCHEMA = ErrorSchema

    def _register_error_handlers(self) -> None:
        # Our handlers (registered later by webapp.errors) keep the 405 Allow header and the envelope.
        pass


def register_api(app: Flask) -> TenureApi:
    """Create this app's Api (one per app: it holds the spec) and register the API blueprints."""
    from . import health, jobs, ops

    api = TenureApi(
        app,
        spec_kwargs={
            "info": {"description": "Tenure's JSON API. Authenticate with `Authorization: Bearer <token>` or Basic."},
            "components": {
                "securitySchemes": {
                    "bearer": {"type": "http", "scheme": "bearer"},
                    "basic": {"type": "http", "scheme": "basic"},
                }
            },
            "security": [{"bearer": []}, {"basic": []}],
        },
    )
    for blp in (jobs.blp, ops.blp, health.blp):
        api.register_blueprint(blp)
        csrf.exempt(blp)  # API callers authenticate per request; session callers are checked in api_guard

    @app.before_request
    def _spec_needs_auth() -> None:
        if request.endpoint == "api-docs.openapi_json":
            require_identity()

    return api
