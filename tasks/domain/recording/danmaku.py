"""Parse danmaku XML (BililiveRecorder's BasicDanmakuWriter format) safely and forgivingly.

Live recorders crash, so an unterminated file is the normal case: lxml's ``recover=True`` keeps every
complete element and logs what it skipped. Hostile input is refused: the parser never resolves
entities, loads a DTD or touches the network, and because recover mode answers an XML bomb with
*silence* (no elements, no exception), the error log and the internal DTD are checked afterwards —
recorders never write a DTD, so any entity declaration is treated as an attack.

Format: ``<d p="offset_s,mode,size,color,unix_ms,0,uid,0" user="…">text</d>`` (offset from the
segment start), ``<sc ts=…>``, ``<gift ts=… giftcount=…>``, ``<guard ts=…>`` and one
``<BililiveRecorderRecordInfo …>`` per file.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from lxml import etree

from ..control import DomainError

#: How many parser complaints a result keeps (a flood of them says nothing more).
MAX_ERRORS_KEPT = 5
#: libxml2 error types that mean entity expansion was attempted (bomb / blow-up / loop).
_HOSTILE_ERROR_TYPES = frozenset(
    {"ERR_RESOURCE_LIMIT", "ERR_ENTITY_LOOP", "ERR_ENTITY_AMPLIFICATION", "ERR_ENTITY_BOUNDARY"}
)


class HostileXml(DomainError):
    """The XML declares entities or tripped libxml2's expansion limits (XML bomb / XXE); refused."""


class UnreadableDanmaku(DomainError):
    """A danmaku file could not be read at all."""


@dataclass(frozen=True)
class DanmakuComment:
    """One ``<d>`` comment; ``offset_s`` is seconds from its segment's start."""

    offset_s: float
    mode: int  # 1 scroll, 4 bottom, 5 top
    size: int
    color: int
    sent_at_ms: int
    uid: str
    user: str
    text: str


@dataclass(frozen=True)
class RecordInfo:
    """The recorder's ``<BililiveRecorderRecordInfo>`` element."""

    room_id: int | None
    name: str
    title: str
    start_time: datetime | None


@dataclass(frozen=True)
class DanmakuStats:
    """Counts over one file (or, summed, a session)."""

    comments: int = 0
    superchats: int = 0
    gifts: int = 0  # sum of giftcount
    guards: int = 0
    unique_users: int = 0
    first_offset_s: float | None = None
    last_offset_s: float | None = None
    peak_per_10s: int = 0  # most comments in any 10-second bucket

    def __add__(self, other: DanmakuStats) -> DanmakuStats:
        """Sum two files' stats (``unique_users`` becomes an upper bound; first/last are ignored)."""
        return DanmakuStats(
            comments=self.comments + other.comments,
            superchats=self.superchats + other.superchats,
            gifts=self.gifts + other.gifts,
            guards=self.guards + other.guards,
            unique_users=self.unique_users + other.unique_users,
            peak_per_10s=max(self.peak_per_10s, other.peak_per_10s),
        )


@dataclass(frozen=True)
class DanmakuFile:
    """A parsed danmaku file."""

    path: Path
    info: RecordInfo | None
    stats: DanmakuStats
    comments: tuple[DanmakuComment, ...]  # empty when parsed with keep_comments=False
    errors: tuple[str, ...]  # parser complaints (first MAX_ERRORS_KEPT); non-empty means malformed
    error_count: int

    @property
    def malformed(self) -> bool:
        """True when the parser had to recover (truncated file, bad characters …)."""
        return self.error_count > 0


