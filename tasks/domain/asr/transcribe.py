"""Transcribe a segment (or a time range of it) into timestamped segments and SRT text.

faster-whisper yields segments lazily while it decodes, so progress is reported per decoded
segment (``end / duration``) and cancellation is checked between segments: a cancel takes effect
within one segment.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..control import Cancelled, Progress, ShouldStop, clamp_fraction, never_stop, no_progress, raise_if_stopped
from ..media.subtitles import Cue, to_srt
from .audio import SAMPLE_RATE, load_audio
from .model import MODELS, ModelConfig

if TYPE_CHECKING:
    from faster_whisper import WhisperModel


class TranscriptionCancelled(Cancelled):
    """Transcription was cancelled between two segments."""

    def __init__(self, message: str, segments_done: int) -> None:
        super().__init__(message)
        self.segments_done = segments_done


@dataclass(frozen=True)
class TranscriptSegment:
    """One recognised span, in seconds of the source file's timeline."""

    start_s: float
    end_s: float
    text: str
    avg_logprob: float
    no_speech_prob: float


@dataclass(frozen=True)
class Transcript:
    """The result of :func:`transcribe`."""

    source: Path
    start_s: float
    end_s: float
    language: str
    segments: tuple[TranscriptSegment, ...]
    elapsed_s: float

    @property
    def text(self) -> str:
        """All segment texts joined by spaces."""
        return " ".join(s.text for s in self.segments).strip()

    def cues(self, offset_s: float = 0.0) -> list[Cue]:
        """Subtitle cues, shifted by ``offset_s`` (e.g. the segment's offset on the session timeline)."""
        return [Cue(s.start_s + offset_s, s.end_s + offset_s, s.text) for s in self.segments]

    def srt(self) -> str:
        """SRT text on the source file's timeline."""
        return to_srt(self.cues())


def transcribe(
    audio_path: Path,
    *,
    start_s: float = 0.0,
    end_s: float | None = None,
    model_config: ModelConfig = ModelConfig(),  # noqa: B008 - frozen default
    model: WhisperModel | None = None,
    language: str | None = "en",
    beam_size: int = 1,
    vad_filter: bool = True,
    progress: Progress = no_progress,
    should_stop: ShouldStop = never_stop,
) -> Transcript:
    """Transcribe a file, or ``[start_s, end_s)`` of it.

    Parameters
    ----------
    audio_path:
        Any container PyAV reads (a recorder's FLV works directly).
    start_s, end_s:
        The range; timestamps in the result are on the file's timeline (``start_s`` added back).
    model_config:
        Which model; loaded once per process through :data:`~tasks.domain.asr.model.MODELS`.
    model:
        An already loaded ``WhisperModel`` (overrides ``model_config``).
    language:
        Spoken language (tiny.en only knows ``"en"``); None lets Whisper detect it.
    beam_size, vad_filter:
        Decoding options (beam 1 + Silero VAD: RTF ≈ 0.03 on 2 cores for tiny.en).
    progress, should_stop:
        Progress per decoded segment; cancellation checked between segments.

    Returns
    -------
    Transcript

    Raises
    ------
    TranscriptionCancelled
        ``should_stop()`` became true (carries how many segments were done).
    tasks.domain.asr.model.ModelUnavailable
        The configured model cannot be loaded offline.
    tasks.domain.asr.audio.NoAudio
        The file has no audio.
    """
    started = time.monotonic()
    raise_if_stopped(should_stop, "transcription")
    samples = load_audio(audio_path, start_s, end_s)
    duration = len(samples) / SAMPLE_RATE
    whisper = model if model is not None else MODELS.get(model_config)
    progress(0.0, f"transcribing {duration:.1f} s")
    pieces, info = whisper.transcribe(samples, language=language, beam_size=beam_size, vad_filter=vad_filter)
    segments: list[TranscriptSegment] = []
    for piece in pieces:  # a generator: each step decodes more audio
        # faster-whisper gives numpy floats; plain floats keep the result JSON-serialisable.
        segments.append(
            TranscriptSegment(
                start_s=float(piece.start) + start_s,
                end_s=float(piece.end) + start_s,
                text=piece.text.strip(),
                avg_logprob=float(piece.avg_logprob),
                no_speech_prob=float(piece.no_speech_prob),
            )
        )
        if duration:
            progress(clamp_fraction(float(piece.end) / duration), f"{len(segments)} segments, {float(piece.end):.1f} s")
        if should_stop():
            raise TranscriptionCancelled(f"transcription cancelled after {len(segments)} segments", len(segments))
    progress(1.0, f"transcribed {len(segments)} segments")
    return Transcript(
        source=audio_path,
        start_s=start_s,
        end_s=start_s + duration,
        language=info.language,
        segments=tuple(segments),
        elapsed_s=time.monotonic() - started,
    )
