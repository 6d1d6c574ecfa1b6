"""A kind's payload, declared once as a JSON Schema (draft 2020-12) with human words.

The same :class:`PayloadSchema` validates every submit (:func:`jobs.submit` raises
:class:`~jobs.errors.PayloadInvalid` with a reason per field), is embedded in the API's OpenAPI 3.1
document (which speaks JSON Schema), and describes the UI's submit form (:meth:`PayloadSchema.fields`:
label, help, unit, bounds — never a docstring). Build one with :func:`schema` and :func:`field`::

    payload = schema(
        "Render a clip",
        "Cut a window of a session into an MP4 clip.",
        session_id=field("string", "Session", "The session to cut (from an import).", required=True),
        start_s=field("number", "Start", "Where the clip starts.", unit="s", minimum=0, required=True),
        end_s=field("number", "End", unit="s", exclusive_minimum=0, required=True, after="start_s"),
        width=field("integer", "Width", unit="px", minimum=16, maximum=7680, default=1280),
    )

``after`` orders two fields (an end after its start): the payload check refuses an end at or before
the start, the OpenAPI document states it (``x-after`` and the schema's ``x-rules``) and the UI's form
checks it in the browser before sending. ``check`` (with its ``rules`` in words) covers whatever
else one field requires of another; it sees a payload that passed the schema and the ``after``
orderings. A kind declared without a schema takes any JSON object.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

#: Form/JSON types a field may have (``text`` is a string shown as several lines).
TYPES = ("string", "text", "integer", "number", "boolean", "list", "object")

_JSON_TYPE = {"text": "string", "list": "array"}


def field(
    type: str,
    title: str,
    description: str = "",
    *,
    required: bool = False,
    default: Any = None,
    unit: str | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: float | None = None,
    max_length: int | None = None,
    choices: tuple[str, ...] = (),
    nullable: bool = False,
    after: str | None = None,
) -> dict[str, Any]:
    """One payload property as JSON Schema, with the UI's words (``title`` is the label, ``description``
    the help line, ``x-unit`` shown after the input). ``required`` is collected by :func:`schema`.
    ``after`` names a number field this one must exceed when both have a value (the other's default
    counts when it is left out): ``x-after``."""
    if type not in TYPES:
        raise ValueError(f"unknown field type {type!r}; one of {', '.join(TYPES)}")
    json_type: Any = _JSON_TYPE.get(type, type)
    prop: dict[str, Any] = {"title": title}
    if description:
        prop["description"] = description
    if type == "list":
        prop["items"] = {"type": "string", "maxLength": 4096}
    if type == "text":
        prop["x-multiline"] = True
    if unit:
        prop["x-unit"] = unit
    for key, value in (
        ("minimum", minimum),
        ("maximum", maximum),
        ("exclusiveMinimum", exclusive_minimum),
        ("maxLength", max_length),
    ):
        if value is not None:
            prop[key] = value
    if choices:
        prop["enum"] = list(choices)
    if default is not None:
        prop["default"] = default
    prop["type"] = [json_type, "null"] if nullable else json_type
    if after:
        prop["x-after"] = after
    if required:
        prop["x-required"] = True
    return prop


@dataclass(frozen=True)
class FormField:
    """One input of a kind's submit form, read off its schema."""

    name: str
    type: str
    label: str
    help: str = ""
    required: bool = False
    default: Any = None
    unit: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False
    #: The field whose value this one must exceed (``x-after``).
    after: str | None = None


