"""``activity_durations``, the percentiles SQLite lacks, on a real SQLite connection: nearest rank, as
PostgreSQL's ``percentile_disc``."""

from __future__ import annotations

import json
import sqlite3

from jobs import sqlite_aggregates


def test_nearest_rank_percentiles_of_the_jobs_that_ran() -> None:
    conn = sqlite3.connect(":memory:")
    sqlite_aggregates.register(conn)
    conn.execute("CREATE TABLE t (g TEXT, wait INTEGER, run INTEGER)")
    # a: three jobs ran (runs 1, 2, 3: p95 = rank ceil(2.85) = 3, never the 3.8 an interpolation says), one
    # never started; b: none ran; c: twenty runs 1..20 with waits 20..1 (p95 = rank 19)
    rows = [("a", 5, 3), ("a", 7, 1), ("a", 6, 2), ("a", None, None), ("b", None, None)]
    rows += [("c", 21 - r, r) for r in range(1, 21)]
    conn.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    got = dict(conn.execute("SELECT g, activity_durations(wait, run) FROM t GROUP BY g").fetchall())
    assert {g: json.loads(d) for g, d in got.items()} == {"a": [6, 2, 3], "b": None, "c": [10, 10, 19]}
