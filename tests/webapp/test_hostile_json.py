"""JSON bodies that Python's parser accepts or trips over but that are not JSON (found by fuzzing a live
deployment): every one is a 422 ``validation_error`` naming the body, nothing is stored, and no
request reaches a 500. Against the real job layer on a migrated SQLite file (the fixtures of
test_authorization_job_layer.py), where the stored payload and the SQL filters are real."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import text

from jobs import payloads
from webapp.strict_json import MAX_DEPTH

from .conftest import Person, _person, login
from .test_authorization_job_layer import layer, real_app, real_client  # noqa: F401  (fixtures)

JSON = {"Content-Type": "application/json"}


@pytest.fixture()
def admin(layer: dict[str, Any]) -> Person:  # noqa: F811
    registry = layer["gateway"].registry

    schema = payloads.schema(
        "Measure",
        start_s=payloads.field("number", "Start", unit="s", required=True),
        data=payloads.field("object", "Data", nullable=True),
    )

    @registry.kind("measure", broker=layer["broker"], safe_to_rerun=True, payload=schema)
    def measure(ctx: Any, *, start_s: float, data: dict | None = None) -> float:
        return start_s

    return _person(layer["engine"], "root", "admin")


def _jobs(layer: dict[str, Any]) -> list[str]:  # noqa: F811
    with layer["engine"].connect() as conn:
        return [r[0] for r in conn.execute(text("SELECT payload FROM jobs"))]


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


#: (name, raw JSON for the ``payload`` of a ``measure`` job)
NOT_JSON_PAYLOADS = [
    ("NaN", b'{"start_s": NaN}'),
    ("Infinity", b'{"start_s": Infinity}'),
    ("-Infinity", b'{"start_s": -Infinity}'),
    ("NaN deep in an object field", b'{"start_s": 1, "data": {"x": [NaN]}}'),
    ("an integer of 5000 digits", b'{"start_s": ' + b"9" * 5000 + b"}"),
    ("nesting Python cannot parse", b'{"start_s": 1, "data": {"x": ' + _nested(100_000) + b"}}"),
    ("nesting deeper than MAX_DEPTH", b'{"start_s": 1, "data": {"x": ' + _nested(MAX_DEPTH) + b"}}"),
    ("an unpaired surrogate", b'{"start_s": 1, "data": {"x": "\\ud800"}}'),
    ("an unpaired surrogate in a key", b'{"start_s": 1, "data": {"\\udc00": 1}}'),
]


@pytest.mark.parametrize("name,payload", NOT_JSON_PAYLOADS, ids=[n for n, _ in NOT_JSON_PAYLOADS])
def test_submit_refuses_what_is_not_json(
    real_client: FlaskClient,  # noqa: F811
    admin: Person,
    layer: dict[str, Any],  # noqa: F811
    name: str,
    payload: bytes,
) -> None:
    body = b'{"kind": "measure", "payload": ' + payload + b"}"
    r = real_client.post("/api/v1/jobs", data=body, headers={**admin.bearer, **JSON})
    assert r.status_code == 422, (r.status_code, r.get_data()[:300])
    assert r.json["error"]["code"] == "validation_error"
    assert r.json["error"]["details"]["json"][0].startswith("Invalid JSON body: ")
    assert _jobs(layer) == []


def test_standard_json_at_the_edges_is_accepted_and_stored_as_json(
    real_client: FlaskClient,  # noqa: F811
    admin: Person,
    layer: dict[str, Any],  # noqa: F811
) -> None:
    # A surrogate PAIR is one character; nesting up to MAX_DEPTH (the body itself is level 1).
    deep = b'{"x": ' + _nested(MAX_DEPTH - 4) + b"}"
    body = (
        b'{"kind": "measure", "payload": {"start_s": 1e300, "data": {"smile": "\\ud83d\\ude00", "deep": '
        + deep
        + b"}}}"
    )
    r = real_client.post("/api/v1/jobs", data=body, headers={**admin.bearer, **JSON})
    assert r.status_code == 201, r.get_data()[:300]
    (stored,) = _jobs(layer)
    assert json.loads(stored, parse_constant=lambda c: pytest.fail(f"{c} stored"))["data"]["smile"] == "\U0001f600"


@pytest.mark.parametrize(
    "method,path,body",
    [
        ("POST", "/api/v1/jobs/bulk/cancel", b'{"filter": {"kind": "\\ud800"}, "dry_run": true}'),
        ("POST", "/api/v1/jobs/bulk/retry", b'{"filter": {"owner": "\\ud800"}}'),
        (
            "POST",
            "/api/v1/jobs/bulk/cancel",
            b'{"filter": {"q": "' + b"1" * 5000 + b'"}, "limit": ' + b"1" * 5000 + b"}",
        ),
        ("POST", "/api/v1/dead/replay", b'{"queue": "default", "ids": [NaN]}'),
        ("PUT", "/api/v1/settings", b'{"expected_revision": 0, "values": {"retention.events_days": Infinity}}'),
        ("PUT", "/api/v1/settings", b'{"expected_revision": 0, "values": ' + _nested(100_000) + b"}"),
    ],
)
def test_every_json_body_is_held_to_the_same_rules(
    real_client: FlaskClient,  # noqa: F811
    admin: Person,
    method: str,
    path: str,
    body: bytes,
) -> None:
    # The bulk filters with an unpaired surrogate reached SQLite's encoder: 500 before the fix.
    r = real_client.open(path, method=method, data=body, headers={**admin.bearer, **JSON})
    assert r.status_code == 422, (r.status_code, r.get_data()[:300])
    assert r.json["error"]["details"]["json"][0].startswith("Invalid JSON body: ")


@pytest.mark.parametrize(
    "field,value",
    [
        ("p_start_s", "nan"),
        ("p_start_s", "-inf"),
        ("p_data", '{"x": NaN}'),
        ("p_data", '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"),  # RecursionError: a 500 page before
    ],
)
def test_ui_submit_form_refuses_what_is_not_json(
    real_client: FlaskClient,  # noqa: F811
    admin: Person,
    layer: dict[str, Any],  # noqa: F811
    field: str,
    value: str,
) -> None:
    token = login(real_client, admin)
    data = {"csrf_token": token, "idempotency_key": "k", "p_start_s": "1", field: value}
    r = real_client.post("/submit/measure", data=data)
    assert r.status_code == 200, (r.status_code, r.get_data()[:300])  # the form again, with its messages
    page = r.get_data(as_text=True)
    assert "Must be a finite number." in page or "Not valid JSON: " in page
    assert _jobs(layer) == []
