"""The JSON API under ``/api/v1`` (flask-smorest; OpenAPI 3.1 at ``/api/openapi.json``).

The document is generated from the schemas and views; nothing is written by hand. The WebSocket
and SSE routes of the live feed are described in docs/api.md instead (OpenAPI cannot express them).
Each operation carries the action it needs as ``x-permission`` (and says so in its description),
read from the view's :func:`webapp.permissions.permission` — the same attribute the check uses.
"""

from __future__ import annotations

import json
import re
from typing import Any

from flask import Flask, current_app
from flask_smorest import Api

from ..auth import csrf
from ..permissions import AUTHENTICATED, PUBLIC, permission
from .schemas import ErrorSchema


class TenureApi(Api):
    """flask-smorest's Api with Tenure's error envelope; :mod:`webapp.errors` handles every error."""

    ERROR_SCHEMA = ErrorSchema

    def _register_error_handlers(self) -> None:
        # Our handlers (registered later by webapp.errors) keep the 405 Allow header and the envelope.
        pass

    def _openapi_json(self):  # type: ignore[no-untyped-def]
        """The document, with the submit body spelled out per registered kind (payload fields included)."""
        from ..services import services

        doc = self.spec.to_dict()
        submit = doc.get("components", {}).get("schemas", {}).get("Submit")
        kinds = services().jobs.kinds()
        if submit is not None and kinds:
            doc["components"]["schemas"]["Submit"] = submit_schema_per_kind(submit, kinds)
        put_settings = doc.get("components", {}).get("schemas", {}).get("RuntimeSettingsPut")
        if put_settings is not None:
            # The keys and value types a save accepts, spelled out (apispec cannot express patternProperties).
            from settings.runtime import values_json_schema

            put_settings["properties"]["values"] = values_json_schema()
        document_permissions(doc, current_app)
        return current_app.response_class(json.dumps(doc, indent=2), mimetype="application/json")


def view_permission(app: Flask, endpoint: str, method: str) -> str | None:
    """The action the view behind *endpoint* needs for *method* (None: it names none)."""
    view = app.view_functions.get(endpoint)
    view_class = getattr(view, "view_class", None)
    if view_class is not None:
        view = getattr(view_class, method.lower(), None)
    return getattr(view, "permission", None)


def _sentence(action: str) -> str:
    if action == PUBLIC:
        return "Needs no credentials."
    if action == AUTHENTICATED:
        return "Needs any authenticated caller."
    return f"Needs the `{action}` permission."


def document_permissions(doc: dict[str, Any], app: Flask) -> None:
    """Add ``x-permission`` and a sentence naming it to every operation of *doc* (from the views)."""
    paths = doc.get("paths", {})
    for rule in app.url_map.iter_rules():
        path = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule)
        operations = paths.get(path)
        if operations is None:
            continue
        for method in rule.methods or ():
            operation = operations.get(method.lower())
            action = view_permission(app, rule.endpoint, method)
            if operation is None or action is None:
                continue
            operation["x-permission"] = action
            text = operation.get("description", "")
            operation["description"] = (text + "\n\n" if text else "") + _sentence(action)


def submit_schema_per_kind(base: dict[str, Any], kinds: list[Any]) -> dict[str, Any]:
    """``oneOf`` one object per kind: ``kind`` is its name, ``payload`` the kind's own JSON Schema (the
    one :func:`jobs.submit` validates with)."""
    variants = []
    for kind in kinds:
        payload = kind.payload_schema
        variant = {
            "type": "object",
            "title": kind.name,
            "description": kind.title,
            "properties": {**base.get("properties", {}), "kind": {"const": kind.name}, "payload": payload},
            "required": ["kind", "payload"] if payload.get("required") else ["kind"],
            "additionalProperties": False,
        }
        variants.append(variant)
    return {"oneOf": variants, "description": "A job to submit; the payload's fields depend on the kind."}


def register_api(app: Flask) -> TenureApi:
    """Create this app's Api (one per app: it holds the spec) and register the API blueprints."""
    from . import accounts, audit, health, jobs, ops, settings

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
    for blp in (jobs.blp, ops.blp, settings.blp, accounts.blp, audit.blp, health.blp):
        api.register_blueprint(blp)
        csrf.exempt(blp)  # API callers authenticate per request; session callers are checked in api_guard
    # The document itself: for any caller (it describes what each operation needs).
    spec_view = "api-docs.openapi_json"
    app.view_functions[spec_view] = permission(AUTHENTICATED)(app.view_functions[spec_view])
    return api
