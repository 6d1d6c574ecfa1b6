"""Where an owner's uploaded files live: ``<output_root>/uploads/<owner folder>/``, and how payloads name them.

One definition for the web layer, which stores uploads there (``webapp.uploads``), and for the actors, which
may import from there only for the same owner (``tasks.import_policy``). The owner id becomes a plain folder
name (anything but letters, digits, ``_`` and ``-`` replaced), so no owner id can point outside ``uploads/``.

Clients never see a server path: an upload is named by its reference ``upload:<upload id>``, which only
the job owner's own uploads folder resolves (:func:`upload_folder`), on whichever host runs the job.
"""

from __future__ import annotations

import re
from pathlib import Path

#: What an upload reference starts with (``upload:<upload id>``).
UPLOAD_REFERENCE_PREFIX = "upload:"
_UPLOAD_ID = re.compile(r"[0-9a-f]{32}")


def owner_folder(owner_id: str) -> str:
    """*owner_id* as a single, plain folder name."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", owner_id)[:100] or "_"


def uploads_dir(output_root: str | Path, owner_id: str) -> Path:
    """The folder holding *owner_id*'s uploads under *output_root* (not created here)."""
    return Path(output_root) / "uploads" / owner_folder(owner_id)


def upload_reference(upload_id: str) -> str:
    """How a payload names upload *upload_id* (``upload:<id>``): opaque, no server path."""
    return UPLOAD_REFERENCE_PREFIX + upload_id


def upload_folder(output_root: str | Path, owner_id: str, reference: str) -> Path | None:
    """The folder of *owner_id*'s upload that *reference* names, or ``None`` when it is no upload reference.

    Raises:
      ValueError: It starts like one but names no upload id this layer hands out.
    """
    if not reference.startswith(UPLOAD_REFERENCE_PREFIX):
        return None
    upload_id = reference[len(UPLOAD_REFERENCE_PREFIX) :]
    if not _UPLOAD_ID.fullmatch(upload_id):
        raise ValueError(f"{reference[:60]!r} is not an upload reference (upload:<32 hex digits>)")
    return uploads_dir(output_root, owner_id) / upload_id