def parse_danmaku(path: Path, *, keep_comments: bool = True) -> DanmakuFile:
    """Parse a danmaku XML file, recovering from truncation and refusing entity tricks.

    Parameters
    ----------
    path:
        The ``.xml`` file.
    keep_comments:
        Keep every comment (for rendering an overlay); False keeps only the stats.

    Returns
    -------
    DanmakuFile

    Raises
    ------
    HostileXml
        The file declares entities or hit libxml2's expansion limits.
    UnreadableDanmaku
        The file cannot be opened.
    """
    comments: list[DanmakuComment] = []
    users: set[str] = set()
    buckets: Counter[int] = Counter()
    counts = Counter[str]()
    gifts = 0
    first: float | None = None
    last: float | None = None
    info: RecordInfo | None = None
    try:
        parser = etree.iterparse(
            str(path),
            events=("end",),
            recover=True,
            resolve_entities=False,
            no_network=True,
            load_dtd=False,
            huge_tree=False,
        )
        for _, el in parser:
            tag = el.tag
            if tag == "d":
                comment = _comment(el)
                if comment is not None:
                    counts["d"] += 1
                    users.add(comment.uid or comment.user)
                    buckets[int(comment.offset_s // 10)] += 1
                    first = comment.offset_s if first is None else min(first, comment.offset_s)
                    last = comment.offset_s if last is None else max(last, comment.offset_s)
                    if keep_comments:
                        comments.append(comment)
            elif tag in ("sc", "guard"):
                counts[tag] += 1
            elif tag == "gift":
                gifts += _int(el.get("giftcount"), 1)
            elif tag == "BililiveRecorderRecordInfo":
                info = _record_info(el)
            if el.getparent() is not None and tag != "i":
                el.clear()  # keep memory flat on 60 MB files
        errors = [f"line {e.line}: {e.message}" for e in parser.error_log]
        hostile = [e for e in parser.error_log if e.type_name in _HOSTILE_ERROR_TYPES]
        root = parser.root
    except OSError as exc:
        raise UnreadableDanmaku(f"{path.name}: cannot read danmaku ({type(exc).__name__})") from exc
    except etree.XMLSyntaxError as exc:  # recover mode rarely raises; an empty file does
        if not path.stat().st_size:
            return DanmakuFile(path, None, DanmakuStats(), (), ("empty file",), 1)
        raise UnreadableDanmaku(f"{path.name}: not XML ({exc})") from exc
    declared = _declared_entities(root)
    if hostile or declared:
        why = hostile[0].message if hostile else f"declares entities {', '.join(declared[:3])}"
        raise HostileXml(f"{path.name}: refused danmaku XML with entity expansion (XML bomb / XXE?): {why.strip()}")
    stats = DanmakuStats(
        comments=counts["d"],
        superchats=counts["sc"],
        gifts=gifts,
        guards=counts["guard"],
        unique_users=len(users),
        first_offset_s=first,
        last_offset_s=last,
        peak_per_10s=max(buckets.values(), default=0),
    )
    return DanmakuFile(path, info, stats, tuple(comments), tuple(errors[:MAX_ERRORS_KEPT]), len(errors))


def _declared_entities(root) -> list[str]:
    if root is None:
        return []
    dtd = root.getroottree().docinfo.internalDTD
    return [entity.name for entity in dtd.iterentities()] if dtd is not None else []


def _comment(el) -> DanmakuComment | None:
    fields = (el.get("p") or "").split(",")
    if len(fields) < 5:
        return None  # a half-written element recovered without its attributes
    try:
        offset = float(fields[0])
    except ValueError:
        return None
    return DanmakuComment(
        offset_s=offset,
        mode=_int(fields[1], 1),
        size=_int(fields[2], 25),
        color=_int(fields[3], 0xFFFFFF),
        sent_at_ms=_int(fields[4], 0),
        uid=fields[6] if len(fields) > 6 else "",
        user=el.get("user") or "",
        text=el.text or "",
    )


def _record_info(el) -> RecordInfo:
    start = None
    raw = el.get("start_time")
    if raw:
        try:
            start = datetime.fromisoformat(raw)
        except ValueError:
            start = None
    room = el.get("roomid")
    return RecordInfo(
        room_id=int(room) if room and room.isdigit() else None,
        name=el.get("name") or "",
        title=el.get("title") or "",
        start_time=start,
    )


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def comments_to_xml(comments: list[DanmakuComment] | tuple[DanmakuComment, ...]) -> str:
    """Serialise comments as clean Bilibili XML (what ``biliass`` reads; it has no recover mode).

    Parameters
    ----------
    comments:
        Comments whose ``offset_s`` is already relative to the clip they will be shown on.

    Returns
    -------
    str
        A complete, well-formed ``<i>…</i>`` document.
    """
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', "<i>"]
    for c in comments:
        p = f"{c.offset_s:.3f},{c.mode},{c.size},{c.color},{c.sent_at_ms},0,{c.uid or '0'},0"
        lines.append(f"<d p={quoteattr(p)}>{escape(c.text)}</d>")
    lines.append("</i>")
    return "\n".join(lines)
