"""Uploading a recording's files (``POST /api/v1/uploads``) with real files from the demo recording."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from tasks.domain.demo_recording import make_recording


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("rec")
    make_recording(folder, segments=1, seconds=1.0, speech=False, comments_per_segment=5)
    return sorted(p for p in folder.iterdir() if p.suffix in (".flv", ".mp4", ".xml"))


def _post(client, person, files):  # type: ignore[no-untyped-def]
    data = {"files": [(io.BytesIO(body), name) for name, body in files]}
    return client.post("/api/v1/uploads", data=data, headers=person.bearer, content_type="multipart/form-data")


def test_upload_stores_files_for_import(client, app, alice, recording, tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = _post(client, alice, [(p.name, p.read_bytes()) for p in recording])
    assert r.status_code == 201, r.get_json()
    body = r.get_json()
    # The answer names the upload by reference and the files by name: no server path (issue 16)
    assert body["folder"] == f"upload:{body['upload_id']}" and body["payload"] == {"folder": body["folder"]}
    assert body["files"] == [p.name for p in recording]
    assert str(tmp_path) not in r.get_data(as_text=True) and "/" not in "".join(body["files"])
    # and the files are stored in the owner's uploads, under the upload's id
    folder = tmp_path / "outputs" / "uploads" / alice.user.owner_id / body["upload_id"]
    assert sorted(p.name for p in folder.iterdir()) == [p.name for p in recording]
    assert (folder / recording[0].name).read_bytes() == recording[0].read_bytes()


@pytest.mark.parametrize(
    ("name", "body", "status"),
    [
        ("../evil.flv", b"FLV\x01", 422),
        ("run.sh", b"#!/bin/sh", 422),
        ("seg.flv", b"not a video", 422),
        ("seg.mp4", b"\x00\x00\x00\x18nope", 422),
        ("seg.flv", b"", 422),
    ],
)
def test_bad_files_are_rejected_before_writing(client, alice, tmp_path, name, body, status) -> None:  # type: ignore[no-untyped-def]
    r = _post(client, alice, [(name, body)])
    assert r.status_code == status and r.get_json()["error"]["code"] == "validation_error"
    assert not (tmp_path / "outputs" / "uploads").exists() or not any((tmp_path / "outputs" / "uploads").rglob("*.*"))


def test_hostile_xml_size_limit_and_auth(client, app, alice, recording, tmp_path) -> None:  # type: ignore[no-untyped-def]
    video = next(p for p in recording if p.suffix != ".xml")
    bomb = b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><i>&a;</i>'
    r = _post(client, alice, [(video.name, video.read_bytes()), ("danmaku.xml", bomb)])
    assert r.status_code == 422
    assert _post(client, alice, [("only.xml", b"<i/>")]).status_code == 422  # no video segment
    app.config["UPLOAD_MAX_BYTES"] = 10
    r = _post(client, alice, [(video.name, video.read_bytes())])
    assert r.status_code == 413 and r.get_json()["error"]["code"] == "payload_too_large"
    assert not any((tmp_path / "outputs").rglob("*.flv"))
    assert client.post("/api/v1/uploads", data={}, content_type="multipart/form-data").status_code == 401
    missing = client.post("/api/v1/uploads", data={}, headers=alice.bearer, content_type="multipart/form-data")
    assert missing.status_code == 422


def test_submit_form_uploads_files_then_imports_the_stored_folder(  # type: ignore[no-untyped-def]
    client, alice, driver, kinds, web_broker, recording, tmp_path
) -> None:
    from tasks.import_recording import PAYLOAD

    from .conftest import login

    # The real kind's payload schema; its function does not run (no worker in web tests).
    kinds.kind("import_recording", payload=PAYLOAD, broker=web_broker)(lambda ctx, **payload: None)
    token = login(client, alice)
    form = client.get("/submit/import_recording").get_data(as_text=True)
    assert 'enctype="multipart/form-data"' in form and 'name="upload"' in form

    # A corrupt file: the form comes back with the reason, nothing is stored, no job
    bad = {"csrf_token": token, "upload": [(io.BytesIO(b"not a video"), "seg.flv")]}
    r = client.post("/submit/import_recording", data=bad, content_type="multipart/form-data")
    assert r.status_code == 200 and "not a valid flv file" in r.get_data(as_text=True)
    assert driver.count() == 0 and not (tmp_path / "outputs" / "uploads").exists()

    # The real files: stored, then submitted with the stored folder
    files = [(io.BytesIO(p.read_bytes()), p.name) for p in recording]
    r = client.post(
        "/submit/import_recording",
        data={"csrf_token": token, "upload": files},
        content_type="multipart/form-data",
    )
    assert r.status_code == 302, r.get_data(as_text=True)
    payload = driver.payload(r.headers["Location"].rsplit("/", 1)[1])
    assert payload["folder"].startswith("upload:")  # a reference, not a server path
    folder = tmp_path / "outputs" / "uploads" / alice.user.owner_id / payload["folder"].removeprefix("upload:")
    assert sorted(p.name for p in folder.iterdir()) == [p.name for p in recording]
