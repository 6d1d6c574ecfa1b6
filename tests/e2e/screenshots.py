"""Screenshots for docs/screenshots/, written only when the page's layout changed.

Every run renders other ids, times and counts, and the e2e deployment's lists grow with whatever ran
before and how long it took (a schedule's fires, the jobs a test made), so neither the bytes nor the
height of a page are the same from one run to the next. What a run can reproduce is the page's
**layout**: :data:`_LAYOUT_JS` reduces the page to its elements' tag names and ids, the words of its
headings, labels, column heads, buttons and navigation links (a word or id part with a digit in it
masked: counts, ids and times), and for each element the *set* of its children's shapes (a list of 3
or 30 rows of the same shape is one shape; a chart's SVG is one shape, whatever it draws). Its hash is
stored in the PNG itself (a ``tEXt`` chunk, :data:`LAYOUT_KEY`); a screenshot replaces the committed
file when the hash or the width differs, so a test run leaves the working tree clean and a changed page
(a new section, a renamed button, a new column) is rewritten. ``TENURE_SCREENSHOTS=write`` rewrites every
screenshot taken (a change of style alone, such as a colour, changes no layout).
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
#: The PNG text chunk's keyword that holds the layout's hash.
LAYOUT_KEY = b"tenure-layout"

_LAYOUT_JS = """() => {
  const WORDS = new Set(["H1", "H2", "H3", "TH", "LABEL", "BUTTON", "LEGEND", "TITLE"]);
  // A word with a digit is a count, an id or a time ("Save as revision 3", "Job 4f0c…"): not layout.
  const words = (el) => WORDS.has(el.tagName) || (el.tagName === "A" && el.closest("nav"))
    ? "[" + el.textContent.replace(/\\S*\\d\\S*/g, "#").replace(/\\s+/g, " ").trim() + "]" : "";
  const shape = (el) => {
    // A chart's marks are its data (one bucket draws points, two a line): the chart is one shape.
    const kids = el.tagName === "svg" ? [] : [...new Set([...el.children].map(shape))].sort();
    // Ids of rows carry the row's id ("job-4f0c…", "dead-17"): the same masking as the words.
    const id = el.id ? "#" + el.id.replace(/[^-_]*\\d[^-_]*/g, "~") : "";
    return el.tagName.toLowerCase() + id + words(el)
      + (kids.length ? "(" + kids.join(",") + ")" : "");
  };
  return shape(document.documentElement);
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
    """A hash of what *page* shows, leaving out what changes from run to run (see the module's doc)."""
    return hashlib.sha256(page.evaluate(_LAYOUT_JS).encode()).hexdigest()[:32]


def save(page: Any, name: str, **options: Any) -> None:
    """Screenshot *page* as ``docs/screenshots/<name>.png`` if it is new or its layout or width changed."""
    layout = page_layout(page)
    png = page.screenshot(**options)
    path = SHOTS / f"{name}.png"
    if path.exists() and os.environ.get("TENURE_SCREENSHOTS") != "write":
        old = path.read_bytes()
        if layout_of(old) == layout and png_width(old) == png_width(png):
            return
    SHOTS.mkdir(parents=True, exist_ok=True)
    path.write_bytes(with_layout(png, layout))
