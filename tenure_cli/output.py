"""How the operator commands print: aligned tables for people, JSON Lines for scripts.

``--json`` prints one JSON object per line on stdout: one per listed item (job, event, queue,
dead letter, schedule, worker), or the API's answer to a single read or action. Tables and
messages for people are plain text; errors always go to stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: A table cell longer than this is cut (``…``); ``--json`` always has the whole value.
CELL_MAX_CHARS = 60


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[dict[str, Any]], Any]


def when(value: Any) -> str:
    """An API timestamp (ISO 8601) as ``YYYY-MM-DD HH:MM:SSZ`` in UTC; ``-`` when there is none."""
    if not value:
        return "-"
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        return str(value)
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        value = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    text = " ".join(str(value).split())
    return text if len(text) <= CELL_MAX_CHARS else text[: CELL_MAX_CHARS - 1] + "…"


class Output:
    """Where a command's results go: ``json=True`` for JSON Lines, else text for people."""

    def __init__(self, *, json_lines: bool) -> None:
        self.json_lines = json_lines

    def line(self, obj: Any) -> None:
        """One JSON object on one line (flushed: a follower reads it at once)."""
        sys.stdout.write(json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n")
        sys.stdout.flush()

    def text(self, message: str) -> None:
        sys.stdout.write(message + "\n")
        sys.stdout.flush()

    def table(self, rows: Iterable[dict[str, Any]], columns: list[Column]) -> int:
        """*rows* as JSON Lines or as a table; the number of rows."""
        if self.json_lines:
            count = 0
            for row in rows:
                self.line(row)
                count += 1
            return count
        cells = [[cell(c.value(row)) for c in columns] for row in rows]
        widths = [max([len(c.header), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
        for values in [[c.header for c in columns], *cells]:
            self.text("  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip())
        return len(cells)

    def record(self, obj: dict[str, Any], fields: list[tuple[str, Callable[[dict[str, Any]], Any]]]) -> None:
        """One object: as a JSON line, or ``name: value`` lines."""
        if self.json_lines:
            self.line(obj)
            return
        width = max(len(name) for name, _ in fields)
        for name, value in fields:
            shown = value(obj)
            if isinstance(shown, dict | list):
                shown = json.dumps(shown, ensure_ascii=False)
            self.text(f"{name.ljust(width)}  {'-' if shown is None else shown}")

    def done(self, obj: Any, message: str) -> None:
        """The answer to an action: the API's JSON, or *message*."""
        if self.json_lines:
            self.line(obj)
        else:
            self.text(message)


def note(message: str) -> None:
    """A remark for people (e.g. how to get the next page) on stderr, so stdout stays parseable."""
    print(f"tenure: {message}", file=sys.stderr)
