"""The windows and groupings of the activity charts, the same for the operations page and the API."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Window:
    """A chart window: how far back, in buckets of which size, labelled how."""

    name: str
    title: str
    span_s: int
    bucket_s: int
    label_format: str


#: The windows offered, by name (the first is the default).
WINDOWS = {
    w.name: w
    for w in (
        Window("1h", "Last hour", 3600, 60, "%H:%M"),
        Window("24h", "Last 24 hours", 86_400, 3600, "%a %H:%M"),
        Window("7d", "Last 7 days", 7 * 86_400, 6 * 3600, "%a %H:%M"),
    )
}
DEFAULT_WINDOW = "1h"
#: Breakdowns of a chart besides none: by the jobs' queue or kind.
GROUPS = ("queue", "kind")
