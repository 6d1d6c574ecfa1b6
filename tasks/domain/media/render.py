"""Render a clip of a session: cut across segment boundaries, burn subtitles and danmaku, make a thumbnail.

One ffmpeg pass: each overlapping segment is an input seeked to its part of the window, normalised
(size, frame rate, sample rate; silence for a segment without audio), concatenated, then overlaid
with the danmaku ASS (from ``biliass``) and the subtitles, and encoded to H.264/AAC MP4. A second,
short pass takes the thumbnail from the finished clip.

Files: everything is written inside a private scratch directory next to the output (same file
system), with fixed names (``subs.srt``, ``danmaku.ass``) so no user file name ever enters a
filtergraph (escaping there takes two levels and is easy to get wrong). Only a complete clip is
published, with a hard link that refuses to overwrite (an earlier attempt's file is never
replaced); the scratch directory is removed whatever happens, so a cancelled or failed render leaves
no partial file behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..control import DomainError, Progress, ShouldStop, never_stop, no_progress, raise_if_stopped
from ..recording.danmaku import DanmakuComment, UnreadableDanmaku, comments_to_xml, parse_danmaku
from .ffmpeg import run_ffmpeg
from .subtitles import Cue, to_srt, window

#: Default subtitle look: a CJK-capable font (Debian fonts-wqy-microhei) with a Latin fallback via fontconfig.
DEFAULT_SUBTITLE_STYLE = "FontName=WenQuanYi Micro Hei,FontSize=20,Outline=2,MarginV=24"
#: Font for the danmaku overlay (passed to biliass).
DEFAULT_DANMAKU_FONT = "WenQuanYi Micro Hei"
#: Share of the progress bar given to the main encode; the thumbnail takes the rest.
ENCODE_SHARE = 0.95


class RenderError(DomainError):
    """The clip cannot be rendered as asked."""


class TimelineSegment(Protocol):
    """What the renderer needs of a segment (``importer.Segment`` fits)."""

    @property
    def path(self) -> Path: ...
    @property
    def offset_s(self) -> float: ...
    @property
    def duration_s(self) -> float: ...
    @property
    def has_audio(self) -> bool: ...


@dataclass(frozen=True)
class RenderOptions:
    """How the clip looks."""

    width: int = 1280
    height: int = 720
    fps: int = 30
    crf: int = 23
    preset: str = "veryfast"
    audio_rate: int = 48_000
    subtitle_style: str = DEFAULT_SUBTITLE_STYLE
    fonts_dir: Path | None = None  # a directory of .ttf/.otf/.ttc to use besides fontconfig's
    danmaku_font: str = DEFAULT_DANMAKU_FONT
    danmaku_font_size: float = 36.0
    thumbnail_width: int = 640
    timeout_s: float | None = 3600.0


@dataclass(frozen=True)
class RenderResult:
    """A published clip (both files exist when this is returned)."""

    output: Path
    thumbnail: Path | None
    duration_s: float  # probed from the written file
    size_bytes: int
    elapsed_s: float
    danmaku_comments: int
    subtitle_cues: int


@dataclass(frozen=True)
class _Piece:
    segment: TimelineSegment
    local_start_s: float
    duration_s: float


def plan_pieces(segments: Sequence[TimelineSegment], start_s: float, end_s: float) -> list[_Piece]:
    """Which part of which segment covers ``[start_s, end_s)`` of the session timeline.

    Parameters
    ----------
    segments:
        The session's segments (any order).
    start_s, end_s:
        The window; must lie within the session.

    Returns
    -------
    list
        Pieces in timeline order.

    Raises
    ------
    RenderError
        An empty window, or one outside the session.
    """
    if not end_s > start_s >= 0:
        raise RenderError(f"empty or negative window {start_s:.3f}-{end_s:.3f} s")
    ordered = sorted(segments, key=lambda s: s.offset_s)
    total = max((s.offset_s + s.duration_s for s in ordered), default=0.0)
    if end_s > total + 1e-3:
        raise RenderError(f"window ends at {end_s:.3f} s but the session is {total:.3f} s long")
    pieces = []
    for seg in ordered:
        lo, hi = max(start_s, seg.offset_s), min(end_s, seg.offset_s + seg.duration_s)
        if hi - lo > 1e-3:
            pieces.append(_Piece(seg, lo - seg.offset_s, hi - lo))
    return pieces


def render_clip(
    segments: Sequence[TimelineSegment],
    start_s: float,
    end_s: float,
    output: Path,
    *,
    thumbnail: Path | None = None,
    subtitles: Sequence[Cue] | None = None,
    danmaku: bool = False,
    options: RenderOptions = RenderOptions(),  # noqa: B008 - frozen, so a shared default is safe
    progress: Progress = no_progress,
    should_stop: ShouldStop = never_stop,
    ffmpeg: str | None = None,
    on_ffmpeg_start: Callable[[int], None] | None = None,
) -> RenderResult:
    """Cut ``[start_s, end_s)`` of a session into an MP4, optionally with subtitles, danmaku and a thumbnail.

    Parameters
    ----------
    segments:
        The session's segments (``path``, ``offset_s``, ``duration_s``, ``has_audio``); each one's
        danmaku is the ``.xml`` next to it.
    start_s, end_s:
        The window on the session timeline (concatenated true durations).
    output:
        Final path of the clip (named per attempt by the job layer); must not exist yet.
    thumbnail:
        Final path of a JPEG thumbnail from the middle of the clip; None for none.
    subtitles:
        Cues on the session timeline (e.g. a transcript); cut to the window and burned in.
    danmaku:
        Burn the segments' danmaku as a scrolling overlay.
    options:
        Size, quality, fonts, timeout.
    progress, should_stop:
        Live progress from ``ffmpeg -progress``; ``should_stop`` is polled ten times a second and
        kills ffmpeg's process group.
    ffmpeg:
        ffmpeg binary (default: see :func:`tasks.domain.media.ffmpeg.ffmpeg_exe`).
    on_ffmpeg_start:
        Optional ``f(pid)`` called when each ffmpeg process starts (for tests and metrics).

    Returns
    -------
    RenderResult

    Raises
    ------
    RenderError
        Bad window, or ``output``/``thumbnail`` already exists.
    tasks.domain.control.Cancelled
        Cancelled; nothing is left at ``output`` or ``thumbnail``.
    tasks.domain.media.ffmpeg.FfmpegError
        ffmpeg failed; nothing is left either.
    """
    started = time.monotonic()
    pieces = plan_pieces(segments, start_s, end_s)
    for final in (output, thumbnail):
        if final is not None and final.exists():
            raise RenderError(f"{final.name} already exists; an attempt never overwrites another's file")
    raise_if_stopped(should_stop, "rendering")
    duration = end_s - start_s
    output.parent.mkdir(parents=True, exist_ok=True)
    scratch = output.parent / f".{output.name}.partial-{uuid.uuid4().hex[:8]}"
    scratch.mkdir()
    try:
        cues = window(subtitles or (), start_s, end_s)
        if cues:
            (scratch / "subs.srt").write_text(to_srt(cues), encoding="utf-8")
        comments = _danmaku_in_window(pieces, start_s) if danmaku else []
        if comments:
            (scratch / "danmaku.ass").write_text(_danmaku_ass(comments, options), encoding="utf-8")
        if options.fonts_dir is not None:
            (scratch / "fonts").symlink_to(options.fonts_dir.resolve(), target_is_directory=True)
        args = _encode_args(pieces, duration, options, subtitles=bool(cues), danmaku=bool(comments))
        run_ffmpeg(
            args,
            duration_s=duration,
            cwd=scratch,
            progress=lambda f, m: progress(f * ENCODE_SHARE, m),
            should_stop=should_stop,
            timeout_s=options.timeout_s,
            ffmpeg=ffmpeg,
            on_start=on_ffmpeg_start,
        )
        if thumbnail is not None:
            raise_if_stopped(should_stop, "thumbnail")
            thumb_args = ["-ss", f"{duration / 2:.3f}", "-i", "clip.mp4", "-frames:v", "1"]
            thumb_args += ["-vf", f"scale={options.thumbnail_width}:-2", "-q:v", "3", "thumb.jpg"]
            run_ffmpeg(thumb_args, duration_s=None, cwd=scratch, should_stop=should_stop, ffmpeg=ffmpeg)
        probed = _probe_duration(scratch / "clip.mp4")
        raise_if_stopped(should_stop, "publishing")
        published = []
        try:
            if thumbnail is not None:
                _publish(scratch / "thumb.jpg", thumbnail)
                published.append(thumbnail)
            _publish(scratch / "clip.mp4", output)
        except BaseException:
            for path in published:
                with contextlib.suppress(OSError):
                    path.unlink()
            raise
        progress(1.0, "rendered")
        return RenderResult(
            output=output,
            thumbnail=thumbnail,
            duration_s=probed,
            size_bytes=output.stat().st_size,
            elapsed_s=time.monotonic() - started,
            danmaku_comments=len(comments),
            subtitle_cues=len(cues),
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _publish(src: Path, final: Path) -> None:
    """Give a finished file its final name without ever replacing an existing file."""
    try:
        os.link(src, final)  # atomic, and fails with FileExistsError instead of overwriting
    except FileExistsError as exc:
        raise RenderError(f"{final.name} already exists; an attempt never overwrites another's file") from exc
    except OSError:
        # A file system without hard links: check-then-rename (the job layer's per-attempt names
        # make a race here practically impossible).
        if final.exists():
            raise RenderError(f"{final.name} already exists; an attempt never overwrites another's file") from None
        os.replace(src, final)


def _encode_args(
    pieces: list[_Piece], duration: float, o: RenderOptions, *, subtitles: bool, danmaku: bool
) -> list[str]:
    args: list[str] = []
    graph: list[str] = []
    streams: list[str] = []
    index = 0
    for n, piece in enumerate(pieces):
        # Absolute: ffmpeg runs in the scratch directory, and a stored path may be relative to the worker's
        # working directory (`make run` imports `var/recordings/...`).
        source = str(piece.segment.path.absolute())
        args += ["-ss", f"{piece.local_start_s:.3f}", "-t", f"{piece.duration_s:.3f}", "-i", source]
        video = index
        index += 1
        if piece.segment.has_audio:
            audio = f"{video}:a:0"
        else:
            # A segment without audio gets silence, so concat sees the same streams everywhere.
            args += ["-f", "lavfi", "-t", f"{piece.duration_s:.3f}", "-i", f"anullsrc=r={o.audio_rate}:cl=stereo"]
            audio = f"{index}:a:0"
            index += 1
        graph.append(
            f"[{video}:v:0]scale={o.width}:{o.height}:force_original_aspect_ratio=decrease,"
            f"pad={o.width}:{o.height}:(ow-iw)/2:(oh-ih)/2,setsar=1,fps={o.fps},format=yuv420p,"
            f"trim=duration={piece.duration_s:.3f},setpts=PTS-STARTPTS[v{n}]"
        )
        graph.append(
            f"[{audio}]aresample={o.audio_rate},aformat=sample_fmts=fltp:channel_layouts=stereo,"
            f"apad=whole_dur={piece.duration_s:.3f},atrim=duration={piece.duration_s:.3f},asetpts=PTS-STARTPTS[a{n}]"
        )
        streams.append(f"[v{n}][a{n}]")
    graph.append(f"{''.join(streams)}concat=n={len(pieces)}:v=1:a=1[vc][aout]")
    overlays = []
    if danmaku:
        overlays.append("ass=danmaku.ass" + (":fontsdir=fonts" if o.fonts_dir else ""))
    if subtitles:
        fonts = ":fontsdir=fonts" if o.fonts_dir else ""
        overlays.append(f"subtitles=subs.srt:charenc=UTF-8{fonts}:force_style='{o.subtitle_style}'")
    graph.append(f"[vc]{','.join(overlays) or 'null'}[vout]")
    args += ["-filter_complex", ";".join(graph), "-map", "[vout]", "-map", "[aout]"]
    args += ["-c:v", "libx264", "-preset", o.preset, "-crf", str(o.crf), "-pix_fmt", "yuv420p"]
    args += ["-c:a", "aac", "-b:a", "128k", "-t", f"{duration:.3f}", "-movflags", "+faststart", "-f", "mp4", "clip.mp4"]
    return args


def _danmaku_in_window(pieces: list[_Piece], start_s: float) -> list[DanmakuComment]:
    """The comments shown during the window, with offsets rebased to the clip's start."""
    out: list[DanmakuComment] = []
    for piece in pieces:
        xml = piece.segment.path.with_suffix(".xml")
        if not xml.is_file():
            continue
        try:
            parsed = parse_danmaku(xml)
        except UnreadableDanmaku:
            continue  # the overlay is decoration; a broken file only loses its comments
        lo, hi = piece.local_start_s, piece.local_start_s + piece.duration_s
        shift = piece.segment.offset_s - start_s
        for c in parsed.comments:
            if lo <= c.offset_s < hi:
                out.append(
                    DanmakuComment(c.offset_s + shift, c.mode, c.size, c.color, c.sent_at_ms, c.uid, c.user, c.text)
                )
    out.sort(key=lambda c: c.offset_s)
    return out


def _danmaku_ass(comments: list[DanmakuComment], o: RenderOptions) -> str:
    import biliass

    # biliass has no recover mode, so it gets our clean re-serialisation, never the recorder's file.
    return biliass.convert_to_ass(
        comments_to_xml(comments),
        o.width,
        o.height,
        font_face=o.danmaku_font,
        font_size=o.danmaku_font_size,
        duration_marquee=6.0,
    )


def _probe_duration(path: Path) -> float:
    import av  # ~0.15 s to import: only where media is read (see tasks.domain.asr.audio.load_audio)

    with av.open(str(path)) as container:
        if not container.duration:
            raise RenderError("rendered clip has no duration")
        return container.duration / av.time_base
