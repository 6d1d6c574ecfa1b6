"""Decode audio for ASR: any container PyAV reads → 16 kHz mono float32, optionally a time range only.

Seeking keeps memory proportional to the range, not the file (an hour of 16 kHz float32 is 230 MB).
Raw samples, never WAV through a pipe (ffmpeg's piped WAV header carries a bogus length).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ..control import DomainError

if TYPE_CHECKING:
    import av
    import numpy as np

#: Whisper's input rate.
SAMPLE_RATE = 16_000


class NoAudio(DomainError):
    """The file has no audio stream."""


def load_audio(path: Path, start_s: float = 0.0, end_s: float | None = None) -> np.ndarray:
    """Decode ``[start_s, end_s)`` of a file's first audio stream.

    Parameters
    ----------
    path:
        Media file (FLV, MP4, OGG, WAV …).
    start_s, end_s:
        The range in seconds of the file's timeline; ``end_s`` None means to the end.

    Returns
    -------
    numpy.ndarray
        float32 mono samples at :data:`SAMPLE_RATE`.

    Raises
    ------
    NoAudio
        The file has no audio stream.
    """
    # PyAV and numpy take ~0.3 s to import: loaded where audio is decoded, so that the processes that
    # compose the tasks without decoding (web, scheduler, other roles' workers) never pay for them.
    import av
    import numpy as np

    with av.open(str(path)) as container:
        if not container.streams.audio:
            raise NoAudio(f"{path.name}: no audio stream")
        stream = container.streams.audio[0]
        first_pts = stream.start_time if stream.start_time is not None else 0
        origin = float(first_pts * stream.time_base) if stream.time_base else 0.0
        if start_s > 0:
            container.seek(int((origin + start_s) / stream.time_base), stream=stream, backward=True)
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        chunks: list[np.ndarray] = []
        begin: float | None = None  # file time of chunks[0][0]
        for frame in _frames(container, stream):
            if begin is None:
                begin = (frame.time or origin) - origin
            for out in resampler.resample(frame):
                chunks.append(out.to_ndarray().reshape(-1))
            if end_s is not None and frame.time is not None and frame.time - origin > end_s:
                break
        for out in resampler.resample(None):
            chunks.append(out.to_ndarray().reshape(-1))
    samples = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
    begin = begin or 0.0
    lo = max(0, round((start_s - begin) * SAMPLE_RATE))
    hi = None if end_s is None else max(lo, round((end_s - begin) * SAMPLE_RATE))
    return np.ascontiguousarray(samples[lo:hi], dtype=np.float32)


def _frames(container, stream) -> Iterator[av.AudioFrame]:
    """Decoded frames, skipping packets that do not decode (a crashed recorder cuts the last one short)."""
    import av

    for packet in container.demux(stream):
        try:
            yield from packet.decode()
        except av.error.InvalidDataError:
            continue
