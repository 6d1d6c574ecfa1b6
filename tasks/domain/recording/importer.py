"""Import a recording folder (or a list of uploaded files) into one session of segments.

A session is the recorder's segments of one room, ordered by their start time. Its timeline is the
*concatenation* of the segments' true durations (``Segment.offset_s``): that is what a clip cutter
and a player see; wall-clock gaps between segments (a reconnect) are kept in ``started_at`` only.
Truncated segments are kept with their real duration and a warning; a segment that cannot be read
at all fails the import with the file named. A malformed danmaku XML is kept as far as it parses,
with a warning; a hostile one (entities) fails the import.

Re-importing the same folder gives the same :attr:`RecordingSession.key` (room + first segment
start), so the job layer can upsert the session idempotently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

from ..control import DomainError, Progress, ShouldStop, never_stop, no_progress, raise_if_stopped
from .danmaku import DanmakuStats, UnreadableDanmaku, parse_danmaku
from .names import MEDIA_SUFFIXES, parse_segment_name
from .probe import SegmentStatus, UnreadableMedia, probe_media


class RecordingError(DomainError):
    """The recording cannot be imported."""


class UnreadableSegment(RecordingError):
    """A segment file cannot be read; the message names it."""


@dataclass(frozen=True)
class ImportWarning:
    """Something imported with a problem (shown to the user, stored as a job event)."""

    file: str
    kind: Literal["truncated_segment", "malformed_danmaku", "missing_danmaku", "ignored_file"]
    message: str


@dataclass(frozen=True)
class SegmentDanmaku:
    """The danmaku file that goes with a segment."""

    path: Path
    stats: DanmakuStats
    malformed: bool
    error_count: int


@dataclass(frozen=True)
class Segment:
    """One imported segment."""

    index: int
    path: Path
    started_at: datetime  # wall clock, from the file name
    offset_s: float  # start on the session timeline (sum of the previous true durations)
    duration_s: float  # true duration (demux scan)
    header_duration_s: float | None
    status: SegmentStatus
    has_video: bool
    has_audio: bool
    width: int | None
    height: int | None
    danmaku: SegmentDanmaku | None

    @property
    def end_s(self) -> float:
        """End on the session timeline."""
        return self.offset_s + self.duration_s


@dataclass(frozen=True)
class RecordingSession:
    """An imported recording: one room's segments and their danmaku."""

    key: str  # stable identity for idempotent re-import
    room_id: int
    title: str
    started_at: datetime
    duration_s: float
    segments: tuple[Segment, ...]
    danmaku: DanmakuStats  # summed over segments
    warnings: tuple[ImportWarning, ...]


def find_segment_files(folder: Path) -> tuple[list[Path], list[Path]]:
    """Split a folder's files into recorder segments and other media.

    Parameters
    ----------
    folder:
        The recording folder (not searched recursively).

    Returns
    -------
    tuple
        ``(segments, ignored)``: media files named by the recorder's template, sorted by start
        time, and media files that are not.

    Raises
    ------
    RecordingError
        When ``folder`` is not a directory.
    """
    if not folder.is_dir():
        raise RecordingError(f"{folder.name or folder}: not a directory")
    media = [p for p in folder.iterdir() if p.suffix.lower() in MEDIA_SUFFIXES and p.is_file()]
    named = [p for p in media if parse_segment_name(p) is not None]
    ignored = sorted(set(media) - set(named))
    named.sort(key=lambda p: (parse_segment_name(p).started_at, p.name))  # type: ignore[union-attr]
    return named, ignored


def import_recording(
    source: Path | Sequence[Path],
    *,
    progress: Progress = no_progress,
    should_stop: ShouldStop = never_stop,
) -> RecordingSession:
    """Probe every segment and parse its danmaku.

    Parameters
    ----------
    source:
        A recording folder, or the segment files themselves (an upload); each segment's danmaku is
        the ``.xml`` with the same base name, when present.
    progress, should_stop:
        Progress is reported once per segment; cancellation is checked before each one.

    Returns
    -------
    RecordingSession

    Raises
    ------
    RecordingError
        No segments, or segments of several rooms.
    UnreadableSegment
        A segment cannot be read (the message names the file).
    tasks.domain.recording.danmaku.HostileXml
        A danmaku file tries entity expansion.
    tasks.domain.control.Cancelled
        ``should_stop()`` became true.
    """
    warnings: list[ImportWarning] = []
    if isinstance(source, Path):
        files, ignored = find_segment_files(source)
        warnings += [ImportWarning(p.name, "ignored_file", "not named like a recorder segment") for p in ignored]
    else:
        files = sorted(source, key=lambda p: (_name(p).started_at, p.name))
    if not files:
        raise RecordingError("no recorder segments found (expected 录制-{room}-{yyyyMMdd-HHmmss-fff}-{title}.flv)")
    names = [_name(p) for p in files]
    rooms = sorted({n.room_id for n in names})
    if len(rooms) > 1:
        raise RecordingError(f"segments of several rooms in one import: {', '.join(map(str, rooms))}")

    segments: list[Segment] = []
    total = DanmakuStats()
    offset = 0.0
    for index, (path, name) in enumerate(zip(files, names, strict=True)):
        raise_if_stopped(should_stop, f"segment {path.name}")
        try:
            probe = probe_media(path)
        except UnreadableMedia as exc:
            raise UnreadableSegment(str(exc)) from exc
        if probe.status == "truncated":
            warnings.append(
                ImportWarning(path.name, "truncated_segment", f"{probe.problem}; imported as {probe.duration_s:.2f} s")
            )
        danmaku = _danmaku(path, warnings)
        if danmaku is not None:
            total = total + danmaku.stats
        segments.append(
            Segment(
                index=index,
                path=path,
                started_at=name.started_at,
                offset_s=offset,
                duration_s=probe.duration_s,
                header_duration_s=probe.header_duration_s,
                status=probe.status,
                has_video=probe.has_video,
                has_audio=probe.has_audio,
                width=probe.width,
                height=probe.height,
                danmaku=danmaku,
            )
        )
        offset += probe.duration_s
        progress((index + 1) / len(files), f"imported {path.name} ({probe.duration_s:.1f} s)")
    first = names[0]
    return RecordingSession(
        key=f"bililive:{first.room_id}:{first.started_at.isoformat(timespec='milliseconds')}",
        room_id=first.room_id,
        title=first.title,
        started_at=first.started_at,
        duration_s=offset,
        segments=tuple(segments),
        danmaku=total,
        warnings=tuple(warnings),
    )


def _name(path: Path):
    name = parse_segment_name(path)
    if name is None:
        raise RecordingError(f"{path.name}: not named like a recorder segment")
    return name


def _danmaku(segment: Path, warnings: list[ImportWarning]) -> SegmentDanmaku | None:
    xml = segment.with_suffix(".xml")
    if not xml.is_file():
        warnings.append(ImportWarning(segment.name, "missing_danmaku", "no matching .xml danmaku file"))
        return None
    try:
        parsed = parse_danmaku(xml, keep_comments=False)
    except UnreadableDanmaku as exc:
        warnings.append(ImportWarning(xml.name, "malformed_danmaku", str(exc)))
        return None
    if parsed.malformed:
        first = parsed.errors[0] if parsed.errors else "parse errors"
        warnings.append(
            ImportWarning(
                xml.name,
                "malformed_danmaku",
                f"{parsed.error_count} parse errors (first: {first}); kept {parsed.stats.comments} comments",
            )
        )
    return SegmentDanmaku(xml, parsed.stats, parsed.malformed, parsed.error_count)
