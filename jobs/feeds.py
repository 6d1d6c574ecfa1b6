"""Live-feed subscriptions: a cursor per subscriber over the job layer's change feed.

The change feed (:func:`jobs.queries.changes_after`) orders every job event by a global position: the
SQLite ``rowid``, or PostgreSQL's ``(change_xid, change_id)`` read below the oldest running transaction.
Handing that position to a user would show how busy everyone else is (it grows with every owner's
events), so a subscriber gets a **feed** of its own instead:

- :func:`open_feed` starts a feed at the head: a random id, 0 notices delivered. Its cursor is
  ``<id>.<n>``: the feed's id and the number of notices it has delivered. Nothing but the feed's own
  notices moves it; other owners' events are passed over without a trace.
- :func:`next_changes` returns the next changes the feed's owner filter lets through (all owners'
  for an admin's feed), numbered ``n + 1, n + 2, …``; the feed keeps, server-side only, the global
  position up to which it has looked.
- :func:`resume_feed` turns ``<id>.<n>`` back into a position: the ``live_feeds`` row holds the start
  (``anchor``) and a recent ``(mark_seq, mark)`` pair — every one of the feed's events up to ``mark``
  is one of its first ``mark_seq`` notices. The position of notice *n* is found by counting the
  owner's events forward from the mark (``n > mark_seq``) or back from it (``n < mark_seq``) through
  ``ix_job_events_owner``: the cost is the owner's own events since the mark, never anyone else's.
  Positions below the change feed's horizon never gain events later, so the count is the same in any
  process on any host. :func:`mark_feed` moves the mark forward as notices go out (every
  :data:`MARK_EVERY_NOTICES` notices or :data:`MARK_EVERY_MS`, and when a connection ends); a quiet
  feed's mark follows its position every :data:`REFRESH_EVERY_MS`.

Retention may delete events inside a counted range, which would shift the count: a resume whose count
starts below the newest deleted position (``jobs.retention_store.pruned_position``) is refused as
expired, as :func:`jobs.queries.changes_after` refuses an old cursor. Only the subscriber that opened a
feed, with the same owner filter, resumes it; anything else is an unknown cursor. All SQL is in
:mod:`jobs.feed_store` and :mod:`jobs.read_store`.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from sqlalchemy import Engine

from . import db, feed_store, queries, read_store, retention_store, store
from .errors import CursorExpired
from .queries import CursorUnknown, JobChange

#: Feeds kept per subscriber (one per browser tab or client that started from now); opening another one
#: deletes the least recently used beyond this, whose cursors then resume as unknown (a resync).
FEEDS_PER_SUBSCRIBER = 64
#: The feed's mark moves after this many notices ...
MARK_EVERY_NOTICES = 500
#: ... or this long after the last move, whichever comes first (when notices went out meanwhile).
MARK_EVERY_MS = 2_000
#: A quiet feed's mark follows its position this often (no notices: only other owners' events passed).
REFRESH_EVERY_MS = 60_000
#: Most events a resume counts (forward or back from the mark) before it gives up: a cursor that far
#: from the mark is unknown (forward) or hopelessly behind (back).
MAX_COUNT = 10_000
_ID_CHARS = 16
_CURSOR = re.compile(rf"([0-9a-z]{{{_ID_CHARS}}})\.(\d{{1,18}})")
_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


class FeedBehind(Exception):
    """The cursor lies more than :data:`MAX_COUNT` notices before the feed's mark."""


@dataclass
class Feed:
    """One subscriber's place in its feed (server-side; only :attr:`cursor` is ever sent)."""

    id: str
    subscriber: str
    #: Whose jobs' changes the feed carries (``None``: every owner's).
    owner_id: str | None
    #: Notices delivered so far.
    seq: int
    #: Change-feed position every event up to which has been numbered (never leaves the server).
    position: tuple[int, int]
    #: The row's mark as this process last wrote or read it, and when (ms).
    marked_seq: int = 0
    marked_position: tuple[int, int] = (0, 0)
    marked_at: int = 0

    @property
    def cursor(self) -> str:
        return f"{self.id}.{self.seq}"


@dataclass(frozen=True)
class FeedChange:
    """A change and its cursor in the feed (``<id>.<n>``)."""

    cursor: str
    change: JobChange


def parse_cursor(cursor: str) -> tuple[str, int]:
    """The feed id and notice count a cursor names; raises ValueError for anything else."""
    match = _CURSOR.fullmatch(cursor)
    if match is None:
        raise ValueError("not a feed cursor")
    return match.group(1), int(match.group(2))


