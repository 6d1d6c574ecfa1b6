"""Subtitle cues and SRT text: written by ASR, cut to a clip's window by the renderer."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Cue:
    """One subtitle: shown from ``start_s`` to ``end_s`` (seconds)."""

    start_s: float
    end_s: float
    text: str


def srt_timestamp(seconds: float) -> str:
    """Format seconds as SRT's ``HH:MM:SS,mmm``.

    Parameters
    ----------
    seconds:
        A non-negative time.

    Returns
    -------
    str
    """
    ms = max(0, round(seconds * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d},{ms:03d}"


def to_srt(cues: Iterable[Cue]) -> str:
    """Render cues as SRT text (1-based numbering, blank line between cues).

    Parameters
    ----------
    cues:
        Cues in display order; empty texts are skipped.

    Returns
    -------
    str
    """
    blocks = []
    for cue in cues:
        text = cue.text.strip()
        if not text or cue.end_s <= cue.start_s:
            continue
        blocks.append(f"{len(blocks) + 1}\n{srt_timestamp(cue.start_s)} --> {srt_timestamp(cue.end_s)}\n{text}\n")
    return "\n".join(blocks)


_SRT_TIME = re.compile(r"(\d+):(\d{2}):(\d{2})[,.](\d{3})")


def parse_srt(text: str) -> list[Cue]:
    """Parse SRT text into cues (lenient: skips blocks without a valid time line).

    Parameters
    ----------
    text:
        SRT content.

    Returns
    -------
    list[Cue]
    """
    cues = []
    for block in re.split(r"\r?\n\s*\r?\n", text.strip()):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if "-->" in line:
                left, _, right = line.partition("-->")
                start, end = _SRT_TIME.search(left), _SRT_TIME.search(right)
                if start and end:
                    cues.append(Cue(_seconds(start), _seconds(end), "\n".join(lines[i + 1 :]).strip()))
                break
    return cues


def _seconds(match: re.Match[str]) -> float:
    h, m, s, ms = (int(g) for g in match.groups())
    return h * 3600 + m * 60 + s + ms / 1000


def window(cues: Iterable[Cue], start_s: float, end_s: float) -> list[Cue]:
    """Cues overlapping ``[start_s, end_s)``, clipped to it and rebased so ``start_s`` becomes 0.

    Parameters
    ----------
    cues:
        Cues on the session timeline.
    start_s, end_s:
        The clip's window on that timeline.

    Returns
    -------
    list[Cue]
        Cues on the clip's timeline.
    """
    out = []
    for cue in cues:
        if cue.end_s <= start_s or cue.start_s >= end_s:
            continue
        out.append(Cue(max(cue.start_s, start_s) - start_s, min(cue.end_s, end_s) - start_s, cue.text))
    return out
