"""The demo recording generator: recorder naming, faults on demand, speech fallback without espeak-ng."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.domain import demo_recording
from tasks.domain.demo_recording import DemoRecording, make_recording
from tasks.domain.recording.names import parse_segment_name
from tasks.domain.recording.probe import probe_media


def test_generated_folder_looks_like_a_recorder_folder(recording: DemoRecording) -> None:
    names = sorted(p.name for p in recording.folder.iterdir())
    assert len(names) == 6
    for seg in recording.segments:
        name = parse_segment_name(seg.flv)
        assert name is not None and name.room_id == recording.room_id and name.started_at == seg.started_at
        assert seg.xml.with_suffix(".flv") == seg.flv
    assert [s.truncated for s in recording.segments] == [False, True, False]
    assert [s.xml_malformed for s in recording.segments] == [False, False, True]
    assert not recording.segments[2].xml.read_text(encoding="utf-8").rstrip().endswith("</i>")


def test_bundled_speech_is_used_without_espeak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo_recording, "espeak_available", lambda: False)
    made = make_recording(tmp_path / "rec", segments=1, seconds=3.0)
    [seg] = made.segments
    assert seg.speech_text is None  # the bundled sample's text is not per segment
    probe = probe_media(seg.flv)
    assert probe.has_audio and probe.duration_s == pytest.approx(3.0, abs=0.1)
    assert demo_recording.BUNDLED_SPEECH.stat().st_size < 300_000
