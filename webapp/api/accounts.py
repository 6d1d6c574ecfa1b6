"""``/api/v1/me``, ``/api/v1/permissions``, ``/api/v1/tokens`` (your own), ``/api/v1/users`` and
``/api/v1/roles`` (``users.manage``). Every change is recorded in the audit log (:mod:`webapp.people`)."""

from __future__ import annotations

import marshmallow as ma
from flask import Response
from flask.views import MethodView
from marshmallow import fields, validate

import accounts
from accounts import permissions as catalogue

from .. import people
from ..auth import api_guard, require_identity
from ..errors import NotFound
from ..permissions import AUTHENTICATED, permission
from ..services import services
from .blueprint import Blueprint
from .schemas import JsonBoolean

blp = Blueprint("accounts_api", __name__, url_prefix="/api/v1", description="You, your API tokens, users and roles")
blp.before_request(api_guard)

MANAGE = "users.manage"
#: User and role names: ``accounts``' rule (the whole value, no trailing newline), stated as ``pattern`` so
#: the OpenAPI document carries it.
NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


def _NAME(value: str) -> None:  # noqa: N802  (used like marshmallow's validators)
    if not accounts.valid_name(value):
        raise ma.ValidationError("1-64 letters, digits, '.', '_' or '-', starting with a letter or digit.")


#: Largest id a path may name (SQLite integers are 64-bit): a larger one is no token's.
MAX_ID = 2**62
_ACTIONS = fields.List(
    fields.String(validate=validate.OneOf(list(catalogue.ACTIONS))),
    validate=validate.Length(max=len(catalogue.ACTIONS)),
)


class ActionSchema(ma.Schema):
    name = fields.String(required=True)
    description = fields.String(required=True)


class TokenRefSchema(ma.Schema):
    id = fields.Integer(required=True)
    name = fields.String(required=True)


class MeSchema(ma.Schema):
    name = fields.String(required=True)
    role = fields.String(required=True)
    via = fields.String(required=True, metadata={"description": "session, token or basic"})
    token = fields.Nested(TokenRefSchema, allow_none=True, metadata={"description": "the token used, if any"})
    permissions = fields.List(fields.String(), required=True, metadata={"description": "what you may do now"})


class TokenSchema(ma.Schema):
    id = fields.Integer(required=True)
    name = fields.String(required=True)
    prefix = fields.String(required=True, metadata={"description": "the secret's first characters"})
    created_at = fields.DateTime(required=True)
    last_used_at = fields.DateTime(allow_none=True)
    revoked_at = fields.DateTime(allow_none=True)
    active = fields.Boolean(required=True)
    permissions = fields.Method(
        "_permissions", metadata={"description": "the actions it carries (it may do those your role grants)"}
    )

    def _permissions(self, token: accounts.ApiToken) -> list[str]:
        return catalogue.ordered(token.permissions)


class NewTokenSchema(ma.Schema):
    name = fields.String(
        required=True,
        # Not blank: the name is stored without surrounding spaces (these six, in Python and JSON Schema alike).
        validate=[
            validate.Length(min=1, max=100),
            validate.Regexp(r"^[ \t\n\r\f\v]*[^ \t\n\r\f\v]", error="Not blank."),
        ],
    )
    permissions = fields.List(
        fields.String(validate=validate.OneOf(list(catalogue.ACTIONS))),
        validate=validate.Length(max=len(catalogue.ACTIONS)),
        metadata={"description": "actions it carries (default: everything you may do now; at most that)"},
    )


class CreatedTokenSchema(ma.Schema):
    token = fields.Nested(TokenSchema, required=True)
    secret = fields.String(required=True, metadata={"description": "shown this once: only its hash is kept"})


class UserSchema(ma.Schema):
    name = fields.String(attribute="username", required=True)
    role = fields.String(required=True)
    disabled = fields.Boolean(required=True)
    created_at = fields.DateTime(required=True)


class NewUserSchema(ma.Schema):
    name = fields.String(required=True, validate=_NAME, metadata={"pattern": NAME_PATTERN})
    role = fields.String(
        load_default="user", validate=_NAME, metadata={"description": "an existing role", "pattern": NAME_PATTERN}
    )
    password = fields.String(
        required=True,
        load_only=True,
        validate=validate.Length(min=accounts.MIN_PASSWORD_LENGTH, max=1024),
        metadata={"description": f"at least {accounts.MIN_PASSWORD_LENGTH} characters"},
    )


class UserChangeSchema(ma.Schema):
    role = fields.String(
        validate=_NAME, metadata={"description": "the role to give (an existing one)", "pattern": NAME_PATTERN}
    )
    disabled = JsonBoolean(metadata={"description": "true: they can no longer log in, their tokens stop"})


class PasswordSchema(ma.Schema):
    password = fields.String(
        required=True, load_only=True, validate=validate.Length(min=accounts.MIN_PASSWORD_LENGTH, max=1024)
    )


class RoleSchema(ma.Schema):
    name = fields.String(required=True)
    description = fields.String(required=True)
    builtin = fields.Boolean(required=True, metadata={"description": "built-in roles cannot change or go"})
    permissions = fields.Method("_permissions")
    users = fields.Integer(required=True, metadata={"description": "how many users hold it"})

    def _permissions(self, role: accounts.Role) -> list[str]:
        return catalogue.ordered(role.permissions)


