"""All SQL of live-feed subscriptions: the ``live_feeds`` table (revision 0018; :class:`jobs.models.LiveFeed`).

One row per feed a subscriber opened. ``anchor_a/b`` is the change-feed position the feed started at,
``mark_seq`` with ``mark_a/b`` a position by which the feed had delivered exactly ``mark_seq`` notices.
A mark only moves forward (a larger ``mark_seq``); rows of one subscriber beyond its newest
:data:`jobs.feeds.FEEDS_PER_SUBSCRIBER` are deleted when it opens another one.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, text

_COLUMNS = "id, subscriber, owner_id, anchor_a, anchor_b, mark_seq, mark_a, mark_b"


@dataclass(frozen=True)
class FeedRow:
    id: str
    subscriber: str
    owner_id: str | None
    anchor: tuple[int, int]
    mark_seq: int
    mark: tuple[int, int]


def feed_insert(
    conn: Connection, feed_id: str, subscriber: str, owner_id: str | None, anchor: tuple[int, int], now: int
) -> None:
    conn.execute(
        text(
            f"INSERT INTO live_feeds ({_COLUMNS}, created_at, updated_at) "
            "VALUES (:id, :subscriber, :owner, :a, :b, 0, :a, :b, :now, :now)"
        ),
        {"id": feed_id, "subscriber": subscriber, "owner": owner_id, "a": anchor[0], "b": anchor[1], "now": now},
    )


def feed_get(conn: Connection, feed_id: str) -> FeedRow | None:
    row = conn.execute(text(f"SELECT {_COLUMNS} FROM live_feeds WHERE id = :id"), {"id": feed_id}).first()
    if row is None:
        return None
    return FeedRow(row[0], row[1], row[2], (int(row[3]), int(row[4])), int(row[5]), (int(row[6]), int(row[7])))


def feed_mark(conn: Connection, feed_id: str, seq: int, position: tuple[int, int], now: int) -> bool:
    """Move the feed's mark forward to *seq* at *position*; False when it already stands there or beyond
    (another connection of the feed moved it further)."""
    result = conn.execute(
        text(
            "UPDATE live_feeds SET mark_seq = :seq, mark_a = :a, mark_b = :b, updated_at = :now "
            "WHERE id = :id AND (mark_seq < :seq OR (mark_seq = :seq AND (mark_a, mark_b) < (:a, :b)))"
        ),
        {"id": feed_id, "seq": seq, "a": position[0], "b": position[1], "now": now},
    )
    return bool(result.rowcount)


def feed_prune(conn: Connection, subscriber: str, keep: int) -> int:
    """Delete *subscriber*'s feeds but the *keep* most recently used; how many."""
    result = conn.execute(
        text(
            "DELETE FROM live_feeds WHERE subscriber = :s AND id NOT IN ("
            "SELECT id FROM live_feeds WHERE subscriber = :s ORDER BY updated_at DESC, id LIMIT :keep)"
        ),
        {"s": subscriber, "keep": keep},
    )
    return int(result.rowcount or 0)