def open_feed(engine: Engine, subscriber: str, owner_id: str | None) -> Feed:
    """A new feed for *subscriber* of *owner_id*'s changes (``None``: all), starting at the head."""
    feed_id = "".join(secrets.choice(_ALPHABET) for _ in range(_ID_CHARS))
    now = store.now_ms()
    with db.write(engine) as tx:
        # The head before this transaction writes (on PostgreSQL it has no transaction id yet, so it
        # does not hold its own horizon back).
        head = read_store.head_position(tx.conn)
        feed_store.feed_insert(tx.conn, feed_id, subscriber, owner_id, head, now)
        feed_store.feed_prune(tx.conn, subscriber, FEEDS_PER_SUBSCRIBER)
    return Feed(feed_id, subscriber, owner_id, 0, head, marked_seq=0, marked_position=head, marked_at=now)


def resume_feed(engine: Engine, cursor: str, subscriber: str, owner_id: str | None) -> Feed:
    """The feed *cursor* names, placed just after the notice it counts.

    Raises:
      ValueError: Not a feed cursor.
      CursorUnknown: No feed of *subscriber* with this owner filter has this id, or it never delivered
        that many notices.
      CursorExpired: Retention deleted events the count would cross: the feed cannot resume exactly.
      FeedBehind: The cursor lies more than :data:`MAX_COUNT` notices before the feed's mark.
    """
    feed_id, seq = parse_cursor(cursor)
    with db.read(engine) as conn:
        head = read_store.head_position(conn)
        row = feed_store.feed_get(conn, feed_id)
        if row is None or row.subscriber != subscriber or row.owner_id != owner_id:
            raise CursorUnknown(queries.encode_position(head))
        if seq == row.mark_seq:
            position = lowest = row.mark
        elif seq > row.mark_seq:
            if seq - row.mark_seq > MAX_COUNT:
                raise CursorUnknown(queries.encode_position(head))
            found = read_store.event_position_nth(conn, owner_id, seq - row.mark_seq, after=row.mark, upto=head)
            lowest = row.mark
            position = found or row.mark
        elif seq == 0:
            found = position = lowest = row.anchor
        else:
            # Notice *seq* is the (mark_seq - seq + 1)-th of the feed's events counted back from the mark.
            if row.mark_seq - seq >= MAX_COUNT:
                raise FeedBehind()
            found = read_store.event_position_nth(
                conn, owner_id, row.mark_seq - seq + 1, after=row.anchor, upto=row.mark, backward=True
            )
            position = lowest = found or row.anchor
        if lowest < retention_store.pruned_position(conn):
            raise CursorExpired(queries.encode_position(head))
        if seq != row.mark_seq and found is None:
            raise CursorUnknown(queries.encode_position(head))
    return Feed(feed_id, subscriber, owner_id, seq, position, row.mark_seq, row.mark, marked_at=store.now_ms())


def next_changes(engine: Engine, feed: Feed, limit: int) -> list[FeedChange]:
    """The feed's next changes (at most *limit*), oldest first; advances *feed* past them.

    When fewer than *limit* come back the feed's position moves past every event examined, other
    owners' included — its cursor does not (it counts notices). Raises :class:`CursorExpired` when
    retention deleted events the feed had not reached yet (it must start over).
    """
    with db.read(engine) as conn:
        changes, end = queries.changes_from(conn, feed.position, feed.owner_id, limit)
    numbered = [FeedChange(f"{feed.id}.{feed.seq + i}", c) for i, c in enumerate(changes, 1)]
    feed.seq += len(changes)
    feed.position = end
    return numbered


def mark_due(feed: Feed, now_ms: int) -> bool:
    """Whether :func:`mark_feed` should run now: notices went out since the last mark (enough of them, or
    :data:`MARK_EVERY_MS` ago), or — on a quiet feed — the position moved on and :data:`REFRESH_EVERY_MS`
    passed (so that a resume after retention has deleted older events is still exact)."""
    pending = feed.seq - feed.marked_seq
    if pending > 0:
        return pending >= MARK_EVERY_NOTICES or now_ms - feed.marked_at >= MARK_EVERY_MS
    return feed.position > feed.marked_position and now_ms - feed.marked_at >= REFRESH_EVERY_MS


def mark_feed(engine: Engine, feed: Feed) -> None:
    """Record the feed's count and position, so a resume from a recent cursor counts few events."""
    if (feed.seq, feed.position) <= (feed.marked_seq, feed.marked_position):
        return
    now = store.now_ms()
    with db.write(engine) as tx:
        feed_store.feed_mark(tx.conn, feed.id, feed.seq, feed.position, now)
    feed.marked_seq, feed.marked_position, feed.marked_at = feed.seq, feed.position, now
