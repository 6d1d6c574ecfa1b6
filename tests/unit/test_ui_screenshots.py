"""docs/ui.md shows every page it lists, at desktop width and at 390 px, from screenshots the browser tests write.

Read off the files, no browser: each page of the "Pages" table has a row in the "Screenshots" table with at
least one screenshot per path it lists in each column; every referenced file exists and has its column's width
(1280 px, or 390 px for the ``mobile-`` ones) and carries its layout hash (tests/e2e/screenshots.py); every file
in docs/screenshots is referenced; and every one is written by a test in tests/e2e (its name appears there), so
a test run regenerates it.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

from tests.e2e import screenshots

ROOT = Path(__file__).resolve().parents[2]
UI_MD = ROOT / "docs" / "ui.md"
SHOTS = ROOT / "docs" / "screenshots"
E2E = ROOT / "tests" / "e2e"
DESKTOP_WIDTH, MOBILE_WIDTH = 1280, 390
IMAGE = re.compile(r"!\[[^\]]*\]\(screenshots/([^)]+\.png)\)")


def _table(text: str, heading: str) -> list[list[str]]:
    """The cells of the first table after ``## <heading>`` (header and separator rows left out)."""
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def _pages(text: str) -> dict[str, int]:
    """Page name → how many paths the Pages table lists for it."""
    found = {}
    for cells in _table(text, "Pages"):
        name = cells[0].split("`", 1)[0].replace("**", "").strip()
        found[name] = len([p for p in re.findall(r"`([^`]+)`", cells[0]) if p.startswith("/")])
    return found


def png_width(path: Path) -> int:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">I", header[16:20])[0]


def problems(text: str, shots: Path, e2e_sources: str) -> list[str]:
    """What is wrong with the screenshots of *text* (docs/ui.md) and the files in *shots*."""
    found: list[str] = []
    pages = _pages(text)
    rows = {cells[0]: cells[1:] for cells in _table(text, "Screenshots")}
    for page, paths in pages.items():
        if page not in rows:
            found.append(f"{page}: no screenshots")
            continue
        for column, width in zip(rows[page], (DESKTOP_WIDTH, MOBILE_WIDTH), strict=True):
            names = IMAGE.findall(column)
            if len(names) < max(1, paths):
                found.append(f"{page}: {len(names)} screenshot(s) at {width} px for {paths} path(s)")
            for name in names:
                if name.startswith("mobile-") != (width == MOBILE_WIDTH):
                    found.append(f"{name}: in the {width} px column")
                if not (shots / name).exists():
                    found.append(f"{name}: missing")
                elif png_width(shots / name) != width:
                    found.append(f"{name}: {png_width(shots / name)} px wide, not {width}")
                elif screenshots.layout_of((shots / name).read_bytes()) is None:
                    found.append(f"{name}: no layout hash (a test run would rewrite it)")
    found += [f"{row}: not a page of the Pages table" for row in rows if row not in pages]
    referenced = set(IMAGE.findall(text))
    found += [f"{p.name}: not referenced" for p in sorted(shots.glob("*.png")) if p.name not in referenced]
    found += [
        f"{name}: written by no browser test" for name in sorted(referenced) if f'"{name[:-4]}"' not in e2e_sources
    ]
    return found


def _without_text_chunks(png: bytes) -> bytes:
    """*png* as a file written before screenshots carried their layout."""
    out, at = [png[:8]], 8
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        if png[at + 4 : at + 8] != b"tEXt":
            out.append(png[at : at + 12 + length])
        at += 12 + length
    return b"".join(out)


def _e2e_sources() -> str:
    return "\n".join(p.read_text() for p in sorted(E2E.rglob("*.py")))


def test_every_page_has_its_screenshots_and_every_screenshot_is_shown() -> None:
    assert problems(UI_MD.read_text(), SHOTS, _e2e_sources()) == []


def test_the_check_finds_what_is_wrong(tmp_path: Path) -> None:
    """A page without its row, a screenshot left out, a stray file, a wrong width: each is reported."""
    text = UI_MD.read_text()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    for png in SHOTS.glob("*.png"):
        (shots / png.name).write_bytes(png.read_bytes())
    assert problems(text, shots, _e2e_sources()) == []
    (shots / "stray.png").write_bytes((SHOTS / "login.png").read_bytes())
    (shots / "mobile-tokens.png").write_bytes((SHOTS / "tokens.png").read_bytes())
    (shots / "jobs.png").write_bytes(_without_text_chunks((SHOTS / "jobs.png").read_bytes()))
    doctored = re.sub(r"\n\| Workers \|[^\n]*", "", text).replace(
        " ![mobile submit](screenshots/mobile-submit.png)", ""
    )
    assert problems(doctored, shots, _e2e_sources().replace('"mobile-login"', '"mobile-l0gin"')) == [
        "jobs.png: no layout hash (a test run would rewrite it)",
        "Submit: 1 screenshot(s) at 390 px for 2 path(s)",
        "Workers: no screenshots",
        "mobile-tokens.png: 1280 px wide, not 390",
        "mobile-submit.png: not referenced",
        "mobile-workers.png: not referenced",
        "ops-workers.png: not referenced",
        "stray.png: not referenced",
        "mobile-login.png: written by no browser test",
    ]
