"""Synthesise a BililiveRecorder-style recording folder: FLV segments + danmaku XML, with faults on demand.

Each segment is ``录制-{room}-{yyyyMMdd-HHmmss-fff}-{title}.flv`` (test-pattern video, a quiet tone
and speech) plus the matching ``.xml`` danmaku in BasicDanmakuWriter's format. Speech comes from
espeak-ng when installed, else from the bundled ``assets/speech_en.ogg`` (espeak-ng output, see
``assets/README.md``). Faults model what a crashed recorder leaves behind:

- a *truncated* FLV: cut in the middle of an FLV tag, so its header still claims the full length;
  the generator parses the FLV tags itself and reports the true (written) duration independently
  of the importer's PyAV scan;
- a *malformed* XML: cut mid-element with no closing ``</i>``.
"""

from __future__ import annotations

import random
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from .media.ffmpeg import run_ffmpeg

#: Where the bundled speech sample and its transcript live.
ASSETS_DIR = Path(__file__).with_name("assets")
#: espeak-ng output of :data:`SPEECH_SENTENCES` joined (16 kHz mono, Opus).
BUNDLED_SPEECH = ASSETS_DIR / "speech_en.ogg"
#: Exact text spoken in :data:`BUNDLED_SPEECH`.
BUNDLED_SPEECH_TEXT = ASSETS_DIR / "speech_en.txt"

#: One sentence per segment (cycled); stream-style English that whisper tiny.en transcribes well.
SPEECH_SENTENCES: tuple[str, ...] = (
    "Welcome back everyone, today we are playing the new racing game.",
    "Thank you for the super chat, that was very kind of you.",
    "Let me check the settings before the next race begins.",
    "We will take a short break and then continue with the final level.",
    "Remember to follow the channel so you do not miss the next stream.",
)
#: Danmaku texts: CJK, emoji-free ASCII, and an ampersand (escaping must hold).
DANMAKU_TEXTS = ("哈哈哈哈", "主播好厉害", "大家好", "666", "gg & wp", "这是什么游戏？", "来了来了", "nice")
RAW_JSON = '[[0,1,25,16777215],"x",[1,"u"]]'  # recorders keep the raw JSON in an attribute
USERS = ("观众A", "user&b", "<b>粗体</b>", "路人甲", "viewer_42")
#: Shanghai time, as BililiveRecorder's default template formats file names.
CST = timezone(timedelta(hours=8))
DEFAULT_START = datetime(2026, 11, 28, 21, 49, 9, 56_000, tzinfo=CST)


@dataclass(frozen=True)
class DemoSegment:
    """One generated segment and the facts a test checks the importer against."""

    flv: Path
    xml: Path
    started_at: datetime
    header_duration_s: float  # what the encoder wrote into onMetaData
    written_duration_s: float  # the media actually on disk (shorter when truncated)
    truncated: bool
    xml_malformed: bool
    comments_written: int  # <d> items written to the XML before any cut
    comments_complete: int  # <d> items that survive intact in the (possibly cut) XML
    speech_text: str | None


@dataclass(frozen=True)
class DemoRecording:
    """A generated recording folder."""

    folder: Path
    room_id: int
    title: str
    segments: tuple[DemoSegment, ...]


def espeak_available() -> bool:
    """True when espeak-ng is on PATH."""
    return shutil.which("espeak-ng") is not None


