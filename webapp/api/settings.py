"""``/api/v1/settings`` (``settings.change``): runtime settings an admin may change without a deploy."""

from __future__ import annotations

import marshmallow as ma
from flask.views import MethodView
from marshmallow import fields, validate

from .. import runtime_settings
from ..audit_log import audited
from ..auth import api_guard, require_identity
from ..permissions import permission
from ..services import services
from .blueprint import Blueprint
from .schemas import OwnerName, WholeNumber

blp = Blueprint("settings_api", __name__, url_prefix="/api/v1", description="Runtime settings (settings.change)")
blp.before_request(api_guard)


def _values_dict(**kwargs: object) -> fields.Dict:
    return fields.Dict(keys=fields.String(), values=fields.Raw(allow_none=True), **kwargs)  # type: ignore[arg-type]


class SettingSpecSchema(ma.Schema):
    key = fields.String(required=True, metadata={"description": "the key; <name> stands for a queue/schedule"})
    type = fields.String(required=True, validate=validate.OneOf(["bool", "int", "str"]))
    default = fields.Raw(allow_none=True)
    effect = fields.String(required=True, validate=validate.OneOf(["at once", "next job", "next boundary", "restart"]))
    help = fields.String(required=True)
    secret = fields.Boolean(required=True)
    nullable = fields.Boolean(required=True)
    minimum = fields.Integer(allow_none=True)
    maximum = fields.Integer(allow_none=True)


class RuntimeSettingsSchema(ma.Schema):
    revision = fields.Integer(required=True, metadata={"description": "latest saved revision (0: never saved)"})
    saved_at = fields.DateTime(allow_none=True)
    saved_by = OwnerName(allow_none=True, metadata={"description": "the user name of who saved it"})
    saved = _values_dict(required=True, metadata={"description": 'saved values; secrets as {"set": bool}'})
    effective = _values_dict(
        required=True, metadata={"description": "defaults ← TENURE_* ← saved; restart keys: the running value"}
    )
    pending_restart = fields.List(fields.String(), required=True)
    jobs_on_older_snapshot = fields.Integer(
        required=True, metadata={"description": "running jobs submitted before the latest save"}
    )
    catalogue = fields.List(fields.Nested(SettingSpecSchema), required=True)
    deployment = _values_dict(required=True, metadata={"description": "read-only deployment settings"})
    changed = _values_dict(metadata={"description": "PUT only: keys whose effective value this save changed"})
    warnings = fields.List(fields.String(), metadata={"description": "PUT only: changes saved but not applied"})


class RuntimeSettingsPutSchema(ma.Schema):
    expected_revision = WholeNumber(
        required=True, validate=validate.Range(min=0, max=2**31 - 1), metadata={"description": "the revision read"}
    )
    values = fields.Dict(
        keys=fields.String(validate=validate.Length(min=1, max=300)),
        values=fields.Raw(allow_none=True),
        required=True,
        metadata={"description": "every saved key; omitted secrets keep their value, null clears"},
    )


@blp.route("/settings")
class Settings(MethodView):
    @permission("settings.change")
    @blp.response(200, RuntimeSettingsSchema)
    def get(self):
        """Saved and effective runtime settings, revision, pending restarts (secrets shown as set/unset)."""
        return runtime_settings.current(services())

    @permission("settings.change", audit_as="settings.save")
    @blp.arguments(RuntimeSettingsPutSchema)
    @blp.response(200, RuntimeSettingsSchema)
    @blp.alt_response(409, schema=None, description="expected_revision is not the latest revision")
    def put(self, args):
        """Save a new revision (validated as a whole: a failed save saves nothing)."""
        identity = require_identity()
        with audited("settings.save", target_type="settings") as act:
            return runtime_settings.save(
                services(), args["values"], args["expected_revision"], identity.user.owner_id, act=act
            )
