"""Where ``import_recording`` may read: the configured import roots and the job owner's own uploads.

A recording folder in a payload is a path on the worker's disk, so without this rule any user could
import (and then render and download) another owner's upload under ``<output_root>/uploads/<owner>/``
or any media file the worker can read. Allowed are:

* the folders of ``TENURE_IMPORT_ROOTS`` (``os.pathsep``-separated, relative to the worker's working
  directory; default ``var/recordings``): recordings the operators put there for everyone;
* the owner's own uploads, ``<output_root>/uploads/<owner_id>/`` (the root snapshotted at submit),
  which a payload names by reference: ``upload:<upload id>`` (what ``POST /api/v1/uploads`` answers)
  resolves only inside the job owner's uploads folder (:func:`source_folder`).

Paths are compared after resolving ``..`` and symbolic links, and the answer is the same whether or not
the path exists, so a refusal tells nothing about the worker's file system.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from jobs import JobContext
from jobs.uploads import upload_folder, uploads_dir
from settings.environment import current_settings

from .domain.recording.importer import RecordingError
from .runtime import output_root


class ImportNotAllowed(RecordingError):
    """The payload names a path outside the import roots and the owner's uploads."""


def import_roots() -> list[Path]:
    """The resolved folders of this process's ``TENURE_IMPORT_ROOTS``."""
    return [Path(part).resolve() for part in current_settings().import_roots.split(os.pathsep) if part.strip()]


def uploads_root(ctx: JobContext) -> Path:
    """The job owner's uploads folder (where ``POST /api/v1/uploads`` stores their files)."""
    return uploads_dir(output_root(ctx), ctx.owner_id).resolve()


def source_folder(ctx: JobContext, folder: str) -> str:
    """The folder to read for a payload's *folder*: an upload reference (``upload:<id>``) becomes that upload's
    folder among the job owner's uploads; anything else is a path, as given.

    Raises:
      ImportNotAllowed: A malformed upload reference.
    """
    try:
        resolved = upload_folder(output_root(ctx), ctx.owner_id, folder)
    except ValueError as exc:
        raise ImportNotAllowed(str(exc)) from None
    return folder if resolved is None else str(resolved)


def check_readable(ctx: JobContext, paths: Iterable[str]) -> None:
    """Refuse the import unless every path lies inside an import root or the owner's uploads.

    Raises:
      ImportNotAllowed: Naming the first refused path as the payload gave it.
    """
    allowed = [*import_roots(), uploads_root(ctx)]
    for given in paths:
        resolved = Path(given).resolve()
        if not any(resolved.is_relative_to(root) for root in allowed):
            raise ImportNotAllowed(
                f"{given}: not inside an import root (TENURE_IMPORT_ROOTS) or your uploads; "
                "ask an operator to put the recording under an import root, or upload it"
            )