def make_recording(
    directory: Path | str,
    segments: int = 3,
    seconds: float = 6.0,
    *,
    truncate_segment: int | None = None,
    truncate_at: float = 0.6,
    malformed_xml: int | None = None,
    comments_per_segment: int = 40,
    room_id: int = 23058,
    title: str = "测试直播 demo & 聊天",
    size: tuple[int, int] = (640, 360),
    speech: bool = True,
    start: datetime = DEFAULT_START,
    seed: int = 7,
    ffmpeg: str | None = None,
) -> DemoRecording:
    """Write a recording folder of ``segments`` FLV + XML pairs.

    Parameters
    ----------
    directory:
        Created if missing; the files go directly into it.
    segments, seconds:
        Number of segments and the length of each.
    truncate_segment, truncate_at:
        Index of the segment to cut as a killed recorder would, at this fraction of its bytes-in-time.
    malformed_xml:
        Index of the segment whose danmaku XML is cut mid-element (no ``</i>``).
    comments_per_segment:
        ``<d>`` items per XML (plus a super chat, a gift and a guard each).
    room_id, title, size, start:
        Recorder metadata and video size; ``start`` is the first segment's wall-clock start.
    speech:
        Mix speech into the audio (espeak-ng, else the bundled sample).
    seed:
        Seeds the danmaku generator so a recording is reproducible.
    ffmpeg:
        ffmpeg binary (default: see :func:`tasks.domain.media.ffmpeg.ffmpeg_exe`).

    Returns
    -------
    DemoRecording

    Raises
    ------
    tasks.domain.media.ffmpeg.FfmpegError
        When ffmpeg fails.
    """
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    made: list[DemoSegment] = []
    with tempfile.TemporaryDirectory(prefix="tenure-demo-") as scratch:
        for index in range(segments):
            started_at = start + timedelta(seconds=index * seconds)
            stamp = started_at.astimezone(CST).strftime("%Y%m%d-%H%M%S-") + f"{started_at.microsecond // 1000:03d}"
            base = folder / f"录制-{room_id}-{stamp}-{title}"
            flv, xml = base.with_suffix(".flv"), base.with_suffix(".xml")
            sentence = SPEECH_SENTENCES[index % len(SPEECH_SENTENCES)] if speech else None
            speech_wav = _speech_wav(Path(scratch), index, sentence) if sentence else None
            _encode_segment(flv, seconds, size, speech_wav, ffmpeg)
            written = seconds
            truncated = index == truncate_segment
            if truncated:
                written = truncate_flv(flv, seconds * truncate_at)
            xml_text, item_ends = _danmaku_xml(rng, room_id, title, started_at, seconds, comments_per_segment)
            data = xml_text.encode("utf-8")
            complete = len(item_ends)
            malformed = index == malformed_xml
            if malformed:
                cut = int(len(data) * 0.7)
                # Cut inside an element so the recover parser sees a half-written <d>.
                while data[cut - 1 : cut] in (b">", b"<"):
                    cut -= 1
                data = data[:cut]
                complete = sum(1 for end in item_ends if end <= cut)
            xml.write_bytes(data)
            made.append(
                DemoSegment(
                    flv=flv,
                    xml=xml,
                    started_at=started_at,
                    header_duration_s=seconds,
                    written_duration_s=written,
                    truncated=truncated,
                    xml_malformed=malformed,
                    comments_written=len(item_ends),
                    comments_complete=complete,
                    speech_text=sentence if espeak_available() else None,
                )
            )
    return DemoRecording(folder=folder, room_id=room_id, title=title, segments=tuple(made))


def _speech_wav(scratch: Path, index: int, sentence: str) -> Path:
    if espeak_available():
        out = scratch / f"speech{index}.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(out), sentence], check=True, timeout=60)
        return out
    return BUNDLED_SPEECH


def _encode_segment(out: Path, seconds: float, size: tuple[int, int], speech: Path | None, ffmpeg: str | None) -> None:
    width, height = size
    args = ["-f", "lavfi", "-i", f"testsrc2=size={width}x{height}:rate=30"]
    args += ["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=44100"]
    if speech is not None:
        # Speech starts 0.3 s in, loud; the tone stays quiet so it does not disturb ASR.
        args += ["-i", str(speech)]
        mix = (
            "[1:a]volume=0.03[tone];[2:a]aresample=44100,adelay=300:all=1,apad[speech];"
            "[tone][speech]amix=inputs=2:duration=first:normalize=0[a]"
        )
    else:
        mix = "[1:a]volume=0.05[a]"
    args += ["-filter_complex", mix, "-map", "0:v", "-map", "[a]", "-t", f"{seconds:.3f}"]
    args += ["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-g", "30"]
    args += ["-c:a", "aac", "-b:a", "96k", "-ar", "44100", "-ac", "2", "-f", "flv", str(out)]
    run_ffmpeg(args, duration_s=None, ffmpeg=ffmpeg)


