"""Where an owner's uploaded files live: ``<output_root>/uploads/<owner folder>/``.

One definition for the web layer, which stores uploads there (``webapp.uploads``), and for the actors, which
may import from there only for the same owner (``tasks.import_policy``). The owner id becomes a plain folder
name (anything but letters, digits, ``_`` and ``-`` replaced), so no owner id can point outside ``uploads/``.
"""

from __future__ import annotations

import re
from pathlib import Path


def owner_folder(owner_id: str) -> str:
    """*owner_id* as a single, plain folder name."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", owner_id)[:100] or "_"


def uploads_dir(output_root: str | Path, owner_id: str) -> Path:
    """The folder holding *owner_id*'s uploads under *output_root* (not created here)."""
    return Path(output_root) / "uploads" / owner_folder(owner_id)
