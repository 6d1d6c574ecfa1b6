"""The screenshots' frame hash (tests/e2e/screenshots.py) in a real Chromium: what a run changes by
itself (rows, their variants, ids, counts, times, an empty history instead of a table, a chart's marks)
leaves it alone; what a person changes (a section, a field, a button's or a page link's name) moves it;
a screenshot is written only when it moves, and carries it in a valid PNG."""

from __future__ import annotations

import base64
import struct
import zlib
from pathlib import Path

import pytest

from . import screenshots

pytestmark = [pytest.mark.e2e]

PAGE = """<!doctype html><html><head><title>Jobs · Tenure</title></head><body>
<nav><a href="/jobs">Jobs</a> <a href="/ops">Operations</a></nav>
<main><h1>Jobs</h1>{extra}
<table><thead><tr><th>Job</th><th>Status</th></tr></thead><tbody>{rows}</tbody></table>
<button id="save">Save as revision {revision}</button></main></body></html>"""


def _rows(n: int, salt: str) -> str:
    return "".join(
        f'<tr id="job-{salt}{i:04x}"><td><a href="/jobs/{salt}{i}">{salt}{i:04x}</a></td>'
        f'<td><span class="badge">{"failed" if i % 3 else "succeeded"}</span> {i} s ago</td></tr>'
        for i in range(n)
    )


def _layout(page, **parts: object) -> str:  # type: ignore[no-untyped-def]
    fields = {"extra": "", "rows": _rows(3, "a1"), "revision": 1, **parts}
    page.set_content(PAGE.format(**fields))
    return screenshots.page_layout(page)


def test_what_a_run_changes_by_itself_keeps_the_frame_and_what_a_person_changes_moves_it(browser) -> None:  # type: ignore[no-untyped-def]
    page = browser.new_page()
    base = _layout(page)
    # Given a run's own differences: more rows and other row variants, other ids, counts and times,
    # a chart's marks, an empty history in place of a table
    assert _layout(page, rows=_rows(30, "9f")) == base
    assert (
        _layout(
            page,
            rows=_rows(3, "a1").replace(
                "</td></tr>", ' <small class="reason">busy</small><button>Replay</button></td></tr>'
            ),
        )
        == base
    )
    assert _layout(page, revision=17) == base
    with_points = _layout(page, extra='<svg><circle r="2"><title>3 jobs</title></circle></svg>')
    assert _layout(page, extra='<svg><polyline points="0,0 4,4"/><rect width="2"/></svg>') == with_points
    assert _layout(page, extra="<dl><dt>Next fire</dt><dd><time>in 3 s</time></dd></dl>") == _layout(
        page, extra="<dl><dt>Next fire</dt><dd>none while paused</dd></dl>"
    )
    # When a person changes the page, then the frame moves
    assert _layout(page, extra="<h2>Admission</h2><p>Fair share is on.</p>") != base
    assert _layout(page, extra="<label>Owner <input name=owner></label>") != base
    assert _layout(page, extra="<label>Queue <select><option>a</option></select></label>") != base
    page.set_content(PAGE.format(extra="", rows=_rows(3, "a1"), revision=1).replace(">Save as", ">Keep as"))
    assert screenshots.page_layout(page) != base
    page.set_content(
        PAGE.format(extra="", rows=_rows(3, "a1"), revision=1).replace("</nav>", ' <a href="/audit">Audit</a></nav>')
    )
    assert screenshots.page_layout(page) != base
    page.close()


def test_a_screenshot_is_written_only_when_its_frame_or_width_changed(browser, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(screenshots, "SHOTS", tmp_path)
    monkeypatch.delenv("TENURE_SCREENSHOTS", raising=False)
    page = browser.new_page(viewport={"width": 390, "height": 600})
    shot = tmp_path / "jobs.png"
    page.set_content(PAGE.format(extra="", rows=_rows(3, "a1"), revision=1))
    screenshots.save(page, "jobs", full_page=True)
    first = shot.read_bytes()
    assert screenshots.layout_of(first) == screenshots.page_layout(page)
    # The file is a PNG whose every chunk's CRC holds, and Chromium shows it at its size
    at = 8
    while at < len(first):
        (length,) = struct.unpack(">I", first[at : at + 4])
        kind, data = first[at + 4 : at + 8], first[at + 8 : at + 8 + length]
        assert struct.unpack(">I", first[at + 8 + length : at + 12 + length])[0] == zlib.crc32(kind + data)
        at += 12 + length
    assert kind == b"IEND"
    probe = browser.new_page()
    probe.set_content(f'<img id="shot" src="data:image/png;base64,{base64.b64encode(first).decode()}">')
    probe.wait_for_function("document.getElementById('shot').complete")
    assert probe.evaluate("document.getElementById('shot').naturalWidth") == 390
    probe.close()
    # A longer list: the committed file stays as it was
    page.set_content(PAGE.format(extra="", rows=_rows(40, "7e"), revision=9))
    screenshots.save(page, "jobs", full_page=True)
    assert shot.read_bytes() == first
    # A new section: rewritten
    page.set_content(PAGE.format(extra="<h2>Admission</h2>", rows=_rows(3, "a1"), revision=1))
    screenshots.save(page, "jobs", full_page=True)
    assert shot.read_bytes() != first
    assert screenshots.layout_of(shot.read_bytes()) == screenshots.page_layout(page)
    # TENURE_SCREENSHOTS=write rewrites even an unchanged layout
    second = shot.read_bytes()
    page.set_content(PAGE.format(extra="<h2>Admission</h2>", rows=_rows(30, "b2"), revision=1))
    monkeypatch.setenv("TENURE_SCREENSHOTS", "write")
    screenshots.save(page, "jobs", full_page=True)
    assert shot.read_bytes() != second
    page.close()
