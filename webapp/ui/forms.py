"""WTForms for the UI; submit forms are built per kind from its :class:`~webapp.gateway.FieldSpec` list."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime
from typing import Any

from flask_wtf import FlaskForm
from wtforms import (
    BooleanField,
    FloatField,
    HiddenField,
    IntegerField,
    SelectField,
    StringField,
    TextAreaField,
)
from wtforms.validators import DataRequired, InputRequired, Length, NumberRange, Optional, ValidationError

from .. import strict_json
from ..gateway import FieldSpec, KindInfo


class TokenForm(FlaskForm):
    name = StringField("Token name", validators=[DataRequired(), Length(max=100)])


class EmptyForm(FlaskForm):
    """Forms with nothing but the CSRF token (buttons)."""


class SubmitBase(FlaskForm):
    #: Generated when the form is shown: a double-click or a browser resubmit yields the same job.
    idempotency_key = HiddenField()
    priority = IntegerField("Priority", default=0, validators=[Optional(), NumberRange(min=0, max=255)])
    delay_s = FloatField("Delay (seconds)", default=0, validators=[Optional(), NumberRange(min=0, max=30 * 86400)])


def _label(spec: FieldSpec) -> str:
    label = spec.label or spec.name.replace("_", " ").capitalize()
    return f"{label} ({spec.unit})" if spec.unit else label


def _field(spec: FieldSpec, others: dict[str, FieldSpec]) -> Any:
    label = _label(spec)
    required = [InputRequired()] if spec.required else [Optional()]
    kwargs = {"description": spec.help, "default": spec.default}
    if spec.choices:
        return SelectField(label, choices=[(c, c) for c in spec.choices], validators=required, **kwargs)
    bounds = _bounds(spec)
    if spec.type == "integer":
        render = {**_range_attrs(spec), **_order_attrs(spec, others)}
        return IntegerField(label, validators=[*required, *bounds], render_kw=render, **kwargs)
    if spec.type == "number":
        render = {"step": "any", **_range_attrs(spec), **_order_attrs(spec, others)}
        return FloatField(label, validators=[*required, Finite(), *bounds], render_kw=render, **kwargs)
    if spec.type == "boolean":
        return BooleanField(label, validators=[Optional()], **kwargs)
    if spec.type in ("text", "list", "object"):
        extra = [JsonObject()] if spec.type == "object" else []
        render = {"data-json-object": "1"} if spec.type == "object" else {}
        return TextAreaField(label, validators=[*required, Length(max=20_000), *extra], render_kw=render, **kwargs)
    return StringField(label, validators=[*required, Length(max=2_000)], **kwargs)


def _bounds(spec: FieldSpec) -> list[Any]:
    """The schema's bounds as validators (the server checks them again with the schema)."""
    found: list[Any] = []
    if spec.minimum is not None or spec.maximum is not None:
        found.append(NumberRange(min=spec.minimum, max=spec.maximum))
    if spec.exclusive_minimum is not None:
        found.append(Above(spec.exclusive_minimum))
    return found


def _range_attrs(spec: FieldSpec) -> dict[str, Any]:
    """``min``/``max`` attributes, so the browser refuses a value out of range before it is sent
    (``static/submit.js`` says why at the field; an exclusive bound is ``data-exclusive-min``)."""
    attrs: dict[str, Any] = {}
    low = spec.minimum if spec.minimum is not None else spec.exclusive_minimum
    if low is not None:
        attrs["min"] = low
    if spec.exclusive_minimum is not None:
        attrs["data-exclusive-min"] = spec.exclusive_minimum
    if spec.maximum is not None:
        attrs["max"] = spec.maximum
    return attrs


def _order_attrs(spec: FieldSpec, others: dict[str, FieldSpec]) -> dict[str, Any]:
    """The field this one must come after (an end after its start), for the check in the browser: its
    input, its name in the server's message, its unit and its default (the value when left empty)."""
    other = others.get(spec.after or "")
    if other is None:
        return {}
    attrs = {
        "data-after": f"p_{other.name}",
        "data-after-title": other.label or other.name,
        "data-after-unit": other.unit or "",
    }
    if isinstance(other.default, int | float) and not isinstance(other.default, bool):
        attrs["data-after-default"] = other.default
    return attrs


class Above:
    """More than a bound (JSON Schema's ``exclusiveMinimum``)."""

    def __init__(self, bound: float) -> None:
        self.bound = bound

    def __call__(self, form: Any, field: Any) -> None:
        if field.data is not None and field.data <= self.bound:
            raise ValidationError(f"Must be more than {self.bound:g}.")


def submit_form_for(kind: KindInfo, formdata: Any = None) -> SubmitBase:
    """A form class with one field per payload input of *kind*, instantiated."""
    others = {spec.name: spec for spec in kind.fields}
    attrs = {f"p_{spec.name}": _field(spec, others) for spec in kind.fields}
    cls = type(f"Submit_{kind.name}", (SubmitBase,), attrs)
    form = cls(formdata=formdata) if formdata is not None else cls()
    if not form.idempotency_key.data:
        form.idempotency_key.data = uuid.uuid4().hex
    return form


class Finite:
    """A number, not ``nan`` or ``inf`` (which ``float()`` accepts and JSON cannot hold)."""

    def __call__(self, form: Any, field: Any) -> None:
        if field.data is not None and not math.isfinite(field.data):
            raise ValidationError("Must be a finite number.")


class JsonObject:
    """The text is a JSON object (standard JSON: :func:`webapp.strict_json.loads`)."""

    def __call__(self, form: Any, field: Any) -> None:
        if not field.data:
            return
        try:
            value = strict_json.loads(field.data)
        except strict_json.BadJson as exc:
            raise ValidationError(f"Not valid JSON: {exc}.") from None
        if not isinstance(value, dict):
            raise ValidationError("Must be a JSON object ({...}).")


def payload_from(kind: KindInfo, form: SubmitBase) -> dict[str, Any]:
    """The job payload from a validated form (list fields: one item per line; object fields: JSON)."""
    payload: dict[str, Any] = {}
    for spec in kind.fields:
        value = getattr(form, f"p_{spec.name}").data
        if value is None or (value == "" and not spec.required):
            continue
        if spec.type == "list":
            value = [line.strip() for line in str(value).splitlines() if line.strip()]
        elif spec.type == "object":
            value = strict_json.loads(value)
        payload[spec.name] = value
    return payload


def datetime_field(raw: str | None) -> datetime | None:
    """A ``datetime-local`` field's value (UTC when it names no zone), or None when empty or not a time."""
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)
