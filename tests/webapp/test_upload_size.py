"""An upload may be as large as ``UPLOAD_MAX_BYTES`` (512 MiB by default), every other body 4 MiB.

Found by fuzzing a live deployment: the app-wide ``MAX_CONTENT_LENGTH`` (then 1 MiB) applied to uploads
too, so a recording segment of 2 MiB got a 413 from the API and from the UI's submit form although
the documented limit is 512 MiB. Against the real job layer on a migrated SQLite file (the fixtures
of test_authorization_job_layer.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import text

from webapp import DEFAULTS

from .conftest import Person, _person, login
from .test_authorization_job_layer import layer, real_app, real_client  # noqa: F401  (fixtures)

MIB = 1024 * 1024
#: The limit of a body that is no upload (``MAX_CONTENT_LENGTH``).
LIMIT: int = DEFAULTS["MAX_CONTENT_LENGTH"]


def _flv(size: int) -> bytes:
    return b"FLV\x01" + b"\0" * (size - 4)


@pytest.fixture()
def alice(layer: dict[str, Any]) -> Person:  # noqa: F811
    registry = layer["gateway"].registry

    @registry.kind("import_recording", broker=layer["broker"], safe_to_rerun=True)
    def import_recording(ctx: Any, *, folder: str | None = None) -> str | None:
        return folder

    return _person(layer["engine"], "alice", "user")


def _upload(client: FlaskClient, person: Person, files: list[tuple[str, bytes]]) -> Any:
    data = {"files": [(io.BytesIO(body), name) for name, body in files]}
    return client.post("/api/v1/uploads", data=data, headers=person.bearer, content_type="multipart/form-data")


def _stored(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "outputs").rglob("*") if p.is_file())


def test_api_upload_larger_than_the_body_limit_is_stored(
    real_client: FlaskClient,  # noqa: F811
    alice: Person,
    tmp_path: Path,
) -> None:
    r = _upload(real_client, alice, [("seg-1.flv", _flv(LIMIT)), ("seg-2.flv", _flv(MIB))])
    assert r.status_code == 201, (r.status_code, r.get_data()[:300])
    folder = tmp_path / "outputs" / "uploads" / alice.user.owner_id / r.json["upload_id"]
    assert [(folder / f).stat().st_size for f in r.json["files"]] == [LIMIT, MIB]


def test_api_upload_over_upload_max_bytes_is_413_and_nothing_is_written(
    real_app: Flask,  # noqa: F811
    real_client: FlaskClient,  # noqa: F811
    alice: Person,
    tmp_path: Path,
) -> None:
    real_app.config["UPLOAD_MAX_BYTES"] = 2 * MIB
    r = _upload(real_client, alice, [("seg.flv", _flv(4 * MIB))])  # past the envelope's room: refused unread
    assert r.status_code == 413 and r.json["error"] == {
        "code": "payload_too_large",
        "message": f"The upload exceeds {2 * MIB} bytes.",
    }
    r = _upload(real_client, alice, [("seg.flv", _flv(2 * MIB + 1))])  # within the envelope: the files count
    assert r.status_code == 413 and r.json["error"]["code"] == "payload_too_large"
    assert _stored(tmp_path) == []


def test_other_bodies_keep_the_body_limit(
    real_client: FlaskClient,  # noqa: F811
    alice: Person,
    layer: dict[str, Any],  # noqa: F811
) -> None:
    body = {"kind": "import_recording", "payload": {"folder": "x" * (LIMIT + 1)}}
    r = real_client.post("/api/v1/jobs", json=body, headers=alice.bearer)
    assert r.status_code == 413 and r.json["error"]["code"] == "payload_too_large"
    with layer["engine"].connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM jobs")).scalar_one() == 0


def test_the_largest_valid_email_fits_the_body_limit(
    real_client: FlaskClient,  # noqa: F811
    alice: Person,
    layer: dict[str, Any],  # noqa: F811
) -> None:
    # Given notify_email's payload schema, and a payload at every field's length limit in characters outside the
    # BMP, sent as JSON escaped to ASCII (json.dumps' default): 12 bytes a character
    from tasks.notify import EMAIL_PAYLOAD

    layer["gateway"].registry.kind("notify_email", broker=layer["broker"], payload=EMAIL_PAYLOAD)(lambda ctx, **p: None)
    fields = EMAIL_PAYLOAD.properties
    payload = {name: "\U0001f600" * fields[name]["maxLength"] for name in ("channel", "subject", "text", "html")}
    body = json.dumps({"kind": "notify_email", "payload": payload}).encode()
    assert len(body) > 2 * MIB
    # When it is submitted, then the job is created with the payload whole
    r = real_client.post("/api/v1/jobs", data=body, headers=alice.bearer, content_type="application/json")
    assert r.status_code == 201, (r.status_code, r.get_data()[:300])
    with layer["engine"].connect() as conn:
        (stored,) = conn.execute(text("SELECT payload FROM jobs WHERE id = :id"), {"id": r.json["id"]}).scalars()
    assert json.loads(stored) == payload


def test_ui_submit_form_takes_an_upload_larger_than_the_body_limit(
    real_client: FlaskClient,  # noqa: F811
    alice: Person,
    layer: dict[str, Any],  # noqa: F811
    tmp_path: Path,
) -> None:
    token = login(real_client, alice)
    r = real_client.post(
        "/submit/import_recording",
        data={"csrf_token": token, "upload": [(io.BytesIO(_flv(LIMIT + MIB)), "seg.flv")]},
        content_type="multipart/form-data",
    )
    assert r.status_code == 302, (r.status_code, r.get_data()[:300])
    (stored,) = _stored(tmp_path)
    assert stored.name == "seg.flv" and stored.stat().st_size == LIMIT + MIB
    with layer["engine"].connect() as conn:
        (payload,) = conn.execute(text("SELECT payload FROM jobs")).scalars()
    assert f'"upload:{stored.parent.name}"' in payload


def test_openapi_says_how_many_files_an_upload_takes(
    real_client: FlaskClient,  # noqa: F811
    alice: Person,
) -> None:
    # Fuzzing found schema-valid uploads rejected: ``files: []`` (an empty multipart body) fit the
    # document but is a 422. The document now says 1 to MAX_FILES parts, as the upload checks.
    from webapp.uploads import MAX_FILES

    doc = real_client.get("/api/openapi.json", headers=alice.bearer).json
    files = doc["components"]["schemas"]["UploadFiles"]["properties"]["files"]
    assert (files["minItems"], files["maxItems"]) == (1, MAX_FILES)
    empty = real_client.post("/api/v1/uploads", data={}, headers=alice.bearer, content_type="multipart/form-data")
    assert empty.status_code == 422
    too_many = _upload(real_client, alice, [(f"seg-{i}.flv", _flv(16)) for i in range(MAX_FILES + 1)])
    assert too_many.status_code == 422 and too_many.json["error"]["details"]
