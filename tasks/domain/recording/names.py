"""Recorder file names: BililiveRecorder's ``录制-{room}-{yyyyMMdd-HHmmss-fff}-{title}.{flv,xml}``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from pathlib import Path

#: BililiveRecorder formats the time in Asia/Shanghai (its default template); no DST there.
RECORDER_TZ = timezone(timedelta(hours=8))
#: Containers a recorder writes (BililiveRecorder: FLV; blrec with remux: MP4).
MEDIA_SUFFIXES = frozenset({".flv", ".mp4"})

_NAME = re.compile(r"^录制-(?P<room>\d+)-(?P<day>\d{8})-(?P<time>\d{6})-(?P<ms>\d{3})-(?P<title>.*)$")


@dataclass(frozen=True)
class SegmentName:
    """What a segment's file name says."""

    room_id: int
    started_at: datetime
    title: str


def parse_segment_name(path: Path | str, tz: tzinfo = RECORDER_TZ) -> SegmentName | None:
    """Parse a BililiveRecorder segment name.

    Parameters
    ----------
    path:
        The segment's path or file name (the suffix is ignored).
    tz:
        The zone the recorder formatted the time in.

    Returns
    -------
    SegmentName or None
        None when the name does not follow the recorder's template.
    """
    match = _NAME.match(Path(path).stem)
    if match is None:
        return None
    try:
        naive = datetime.strptime(match["day"] + match["time"], "%Y%m%d%H%M%S")
    except ValueError:
        return None
    started_at = naive.replace(microsecond=int(match["ms"]) * 1000, tzinfo=tz)
    return SegmentName(room_id=int(match["room"]), started_at=started_at, title=match["title"])
