"""Probing helpers for the render tests (PyAV + numpy)."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np


def probe(path: Path) -> tuple[float, int, bool]:
    """``(duration_s, decoded_video_frames, has_audio)``: decoding every frame proves the file plays."""
    with av.open(str(path)) as container:
        duration = container.duration / av.time_base
        frames = sum(1 for _ in container.decode(video=0))
        return duration, frames, bool(container.streams.audio)


def frame_at(path: Path, t: float) -> np.ndarray:
    """The first decoded video frame at or after ``t`` seconds, as an RGB array."""
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            if frame.time is not None and frame.time >= t:
                return frame.to_ndarray(format="rgb24").astype(np.int16)
    raise AssertionError(f"{path.name} has no frame at {t} s")


def region_diff(a: np.ndarray, b: np.ndarray, rows: slice) -> float:
    """Mean absolute pixel difference of two frames over a band of rows."""
    return float(np.abs(a[rows] - b[rows]).mean())
