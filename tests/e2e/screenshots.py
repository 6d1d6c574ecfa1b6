"""Screenshots for docs/screenshots/, written only when the page's frame changed.

Every run renders other ids, times and counts, and the e2e deployment's data depend on what ran before
and how long it took: a list has 3 or 30 rows, a schedule has fired or not ("No fires recorded yet"
instead of its history table), an audit row has a reason or not. Neither the bytes, nor the height,
nor the element tree of a page is the same from one run to the next. What a run reproduces is the
page's **frame**: :data:`_FRAME_JS` collects the words of its title, navigation links, headings,
legends, labels and buttons (a word with a digit in it masked: counts, ids, times), leaving out those
inside data (table bodies, list items outside navigation, description values, details), as a set.
Its hash is stored in the PNG itself (a ``tEXt`` chunk, :data:`LAYOUT_KEY`); a screenshot replaces
the committed file when the hash or the width differs, so a test run leaves the working tree clean and
a new section, field, button or page link, or a renamed one, is rewritten. ``TENURE_SCREENSHOTS=write``
rewrites every screenshot taken, for what the frame does not capture (a new column, a change of style).
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "docs" / "screenshots"
#: The PNG text chunk's keyword that holds the frame's hash.
LAYOUT_KEY = b"tenure-layout"

_FRAME_JS = """() => {
  const FRAME = "head title, nav a, h1, h2, h3, legend, label, button";
  const DATA = "tbody, li:not(nav li), dd, details";
  // A label's words, not its select's options; a word with a digit is a count, an id or a time
  // ("Save as revision 3", "Job 4f0c…"): not the frame.
  const words = (el) => {
    const own = el.cloneNode(true);
    own.querySelectorAll("select, textarea").forEach((c) => c.remove());
    return own.textContent.replace(/\\S*\\d\\S*/g, "#").replace(/\\s+/g, " ").trim();
  };
  const tokens = [...document.querySelectorAll(FRAME)]
    .filter((el) => !el.closest(DATA))
    .map((el) => el.tagName.toLowerCase() + "[" + words(el) + "]");
  return [...new Set(tokens)].sort().join("\\n");
}"""

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    """The (type, data) chunks of a PNG file."""
    assert png.startswith(_PNG_SIGNATURE), "not a PNG file"
    out, at = [], len(_PNG_SIGNATURE)
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        out.append((png[at + 4 : at + 8], png[at + 8 : at + 8 + length]))
        at += 12 + length
    return out


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def layout_of(png: bytes) -> str | None:
    """The layout hash stored in a screenshot (None for a file written without one)."""
    for kind, data in _chunks(png):
        if kind == b"tEXt" and data.startswith(LAYOUT_KEY + b"\0"):
            return data[len(LAYOUT_KEY) + 1 :].decode("ascii")
    return None


def with_layout(png: bytes, layout: str) -> bytes:
    """*png* with *layout* stored in a text chunk just before its end."""
    body = b"".join(_chunk(kind, data) for kind, data in _chunks(png) if kind != b"IEND")
    return _PNG_SIGNATURE + body + _chunk(b"tEXt", LAYOUT_KEY + b"\0" + layout.encode()) + _chunk(b"IEND", b"")


def png_width(png: bytes) -> int:
    return int(struct.unpack(">I", png[16:20])[0])


def page_layout(page: Any) -> str:
    """A hash of *page*'s frame, leaving out what changes from run to run (see the module's doc)."""
    return hashlib.sha256(page.evaluate(_FRAME_JS).encode()).hexdigest()[:32]


def save(page: Any, name: str, **options: Any) -> None:
    """Screenshot *page* as ``docs/screenshots/<name>.png`` if it is new or its frame or width changed."""
    layout = page_layout(page)
    png = page.screenshot(**options)
    path = SHOTS / f"{name}.png"
    if path.exists() and os.environ.get("TENURE_SCREENSHOTS") != "write":
        old = path.read_bytes()
        if layout_of(old) == layout and png_width(old) == png_width(png):
            return
    SHOTS.mkdir(parents=True, exist_ok=True)
    path.write_bytes(with_layout(png, layout))
