"""Aggregate functions SQLite lacks, registered on every connection of :func:`jobs.db.make_engine`.

``activity_durations(wait, run)``: the activity chart's percentiles of a group's jobs that ran (*run* not
NULL), as the JSON array ``[wait p50, run p50, run p95]`` (``null`` for a group where none ran). Each is the
nearest rank, the value at rank ``ceil(p·n)`` in ascending order: PostgreSQL's ``percentile_disc(p) WITHIN
GROUP (ORDER BY …)``, so a p95 is always one of the durations, never above the longest. One call per row
for all three: the cost here is Python's per-row call. In plain SQL, numbering every row with window
functions, a day's chart took three times as long (``docs/benchmarks.md``, "Read side at 1M jobs").
"""

from __future__ import annotations

import json
import sqlite3


def nearest_rank(ordered: list[int], percent: int) -> int:
    """The value at rank ``ceil(percent/100 · n)`` (from 1) of *ordered*, which is sorted and not empty."""
    return ordered[(percent * len(ordered) + 99) // 100 - 1]


class ActivityDurations:
    """The ``activity_durations(wait, run)`` aggregate."""

    __slots__ = ("runs", "waits")

    def __init__(self) -> None:
        self.waits: list[int] = []
        self.runs: list[int] = []

    def step(self, wait: int | None, run: int | None) -> None:
        if run is not None:
            self.waits.append(wait or 0)
            self.runs.append(run)

    def finalize(self) -> str:
        if not self.runs:
            return "null"
        self.waits.sort()
        self.runs.sort()
        return json.dumps([nearest_rank(self.waits, 50), nearest_rank(self.runs, 50), nearest_rank(self.runs, 95)])


def register(conn: sqlite3.Connection) -> None:
    """Make the aggregates above callable in *conn*'s statements."""
    conn.create_aggregate("activity_durations", 2, ActivityDurations)
