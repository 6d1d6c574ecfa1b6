"""Bodies sent with ``Transfer-Encoding: chunked`` (no ``Content-Length``) against a real gunicorn.

gunicorn decodes chunked bodies and sets ``wsgi.input_terminated``; Werkzeug then reads at most
``MAX_CONTENT_LENGTH`` bytes and silently stops there. Found in issue 16: a 2 MiB JSON body sent
chunked was cut at 1 MiB and answered 422 "Unterminated string". Each limit must hold for chunked
bodies exactly as for declared ones: up to the limit is read whole, one byte more is a 413 with the
reason; an upload keeps its own limit (``UPLOAD_MAX_BYTES``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from webapp import DEFAULTS

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
#: The limit of a body that is no upload (``MAX_CONTENT_LENGTH``).
LIMIT: int = DEFAULTS["MAX_CONTENT_LENGTH"]
#: ``UPLOAD_MAX_BYTES`` of this server (a little over the body limit, so the test sends little).
UPLOAD_MAX_BYTES = LIMIT + 2 * MIB


@dataclass(frozen=True)
class Server:
    base_url: str
    token: str
    output_root: Path

    def post(self, path: str, body: bytes, content_type: str, *, chunked: bool = True) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": content_type}
        # An iterator makes httpx send ``Transfer-Encoding: chunked`` and no Content-Length.
        content = _chunks(body) if chunked else body
        with httpx.Client(base_url=self.base_url, timeout=30) as client:
            return client.post(path, content=content, headers=headers)


def _chunks(body: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    import accounts
    from jobs import schema
    from jobs.db import make_engine

    tmp = tmp_path_factory.mktemp("chunked")
    url = f"sqlite:///{tmp / 'tenure.db'}"
    schema.upgrade(url)
    engine = make_engine(url)
    user, _ = accounts.create_user(engine, "alice", "alice-password-1")
    _, token = accounts.create_token(engine, user.id, "tests")
    engine.dispose()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.set_inheritable(True)
    port = listener.getsockname()[1]
    env = {
        **os.environ,
        "TENURE_DATABASE_URL": url,
        "TENURE_OUTPUT_ROOT": str(tmp / "outputs"),
        "TENURE_SECRET_KEY": "chunked-secret",
        "TENURE_WEB_WORKERS": "1",
        "TENURE_WEB_THREADS": "4",
        "TENURE_WEB_UPLOAD_MAX_BYTES": str(UPLOAD_MAX_BYTES),
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    gunicorn = [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "-b", f"fd://{listener.fileno()}"]
    with open(tmp / "web.log", "wb") as log:
        proc = subprocess.Popen(
            [*gunicorn, "webapp:create_app()"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(listener.fileno(),),
            start_new_session=True,
        )
    listener.close()
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base_url + "/api/health/live", timeout=1).is_success:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError((tmp / "web.log").read_text()[-3000:])
            time.sleep(0.1)
        yield Server(base_url, token, tmp / "outputs")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)


def _job_body(size: int) -> bytes:
    """A submit body of exactly *size* bytes (a folder name fills it)."""
    frame = json.dumps({"kind": "import_recording", "payload": {"folder": ""}}).encode()
    body = frame.replace(b'"folder": ""', b'"folder": "' + b"x" * (size - len(frame)) + b'"')
    assert len(body) == size
    return body


def test_a_chunked_json_body_over_the_limit_is_413_with_the_reason(server: Server) -> None:
    # When a body of twice the limit is sent chunked
    r = server.post("/api/v1/jobs", _job_body(2 * LIMIT), "application/json")
    # Then it is refused as too large, never parsed as cut JSON
    assert r.status_code == 413, r.text[:300]
    assert r.json()["error"] == {"code": "payload_too_large", "message": f"The request body exceeds {LIMIT} bytes."}


def test_a_chunked_body_one_byte_over_the_limit_is_refused_and_one_at_the_limit_is_read_whole(
    server: Server,
) -> None:
    over = server.post("/api/v1/jobs", _job_body(LIMIT + 1), "application/json")
    assert over.status_code == 413 and over.json()["error"]["code"] == "payload_too_large"
    # At the limit the whole body is read: the payload is judged (the folder field is too long), not the JSON
    at = server.post("/api/v1/jobs", _job_body(LIMIT), "application/json")
    assert at.status_code == 422, at.text[:300]
    assert at.json()["error"]["details"].keys() == {"folder"}
    # and a small chunked body is an ordinary request: the job is created
    small = server.post(
        "/api/v1/jobs",
        json.dumps({"kind": "import_recording", "payload": {"folder": "a"}}).encode(),
        "application/json",
    )
    assert small.status_code == 201, small.text[:300]


def _multipart(files: list[tuple[str, bytes]]) -> tuple[bytes, str]:
    boundary = "tenure-chunked-test"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="{name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n".encode()
        + body
        + b"\r\n"
        for name, body in files
    ]
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def test_a_chunked_upload_keeps_the_upload_limit(server: Server) -> None:
    # An upload larger than the body limit, within UPLOAD_MAX_BYTES, sent chunked: stored whole
    segment = b"FLV\x01" + b"\0" * (LIMIT + MIB - 4)
    body, content_type = _multipart([("seg.flv", segment)])
    stored = server.post("/api/v1/uploads", body, content_type)
    assert stored.status_code == 201, stored.text[:300]
    folder = next((server.output_root / "uploads").glob(f"*/{stored.json()['upload_id']}"))
    assert (folder / "seg.flv").read_bytes() == segment
    # Past UPLOAD_MAX_BYTES and its envelope, sent chunked: 413 with the reason, nothing stored
    huge, content_type = _multipart([("big.flv", b"FLV\x01" + b"\0" * (UPLOAD_MAX_BYTES + 2 * MIB))])
    refused = server.post("/api/v1/uploads", huge, content_type)
    assert refused.status_code == 413, refused.text[:300]
    assert refused.json()["error"]["code"] == "payload_too_large"
    assert not list((server.output_root / "uploads").rglob("big.flv"))
