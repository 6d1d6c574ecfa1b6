"""``/api/v1/audit`` (``audit.read``): the audit log, newest first, with cursor paging; its export as JSON lines."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import marshmallow as ma
from flask import Response, stream_with_context
from flask.views import MethodView
from marshmallow import fields, validate

from accounts import audit

from ..auth import api_guard
from ..errors import Invalid
from ..permissions import permission
from ..services import services
from .blueprint import Blueprint

blp = Blueprint("audit_api", __name__, url_prefix="/api/v1", description="The audit log (audit.read)")
blp.before_request(api_guard)

READ = "audit.read"


class AuditFilterSchema(ma.Schema):
    actor = fields.String(validate=validate.Length(min=1, max=64), metadata={"description": "a user name"})
    action = fields.String(validate=validate.OneOf(list(audit.ACTIONS)))
    outcome = fields.String(validate=validate.OneOf(audit.OUTCOMES))
    since = fields.AwareDateTime(metadata={"description": "recorded at or after (ISO 8601 with a zone)"})
    until = fields.AwareDateTime(metadata={"description": "recorded before"})


class AuditQuerySchema(AuditFilterSchema):
    cursor = fields.String(
        validate=validate.Regexp(r"^[0-9]{1,19}$"), metadata={"description": "next_cursor of the previous page"}
    )
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=audit.MAX_LIMIT))


class AuditRecordSchema(ma.Schema):
    id = fields.Integer(required=True)
    at = fields.DateTime(required=True)
    action = fields.String(required=True)
    outcome = fields.String(required=True, validate=validate.OneOf(audit.OUTCOMES))
    actor = fields.String(attribute="actor_name", allow_none=True, metadata={"description": "the user name"})
    via = fields.String(allow_none=True, metadata={"description": "session, token, basic or cli"})
    token_id = fields.Integer(allow_none=True, metadata={"description": "the token used (never its secret)"})
    ip = fields.String(allow_none=True)
    user_agent = fields.String(allow_none=True)
    target_type = fields.String(allow_none=True)
    target = fields.String(allow_none=True)
    details = fields.Dict(required=True)
    reason = fields.String(allow_none=True)


class AuditPageSchema(ma.Schema):
    items = fields.List(fields.Nested(AuditRecordSchema), required=True)
    next_cursor = fields.String(allow_none=True)


def _filter(args: dict[str, Any]) -> audit.AuditFilter:
    return audit.AuditFilter(
        actor=args.get("actor"),
        action=args.get("action"),
        outcome=args.get("outcome"),
        since=args.get("since"),
        until=args.get("until"),
    )


@blp.route("/audit")
class Audit(MethodView):
    @permission(READ)
    @blp.arguments(AuditQuerySchema, location="query")
    @blp.response(200, AuditPageSchema)
    def get(self, args):
        """The log, newest first: who did what, from where, when, and how it ended."""
        try:
            page = audit.page(services().engine, _filter(args), cursor=args.get("cursor"), limit=args["limit"])
        except ValueError as exc:
            raise Invalid(str(exc), details={"cursor": [str(exc)]}) from None
        return {"items": page.items, "next_cursor": page.next_cursor}


@blp.route("/audit/export")
class AuditExport(MethodView):
    @permission(READ)
    @blp.arguments(AuditFilterSchema, location="query")
    @blp.response(
        200,
        {"type": "string"},
        content_type="application/x-ndjson",
        description="one JSON object per line, newest first (the fields of an audit record)",
    )
    def get(self, args):
        """Every row matching the filters as JSON lines."""
        where = _filter(args)
        schema = AuditRecordSchema()
        engine = services().engine

        def lines() -> Iterator[str]:
            for record in audit.export(engine, where):
                yield json.dumps(schema.dump(record), ensure_ascii=False) + "\n"

        return Response(
            stream_with_context(lines()),
            mimetype="application/x-ndjson",
            headers={"Content-Disposition": 'attachment; filename="audit.jsonl"'},
        )