class RoleBodySchema(ma.Schema):
    description = fields.String(load_default="", validate=validate.Length(max=200))
    permissions = _ACTIONS


class NewRoleSchema(RoleBodySchema):
    name = fields.String(required=True, validate=_NAME, metadata={"pattern": NAME_PATTERN})


@blp.route("/me")
class Me(MethodView):
    @permission(AUTHENTICATED)
    @blp.response(200, MeSchema)
    def get(self):
        """Who you are, how you authenticated and what you may do now."""
        identity = require_identity()
        token = identity.token
        return {
            "name": identity.user.username,
            "role": identity.user.role,
            "via": identity.via,
            "token": {"id": token.id, "name": token.name} if token is not None else None,
            "permissions": catalogue.ordered(identity.permissions),
        }


@blp.route("/permissions")
class Permissions(MethodView):
    @permission(AUTHENTICATED)
    @blp.response(200, ActionSchema(many=True))
    def get(self):
        """Every action a role may grant, with what it allows."""
        return [{"name": name, "description": text} for name, text in catalogue.ACTIONS.items()]


@blp.route("/tokens")
class Tokens(MethodView):
    @permission("tokens.manage_own")
    @blp.response(200, TokenSchema(many=True))
    def get(self):
        """Your API tokens, newest first (revoked ones too); never their secrets."""
        return accounts.list_tokens(services().engine, require_identity().user.id)

    @permission("tokens.manage_own", audit_as="token.create")
    @blp.arguments(NewTokenSchema)
    @blp.response(201, CreatedTokenSchema)
    @blp.alt_response(403, schema=None, description="it asks for an action you may not do")
    def post(self, body):
        """Create a token carrying some of what you may do (default: all of it); its secret is in this
        answer only."""
        token, secret = people.create_token(require_identity(), body["name"], body.get("permissions"))
        return {"token": token, "secret": secret}


@blp.route("/tokens/<int:token_id>")
class TokenById(MethodView):
    @permission("tokens.manage_own", audit_as="token.revoke")
    @blp.response(200, TokenSchema)
    def delete(self, token_id: int):
        """Revoke one of your tokens (it never authenticates again)."""
        if token_id > MAX_ID:
            raise NotFound(str(accounts.TokenNotFound()))
        return people.revoke_token(require_identity(), token_id)


@blp.route("/users")
class Users(MethodView):
    @permission(MANAGE)
    @blp.response(200, UserSchema(many=True))
    def get(self):
        """Every user with their role."""
        return accounts.list_users(services().engine)

    @permission(MANAGE, audit_as="user.create")
    @blp.arguments(NewUserSchema)
    @blp.response(201, UserSchema)
    @blp.alt_response(409, schema=None, description="the name is taken")
    def post(self, body):
        """Create a user with a role and a password you give."""
        return people.create_user(body["name"], body["role"], body["password"])


@blp.route("/users/<name>")
class UserByName(MethodView):
    @permission(MANAGE, audit_as="user.role")
    @blp.arguments(UserChangeSchema)
    @blp.response(200, UserSchema)
    @blp.alt_response(409, schema=None, description="no active user would be left who may manage users")
    def patch(self, body, name: str):
        """Change a user's role and/or disable or enable them (each change recorded on its own)."""
        if "role" in body:
            people.set_role(name, body["role"])
        if "disabled" in body:
            people.set_disabled(name, body["disabled"])
        found = accounts.get_user_by_name(services().engine, name)
        if found is None:
            raise NotFound(f"No user named {name!r}.")
        return found


@blp.route("/users/<name>/password")
class UserPassword(MethodView):
    @permission(MANAGE, audit_as="user.password")
    @blp.arguments(PasswordSchema)
    @blp.response(204)
    def put(self, body, name: str):
        """Set a user's password (the password is never shown or recorded)."""
        people.set_password(name, body["password"])
        return Response(status=204)


@blp.route("/roles")
class Roles(MethodView):
    @permission(MANAGE)
    @blp.response(200, RoleSchema(many=True))
    def get(self):
        """Every role (built-in ones first) with its actions and how many users hold it."""
        return accounts.list_roles(services().engine)

    @permission(MANAGE, audit_as="role.create")
    @blp.arguments(NewRoleSchema)
    @blp.response(201, RoleSchema)
    @blp.alt_response(409, schema=None, description="the name is taken")
    def post(self, body):
        """Define a role: a name and the actions it grants."""
        return people.create_role(body["name"], body["description"], body.get("permissions") or [])


@blp.route("/roles/<name>")
class RoleByName(MethodView):
    @permission(MANAGE, audit_as="role.update")
    @blp.arguments(RoleBodySchema)
    @blp.response(200, RoleSchema)
    @blp.alt_response(409, schema=None, description="a built-in role, or no user would be left to manage users")
    def put(self, body, name: str):
        """Replace a role's actions and description (its users have the new set from their next request)."""
        return people.update_role(name, body["description"], body.get("permissions") or [])

    @permission(MANAGE, audit_as="role.delete")
    @blp.response(200, RoleSchema)
    @blp.alt_response(409, schema=None, description="a built-in role, or users hold it")
    def delete(self, name: str):
        """Delete a role nobody holds."""
        return people.delete_role(name)
