"""The recording pipeline's domain steps chained by hand: import → ASR per segment → highlight render."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.domain.asr.transcribe import transcribe
from tasks.domain.demo_recording import DemoRecording
from tasks.domain.media.render import RenderOptions, render_clip
from tasks.domain.recording.importer import import_recording

from .media_helpers import probe


def test_import_transcribe_render_highlight(recording: DemoRecording, tmp_path: Path) -> None:
    # Given the imported recording and a transcript of every segment on the session timeline
    session = import_recording(recording.folder)
    cues = []
    for segment in session.segments:
        cues += transcribe(segment.path).cues(offset_s=segment.offset_s)
    assert len(cues) >= len(session.segments)  # every segment has speech
    assert all(session.segments[0].offset_s <= c.start_s < session.duration_s for c in cues)

    # When a highlight spanning all three segments is rendered with subtitles, danmaku and a thumbnail
    start, end = 3.0, session.segments[2].offset_s + 2.0
    result = render_clip(
        session.segments,
        start,
        end,
        tmp_path / "1-highlight.mp4",
        thumbnail=tmp_path / "1-highlight.jpg",
        subtitles=cues,
        danmaku=True,
        options=RenderOptions(width=640, height=360),
    )

    # Then the clip has the requested length and carries both overlays
    duration, _, has_audio = probe(result.output)
    assert duration == pytest.approx(end - start, abs=0.1) and has_audio
    assert result.subtitle_cues >= 2 and result.danmaku_comments > 10
    assert result.thumbnail is not None and result.thumbnail.exists()
