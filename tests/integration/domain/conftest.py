"""Fixtures for the domain tests: a generated recording (the issue-4 fixture) shared per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.domain.demo_recording import DemoRecording, make_recording

#: Segment length of the shared recording; short keeps rendering and ASR fast.
SEGMENT_SECONDS = 6.0


@pytest.fixture(scope="session")
def recording(tmp_path_factory: pytest.TempPathFactory) -> DemoRecording:
    """Three 6 s segments; segment 1 is a truncated FLV, segment 2 has a malformed (cut) XML."""
    folder = tmp_path_factory.mktemp("rec") / "23058-演示主播"
    return make_recording(folder, segments=3, seconds=SEGMENT_SECONDS, truncate_segment=1, malformed_xml=2)


def write(path: Path, text: str) -> Path:
    """Write UTF-8 text and return the path (test helper)."""
    path.write_text(text, encoding="utf-8")
    return path
