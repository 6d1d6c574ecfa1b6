"""Uploaded recording files (``POST /api/v1/uploads``): validated first, then stored for ``import_recording``.

Every file is checked before anything is written: a plain file name (printable, no path, not
hidden), an allowed extension (``.flv``, ``.mp4``, ``.xml``), a size within ``UPLOAD_MAX_BYTES`` in
total, the format's signature (``FLV`` header, an MP4 ``ftyp`` box, XML without a DOCTYPE — entity
expansion is refused), no duplicate names and at least one video segment. Only then are the files
written to ``<output_root>/uploads/<owner>/<random id>/`` (through a hidden temporary folder renamed
into place, so a half-written upload is never visible). Answers never carry that server path: an
``import_recording`` payload names the upload by its reference, ``{"folder": "upload:<id>"}``, which
the actor resolves among the job owner's uploads (``jobs.uploads``).
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flask import current_app, request

from jobs.uploads import upload_reference, uploads_dir

from .errors import Invalid, PayloadTooLarge

#: Allowed extensions.
EXTENSIONS = frozenset({".flv", ".mp4", ".xml"})
VIDEO = frozenset({".flv", ".mp4"})
MAX_FILES = 64
#: ``UPLOAD_MAX_BYTES`` when not configured (``TENURE_WEB_UPLOAD_MAX_BYTES``).
DEFAULT_UPLOAD_MAX_BYTES = 512 * 1024 * 1024
#: Room for the multipart envelope (boundaries, part headers, the submit form's fields) besides the files.
MULTIPART_OVERHEAD = 1024 * 1024
#: The job kind whose UI submit form also takes the recording's files (``/submit/import_recording``).
UPLOAD_KIND = "import_recording"
_MP4_BOXES = (b"ftyp", b"styp")


class UploadTooLarge(PayloadTooLarge):
    """The upload exceeds ``UPLOAD_MAX_BYTES``."""


@dataclass(frozen=True)
class Upload:
    """A stored upload: its id and file names (its folder stays on the server)."""

    id: str
    files: tuple[str, ...]

    @property
    def reference(self) -> str:
        """What an ``import_recording`` payload's ``folder`` says to import this upload."""
        return upload_reference(self.id)


def upload_max_bytes() -> int:
    """``UPLOAD_MAX_BYTES`` of this app: the most an upload's files may hold in total."""
    return int(current_app.config.get("UPLOAD_MAX_BYTES", DEFAULT_UPLOAD_MAX_BYTES))


def _is_upload_request() -> bool:
    if request.method != "POST":
        return False
    if request.endpoint == "jobs_api.Uploads":
        return True
    return request.endpoint == "ui.submit" and (request.view_args or {}).get("kind_name") == UPLOAD_KIND


def allow_upload_bodies() -> None:
    """``before_request`` of the app, ahead of anything that reads a form (CSRF): the requests that carry an
    upload may be as large as ``UPLOAD_MAX_BYTES`` plus the envelope; every other body keeps
    ``MAX_CONTENT_LENGTH`` (4 MiB). A declared length over that is refused before a byte is read."""
    if not _is_upload_request():
        return
    limit = upload_max_bytes()
    if request.content_length is not None and request.content_length > limit + MULTIPART_OVERHEAD:
        raise UploadTooLarge(f"The upload exceeds {limit} bytes.")
    request.max_content_length = limit + MULTIPART_OVERHEAD


def _plain_name(name: str) -> bool:
    """A bare file name: printable (recorders write Unicode titles), no path, not hidden, ≤ 200 bytes."""
    return (
        0 < len(name.encode()) <= 200
        and name.isprintable()
        and not any(c in name for c in '/\\:*?"<>|')
        and not name.startswith((".", " ", "-"))
        and name == name.strip()
    )


def _size(stream: Any) -> int:
    stream.seek(0, os.SEEK_END)
    size = stream.tell()
    stream.seek(0)
    return int(size)


def _signature_ok(ext: str, head: bytes) -> bool:
    if ext == ".flv":
        return head[:3] == b"FLV"
    if ext == ".mp4":
        return head[4:8] in _MP4_BOXES
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return text.startswith(b"<") and b"<!doctype" not in head.lower() and b"<!entity" not in head.lower()


def validate(files: list[Any], max_bytes: int) -> list[tuple[str, Any]]:
    """``(name, stream)`` per file when every check passes; raises :class:`Invalid`/:class:`UploadTooLarge`."""
    if not files:
        raise Invalid("No files uploaded.", details={"files": ["Upload at least one .flv or .mp4 segment."]})
    if len(files) > MAX_FILES:
        raise Invalid("Too many files.", details={"files": [f"At most {MAX_FILES} files."]})
    checked: list[tuple[str, Any]] = []
    names: set[str] = set()
    total = 0
    for storage in files:
        name = str(getattr(storage, "filename", "") or "")
        ext = os.path.splitext(name)[1].lower()
        if not _plain_name(name):
            raise Invalid("Invalid file name.", details={"files": [f"{name[:100]!r}: use a plain file name."]})
        if ext not in EXTENSIONS:
            raise Invalid("File type not allowed.", details={"files": [f"{name}: only .flv, .mp4 and .xml files."]})
        if name.lower() in names:
            raise Invalid("Duplicate file name.", details={"files": [f"{name}: uploaded twice."]})
        names.add(name.lower())
        stream = storage.stream
        size = _size(stream)
        total += size
        if total > max_bytes:
            raise UploadTooLarge(f"The upload exceeds {max_bytes} bytes.")
        head = stream.read(4096 if ext == ".xml" else 16)
        stream.seek(0)
        if size == 0 or not _signature_ok(ext, head):
            raise Invalid("Corrupt or invalid file.", details={"files": [f"{name}: not a valid {ext[1:]} file."]})
        if ext == ".xml":
            body = stream.read().lower()
            stream.seek(0)
            if b"<!doctype" in body or b"<!entity" in body:
                raise Invalid("Corrupt or invalid file.", details={"files": [f"{name}: DOCTYPE is not allowed."]})
        checked.append((name, stream))
    if not any(os.path.splitext(n)[1].lower() in VIDEO for n, _ in checked):
        raise Invalid("No video segment.", details={"files": ["Upload at least one .flv or .mp4 segment."]})
    return checked


def store(output_root: Path, owner_id: str, files: list[Any], max_bytes: int) -> Upload:
    """Validate *files* (nothing is written if one fails), then store them in a new upload folder."""
    checked = validate(files, max_bytes)
    upload_id = uuid.uuid4().hex
    base = uploads_dir(output_root, owner_id)
    base.mkdir(parents=True, exist_ok=True)
    staging = base / f".{upload_id}.partial"
    final = base / upload_id
    try:
        staging.mkdir()
        for name, stream in checked:
            with open(staging / name, "wb") as out:
                shutil.copyfileobj(stream, out, 1024 * 1024)
        staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Upload(upload_id, tuple(name for name, _ in checked))
