"""JSON from clients, held to RFC 8259: what cannot be stored or sent on as JSON is refused at the door.

Python's ``json.loads`` accepts more than JSON and fails in ways that are not ``JSONDecodeError``:

- ``NaN``, ``Infinity`` and ``-Infinity`` parse to floats, pass "number" fields and reach the job
  record as non-JSON text (``{"start_s": Infinity}``), which PostgreSQL's JSON columns and other
  parsers refuse;
- a string with an unpaired surrogate escape (``"\\ud800"``) parses, then fails when it is encoded
  for SQLite (a 500 on a bulk filter) or hashed for an idempotency key;
- an integer of more than 4300 digits raises ``ValueError`` and deep nesting ``RecursionError``,
  both past webargs' handling of invalid JSON (a 500).

:func:`loads` turns every one of these into :class:`BadJson` (a ``ValueError``) with a short reason,
and refuses nesting deeper than :data:`MAX_DEPTH`. The API parser (:class:`StrictJsonParser`) answers
it like any other invalid body: 422 ``validation_error`` with ``details.json``.
"""

from __future__ import annotations

import json
from typing import Any

from flask import Request
from webargs import core
from webargs.flaskparser import FlaskParser, abort, is_json_request

#: Deepest nesting of arrays/objects accepted in a body (payloads are flat; ``data`` objects are small).
MAX_DEPTH = 64


class BadJson(ValueError):
    """The text is not standard JSON (or nests too deeply)."""


def _reject_constant(name: str) -> Any:
    raise BadJson(f"{name} is not a JSON number")


def _check_string(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadJson("a string contains an unpaired surrogate escape") from None


def _check(value: Any) -> None:
    """Depth and strings, without recursion (the value may be as deep as the parser allowed)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_string(item)
            continue
        if not isinstance(item, dict | list):
            continue
        if depth > MAX_DEPTH:
            raise BadJson(f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            for key, child in item.items():
                _check_string(key)
                stack.append((child, depth + 1))
        else:
            stack.extend((child, depth + 1) for child in item)


def loads(text: str | bytes) -> Any:
    """Parse standard JSON; raises :class:`BadJson` for anything else (never another exception)."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        value = json.loads(text, parse_constant=_reject_constant)
    except BadJson:
        raise
    except RecursionError:
        raise BadJson(f"nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError:
        raise BadJson("not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise BadJson(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError:  # e.g. an integer longer than Python's int/str conversion limit
        raise BadJson("a number is too long") from None
    _check(value)
    return value


class StrictJsonParser(FlaskParser):
    """webargs' Flask parser with :func:`loads` for JSON bodies; an empty body is still "no body"."""

    def _raw_load_json(self, req: Request) -> Any:
        if not is_json_request(req):
            return core.missing
        data = req.get_data(cache=True)
        if not data:
            return core.missing
        try:
            return loads(data)
        except BadJson as exc:
            abort(400, exc=exc, messages={"json": [f"Invalid JSON body: {exc}."]})
