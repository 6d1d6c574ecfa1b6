"""Render clips from the generated recording: length, subtitles burned, CJK glyphs, thumbnail, cancellation."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.domain.control import Cancelled
from tasks.domain.demo_recording import DemoRecording
from tasks.domain.media.ffmpeg import FfmpegError, parse_progress_time_s
from tasks.domain.media.render import RenderError, RenderOptions, plan_pieces, render_clip
from tasks.domain.media.subtitles import Cue, parse_srt, to_srt, window
from tasks.domain.recording.importer import RecordingSession, import_recording

from .media_helpers import frame_at, probe, region_diff

SMALL = RenderOptions(width=640, height=360)


@pytest.fixture(scope="module")
def session(recording: DemoRecording) -> RecordingSession:
    return import_recording(recording.folder)


def _cjk_font_installed() -> bool:
    try:
        out = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return bool(out.strip())


def _binaries() -> list:
    import shutil

    import imageio_ffmpeg

    system = shutil.which("ffmpeg")
    skip = pytest.mark.skip(reason="no system ffmpeg: run scripts/install_system_deps.sh")
    return [
        pytest.param(system, id="system-ffmpeg", marks=() if system else skip),
        pytest.param(imageio_ffmpeg.get_ffmpeg_exe(), id="imageio-ffmpeg"),
    ]


@pytest.mark.parametrize("ffmpeg", _binaries())
def test_render_across_a_segment_boundary(session: RecordingSession, tmp_path: Path, ffmpeg: str) -> None:
    # Given a window from 4 s to 9 s: 2 s of segment 0, then 3 s of the truncated segment 1 (with either binary)
    boundary = session.segments[1].offset_s
    assert 4.0 < boundary < 9.0
    reports: list[float] = []

    # When
    result = render_clip(
        session.segments,
        4.0,
        9.0,
        tmp_path / "1-clip.mp4",
        thumbnail=tmp_path / "1-thumb.jpg",
        options=SMALL,
        progress=lambda f, m: reports.append(f),
        ffmpeg=ffmpeg,
    )

    # Then: a playable MP4 of the requested length, a thumbnail, monotonic progress ending at 1
    duration, frames, has_audio = probe(result.output)
    assert duration == pytest.approx(5.0, abs=0.1)
    assert result.duration_s == pytest.approx(5.0, abs=0.1)
    assert frames == pytest.approx(150, abs=3) and has_audio
    assert result.thumbnail is not None and result.thumbnail.stat().st_size > 1000
    with __import__("av").open(str(result.thumbnail)) as thumb:
        assert thumb.streams.video[0].codec_context.width == SMALL.thumbnail_width
    assert reports == sorted(reports) and reports[-1] == 1.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1-clip.mp4", "1-thumb.jpg"]  # no scratch left


@pytest.mark.skipif(not _cjk_font_installed(), reason="no CJK font: run scripts/install_system_deps.sh")
def test_subtitles_are_burned_with_real_cjk_glyphs_and_danmaku_overlaid(
    session: RecordingSession, tmp_path: Path
) -> None:
    # Given the same 2 s window rendered plain, with two different CJK subtitles, and with danmaku
    def render(name: str, text: str | None, danmaku: bool = False):
        subs = [Cue(1.0, 3.0, text)] if text else None
        return render_clip(
            session.segments, 1.0, 3.0, tmp_path / f"{name}.mp4", subtitles=subs, danmaku=danmaku, options=SMALL
        ).output

    plain, hello, thanks = render("plain", None), render("hello", "大家好"), render("thanks", "谢谢你")
    overlay = render("danmaku", None, danmaku=True)
    a, b, c, d = (frame_at(p, 1.0) for p in (plain, hello, thanks, overlay))
    bottom, top = slice(300, 360), slice(0, 200)

    # Then: subtitles change the bottom band only …
    assert region_diff(a, b, bottom) > 3.0
    assert region_diff(a, b, top) < 1.0
    # … and two different CJK strings of equal length render differently (tofu boxes would look alike)
    assert region_diff(b, c, bottom) > 1.5
    # … and the danmaku overlay draws over the picture
    assert region_diff(a, d, slice(0, 360)) > 1.0


def test_cancellation_mid_render_kills_ffmpeg_and_leaves_no_file(session: RecordingSession, tmp_path: Path) -> None:
    # Given a slow render (720p, slow preset, whole session) and a cancel after the first progress report
    pids: list[int] = []
    seen: list[float] = []
    slow = RenderOptions(width=1280, height=720, preset="slow")

    # When
    with pytest.raises(Cancelled):
        render_clip(
            session.segments,
            0.0,
            session.duration_s,
            tmp_path / "1-clip.mp4",
            thumbnail=tmp_path / "1-thumb.jpg",
            options=slow,
            progress=lambda f, m: seen.append(f),
            should_stop=lambda: bool(seen),
            on_ffmpeg_start=pids.append,
        )

    # Then: it was really mid-render, ffmpeg and its process group are gone, and no file remains
    assert pids and seen and seen[0] < 0.95
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)
    with pytest.raises(ProcessLookupError):
        os.killpg(pids[0], 0)
    assert list(tmp_path.iterdir()) == []


def test_existing_output_is_never_overwritten(session: RecordingSession, tmp_path: Path) -> None:
    earlier = tmp_path / "1-clip.mp4"
    earlier.write_bytes(b"attempt 1")
    with pytest.raises(RenderError, match="already exists"):
        render_clip(session.segments, 0.0, 1.0, earlier, options=SMALL)
    assert earlier.read_bytes() == b"attempt 1"
    assert [p.name for p in tmp_path.iterdir()] == ["1-clip.mp4"]


def test_relative_segment_and_output_paths_render(
    recording: DemoRecording, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a session imported from a path relative to the working directory, as `make run` does with
    # `var/recordings/demo` and the default output root `var/outputs` (ffmpeg itself runs in a scratch directory)
    monkeypatch.chdir(recording.folder.parent)
    relative = import_recording(Path(recording.folder.name))
    assert not relative.segments[0].path.is_absolute()

    # When
    result = render_clip(relative.segments, 1.0, 3.0, Path("outputs") / "1-clip.mp4", options=SMALL)

    # Then: the clip is rendered from the segment the relative path names
    assert probe(result.output)[0] == pytest.approx(2.0, abs=0.1)


def test_ffmpeg_failure_leaves_no_partial_file(session: RecordingSession, tmp_path: Path) -> None:
    class Missing:
        path, offset_s, duration_s, has_audio = tmp_path / "gone.flv", 0.0, 5.0, True

    out_dir = tmp_path / "out"
    with pytest.raises(FfmpegError, match="gone.flv"):
        render_clip([Missing()], 0.0, 2.0, out_dir / "1-clip.mp4", thumbnail=out_dir / "1-thumb.jpg", options=SMALL)
    assert list(out_dir.iterdir()) == []


def test_window_planning() -> None:
    class Seg:
        def __init__(self, offset: float, duration: float) -> None:
            self.path, self.offset_s, self.duration_s, self.has_audio = Path("x"), offset, duration, True

    segs = [Seg(6.0, 3.6), Seg(0.0, 6.0), Seg(9.6, 6.0)]
    pieces = plan_pieces(segs, 5.0, 10.0)
    assert [(p.segment.offset_s, round(p.local_start_s, 3), round(p.duration_s, 3)) for p in pieces] == [
        (0.0, 5.0, 1.0),
        (6.0, 0.0, 3.6),
        (9.6, 0.0, 0.4),
    ]
    with pytest.raises(RenderError, match="session is 15.600 s long"):
        plan_pieces(segs, 10.0, 20.0)
    with pytest.raises(RenderError, match="empty"):
        plan_pieces(segs, 3.0, 3.0)


def test_srt_round_trip_and_window() -> None:
    cues = [Cue(0.5, 2.0, "大家好"), Cue(2.0, 3661.25, "hello\nworld")]
    text = to_srt(cues)
    assert "00:00:00,500 --> 00:00:02,000" in text and "01:01:01,250" in text
    assert parse_srt(text) == cues
    assert window(cues, 1.0, 3.0) == [Cue(0.0, 1.0, "大家好"), Cue(1.0, 2.0, "hello\nworld")]


def test_progress_block_parsing() -> None:
    assert parse_progress_time_s({"out_time_us": "2500000"}) == 2.5
    assert parse_progress_time_s({"out_time_us": "N/A", "out_time_ms": "1000000"}) == 1.0  # ms is µs too
    assert parse_progress_time_s({"out_time_us": "N/A"}) is None


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its reaper counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not Path("/usr/bin/setpriv").exists(), reason="needs util-linux setpriv (Linux)")
def test_sigkill_of_the_worker_takes_ffmpeg_down_with_it(recording: DemoRecording, tmp_path: Path) -> None:
    # Given a worker process in the middle of a slow render
    script = f"""
import sys
from pathlib import Path
from tasks.domain.recording.importer import import_recording
from tasks.domain.media.render import RenderOptions, render_clip
session = import_recording(Path({str(recording.folder)!r}))
render_clip(session.segments, 0.0, session.duration_s, Path({str(tmp_path / "1-clip.mp4")!r}),
            options=RenderOptions(width=1280, height=720, preset="veryslow"),
            on_ffmpeg_start=lambda pid: print(pid, flush=True))
"""
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        ffmpeg_pid = int(worker.stdout.readline())
        assert _alive(ffmpeg_pid)

        # When the worker is SIGKILLed
        worker.kill()
        worker.wait(10)

        # Then its ffmpeg dies too, and no clip was published (only the scratch dir the resync cleans)
        deadline = time.monotonic() + 5
        while _alive(ffmpeg_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(ffmpeg_pid)
        assert not (tmp_path / "1-clip.mp4").exists()
    finally:
        worker.kill()
        worker.wait(10)