def flv_tags(data: bytes) -> list[tuple[int, int, int, int]]:
    """The tags of an FLV file as ``(offset, tag_type, timestamp_ms, end_offset)``, stopping at a cut tag.

    Parameters
    ----------
    data:
        The FLV file's bytes.

    Returns
    -------
    list of tuples
        One per tag that is complete in ``data``.
    """
    if data[:3] != b"FLV":
        raise ValueError("not an FLV file")
    offset = struct.unpack(">I", data[5:9])[0] + 4  # header, then PreviousTagSize0
    tags = []
    while offset + 11 <= len(data):
        tag_type = data[offset]
        size = int.from_bytes(data[offset + 1 : offset + 4], "big")
        ts = int.from_bytes(data[offset + 4 : offset + 7], "big") | (data[offset + 7] << 24)
        end = offset + 11 + size + 4
        if end > len(data):
            break
        tags.append((offset, tag_type, ts, end))
        offset = end
    return tags


def truncate_flv(path: Path, cut_s: float) -> float:
    """Cut an FLV in the middle of the first audio/video tag at or after ``cut_s``, as a killed recorder does.

    Parameters
    ----------
    path:
        The FLV, rewritten in place.
    cut_s:
        Where to cut, in seconds of media time.

    Returns
    -------
    float
        The media duration left intact: the timestamp of the tag that was cut.
    """
    data = path.read_bytes()
    for offset, tag_type, ts, end in flv_tags(data):
        if tag_type in (8, 9) and ts >= cut_s * 1000:
            path.write_bytes(data[: offset + (end - offset) // 2])
            return ts / 1000
    raise ValueError(f"{path.name} is shorter than {cut_s} s")


def _danmaku_xml(
    rng: random.Random, room_id: int, title: str, started_at: datetime, seconds: float, count: int
) -> tuple[str, Sequence[int]]:
    """BasicDanmakuWriter-shaped XML, and the byte offset where each ``<d>`` element ends."""
    head = (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        '<?xml-stylesheet type="text/xsl" href="#s"?>\n'
        "<i>\n<chatserver>chat.bilibili.com</chatserver><chatid>0</chatid><mission>0</mission>"
        "<maxlimit>1000</maxlimit><state>0</state><real_name>0</real_name><source>0</source>\n"
        '<BililiveRecorder version="2.6.0" />\n'
        f'<BililiveRecorderRecordInfo roomid={quoteattr(str(room_id))} shortid="0" name="演示主播" '
        f'title={quoteattr(title)} areanameparent="游戏" areanamechild="赛车" '
        f"start_time={quoteattr(started_at.isoformat(timespec='milliseconds'))} />\n"
    )
    parts = [head]
    size = len(head.encode("utf-8"))
    ends: list[int] = []
    base_ms = int(started_at.timestamp() * 1000)
    offsets = sorted(rng.uniform(0.2, seconds - 0.2) for _ in range(count))
    extras = {count // 4: "sc", count // 2: "gift", (3 * count) // 4: "guard"}
    for i, offset in enumerate(offsets):
        user = rng.choice(USERS)
        uid = rng.randint(10_000, 99_999)
        mode = rng.choice((1, 1, 1, 4, 5))
        color = rng.choice((16777215, 16711680, 65280))
        item = (
            f'<d p="{offset:.3f},{mode},25,{color},{base_ms + int(offset * 1000)},0,{uid},0" '
            f"user={quoteattr(user)} raw={quoteattr(RAW_JSON)}>{escape(rng.choice(DANMAKU_TEXTS))}</d>\n"
        )
        kind = extras.get(i)
        if kind == "sc":
            item += f'<sc ts="{offset:.3f}" user={quoteattr(user)} price="30" time="60">感谢主播 &amp; 加油</sc>\n'
        elif kind == "gift":
            item += f'<gift ts="{offset:.3f}" user={quoteattr(user)} giftname="小心心" giftcount="3" />\n'
        elif kind == "guard":
            item += f'<guard ts="{offset:.3f}" user={quoteattr(user)} level="3" count="1" />\n'
        parts.append(item)
        first_line = item.split("\n", 1)[0]
        ends.append(size + len(first_line.encode("utf-8")))
        size += len(item.encode("utf-8"))
    parts.append("</i>\n")
    return "".join(parts), ends