@dataclass(frozen=True)
class PayloadSchema:
    """A kind's payload: its JSON Schema, its title and description, and a cross-field check."""

    title: str
    description: str = ""
    properties: Mapping[str, Mapping[str, Any]] = dataclass_field(default_factory=dict)
    #: ``check(payload) -> {field: reason}`` for what JSON Schema cannot express; empty when fine.
    check: Callable[[dict[str, Any]], Mapping[str, str]] | None = None
    #: What *check* requires, in words (the OpenAPI document and the form say it).
    rules: tuple[str, ...] = ()
    #: False only for the permissive schema of a kind declared without one (any JSON object).
    closed: bool = True

    def all_rules(self) -> tuple[str, ...]:
        """What one field requires of another, in words: each ``after`` ordering, then :attr:`rules`."""
        ordered = tuple(
            f"{p['title']} comes after {self.properties[p['x-after']]['title']}."
            for p in self.properties.values()
            if p.get("x-after")
        )
        return ordered + self.rules

    def json_schema(self) -> dict[str, Any]:
        """The payload's JSON Schema (draft 2020-12, as OpenAPI 3.1 embeds it)."""
        props = {name: {k: v for k, v in p.items() if k != "x-required"} for name, p in self.properties.items()}
        doc: dict[str, Any] = {"type": "object", "title": self.title, "properties": props}
        rules = self.all_rules()
        description = " ".join([self.description, *(f"Also: {rule}" for rule in rules)]).strip()
        if description:
            doc["description"] = description
        if rules:
            doc["x-rules"] = list(rules)
        required = [name for name, p in self.properties.items() if p.get("x-required")]
        if required:
            doc["required"] = required
        doc["additionalProperties"] = not self.closed
        return doc

    def normalized(self, payload: dict[str, Any]) -> dict[str, Any]:
        """*payload* (one that fits) as the kind's function takes it: JSON Schema counts ``5.0`` as an
        integer, so an integer field's ``5.0`` becomes ``5``."""
        out = dict(payload)
        for name, prop in self.properties.items():
            types = prop.get("type")
            if "integer" in (types if isinstance(types, list) else [types]) and isinstance(out.get(name), float):
                out[name] = int(out[name])
        return out

    def problems_of_schema(self, payload: Any) -> dict[str, list[str]]:
        """Why *payload* does not fit the JSON Schema alone (without :attr:`check`), per field."""
        found: dict[str, list[str]] = {}
        if not isinstance(payload, dict):
            return {"payload": ["Must be a JSON object."]}
        # Imported at the first check, not with the job layer: jsonschema and its dependencies cost every
        # process ~70 ms at start, and a relay, or a worker that submits nothing, never checks a payload.
        from jsonschema import Draft202012Validator

        for error in Draft202012Validator(self.json_schema()).iter_errors(payload):
            for name, reason in _describe(error, payload):
                found.setdefault(name, []).append(reason)
        return found

    def problems(self, payload: Any) -> dict[str, list[str]]:
        """Why *payload* does not fit, per field (``payload`` for the whole); empty when it fits: the JSON
        Schema first, then the ``after`` orderings and :attr:`check` (one field against another)."""
        found = self.problems_of_schema(payload)
        if found:
            return found
        for name, reason in self._order_problems(payload).items():
            found.setdefault(name, []).append(reason)
        if self.check is not None:
            for name, reason in dict(self.check(payload)).items():
                found.setdefault(name, []).append(reason)
        return found

    def _order_problems(self, payload: dict[str, Any]) -> dict[str, str]:
        """A field at or before the field it must come ``after`` (the other's default when left out)."""
        found = {}
        for name, p in self.properties.items():
            other = p.get("x-after")
            if not other:
                continue
            value = payload.get(name)
            bound = payload.get(other, self.properties[other].get("default"))
            if value is not None and bound is not None and value <= bound:
                unit = self.properties[other].get("x-unit")
                found[name] = (
                    f"Must be after {self.properties[other]['title']} ({bound:g}{f' {unit}' if unit else ''})."
                )
        return found

    def fields(self) -> list[FormField]:
        """The form's inputs, in declaration order."""
        out = []
        for name, p in self.properties.items():
            json_type = p.get("type")
            types = json_type if isinstance(json_type, list) else [json_type]
            kind = next(t for t in types if t != "null")
            kind = {"array": "list"}.get(kind, kind)
            if kind == "string" and p.get("x-multiline"):
                kind = "text"
            out.append(
                FormField(
                    name=name,
                    type=kind,
                    label=str(p.get("title") or name),
                    help=str(p.get("description") or ""),
                    required=bool(p.get("x-required")),
                    default=p.get("default"),
                    unit=p.get("x-unit"),
                    minimum=p.get("minimum"),
                    maximum=p.get("maximum"),
                    exclusive_minimum=p.get("exclusiveMinimum"),
                    choices=tuple(p.get("enum") or ()),
                    nullable="null" in types,
                    after=p.get("x-after"),
                )
            )
        return out


def schema(
    title: str,
    description: str = "",
    *,
    check: Callable[[dict[str, Any]], Mapping[str, str]] | None = None,
    rules: tuple[str, ...] = (),
    **properties: Mapping[str, Any],
) -> PayloadSchema:
    """A closed payload schema (unknown fields are refused) with these properties (see :func:`field`);
    *check* and its *rules* (in words) for what one field requires of another."""
    if (check is None) != (not rules):
        raise ValueError("a check needs its rules in words, and rules need their check")
    for name, prop in properties.items():
        other = prop.get("x-after")
        if other is None:
            continue
        numbers = ("integer", "number")
        if other not in properties or not {*_types(prop), *_types(properties[other])} <= {*numbers, "null"}:
            raise ValueError(f"{name} comes after {other!r}: both must be number fields of this schema")
    return PayloadSchema(title, description, dict(properties), check, rules=tuple(rules))


def _types(prop: Mapping[str, Any]) -> list[str]:
    json_type = prop.get("type")
    return list(json_type) if isinstance(json_type, list) else [json_type]


def any_object(title: str) -> PayloadSchema:
    """The schema of a kind declared without one: any JSON object."""
    return PayloadSchema(title, closed=False)


def _describe(error: Any, payload: dict[str, Any]) -> list[tuple[str, str]]:
    """``(field, reason)`` pairs of one jsonschema error, worded for people."""
    path = [str(p) for p in error.absolute_path]
    if error.validator == "required":
        return [(name, "Missing data for required field.") for name in error.validator_value if name not in payload]
    if error.validator == "additionalProperties":
        allowed = set(error.schema.get("properties", {}))
        return [(name, "Unknown field.") for name in error.instance if name not in allowed]
    name = path[0] if path else "payload"
    if error.validator == "type":
        wanted = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        if error.instance is None and "null" not in wanted:
            return [(name, "Field may not be null.")]
        words = {"array": "list of strings", "object": "JSON object"}
        return [(name, "Not a valid " + " or ".join(words.get(w, w) for w in wanted if w != "null") + ".")]
    if error.validator in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        bound = {"minimum": "at least", "exclusiveMinimum": "more than", "maximum": "at most"}
        return [(name, f"Must be {bound.get(error.validator, 'less than')} {error.validator_value}.")]
    if error.validator == "enum":
        return [(name, f"Must be one of: {', '.join(map(str, error.validator_value))}.")]
    if error.validator == "maxLength":
        return [(name, f"Longer than {error.validator_value} characters.")]
    return [(name, error.message)]
