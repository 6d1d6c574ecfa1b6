"""Medians, ratios and the issue's goals for :mod:`bench.jobs_peers` results.

Goals (issue 17), judged on ratios of medians:

* Tenure's default deployment (group ``tenure-default``): drain 1×8 and 2×8 ≥ 1.5 × the fastest peer's;
* each Tenure fleet deployment (group ``tenure-fleet``): drain 1×8 and 2×8 ≥ 1.0 × the fastest PostgreSQL
  peer's (procrastinate, pgqueuer, Oban);
* enqueue→start p50 and p99 at the steady rate ≤ the best peer's (lowest), printed for every Tenure variant.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from bench import report as broker_report

#: (key, column, format, higher is better)
METRICS: list[tuple[str, str, str, bool]] = [
    ("submit_per_s", "submit/s", "{:,.0f}", True),
    ("drain_1x8_per_s", "drain 1×8 jobs/s", "{:,.0f}", True),
    ("drain_2x8_per_s", "drain 2×8 jobs/s", "{:,.0f}", True),
    ("latency_p50_ms", "p50 ms", "{:.1f}", False),
    ("latency_p99_ms", "p99 ms", "{:.1f}", False),
]

DRAIN_GOALS = {"tenure-default": 1.5, "tenure-fleet": 1.0}


@dataclass(frozen=True)
class GoalLine:
    name: str
    value: float | None
    target: str
    verdict: str
    against: str


def summarize(rounds: list[dict[str, Any]], systems: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per system: the median of each metric over its rounds that passed their checks."""
    out: dict[str, dict[str, Any]] = {}
    for s in systems:
        ok = [r for r in rounds if r["system"] == s["name"] and r.get("error") is None]
        failed = sum(1 for r in rounds if r["system"] == s["name"] and r.get("error") is not None)
        med: dict[str, Any] = {"label": s["label"], "group": s["group"], "postgres": s["postgres"]}
        med.update({"rounds_ok": len(ok), "rounds_failed": failed})
        for key, *_ in METRICS:
            values = [r[key] for r in ok if r.get(key) is not None]
            med[key] = statistics.median(values) if values else None
        out[s["name"]] = med
    return out


def _best(summary: dict[str, dict[str, Any]], key: str, higher: bool, postgres_only: bool) -> tuple[str, float] | None:
    found = [
        (name, m[key])
        for name, m in summary.items()
        if m["group"] == "peer" and m[key] is not None and (m["postgres"] or not postgres_only)
    ]
    if not found:
        return None
    return max(found, key=lambda x: x[1]) if higher else min(found, key=lambda x: x[1])


def goals(summary: dict[str, dict[str, Any]]) -> list[GoalLine]:
    lines: list[GoalLine] = []
    for name, m in summary.items():
        group = m["group"]
        if group == "peer":
            continue
        need = DRAIN_GOALS[group]
        for key, shape in (("drain_1x8_per_s", "1×8"), ("drain_2x8_per_s", "2×8")):
            best = _best(summary, key, True, postgres_only=group == "tenure-fleet")
            lines.append(_line(f"{name}: drain {shape} ÷ fastest", m[key], best, need, higher=True, group=group))
        for key, pct in (("latency_p50_ms", "p50"), ("latency_p99_ms", "p99")):
            best = _best(summary, key, False, postgres_only=False)
            lines.append(_line(f"{name}: latency {pct} ÷ best", m[key], best, 1.0, higher=False, group="peer"))
    return lines


def _line(
    name: str, value: float | None, best: tuple[str, float] | None, need: float, *, higher: bool, group: str
) -> GoalLine:
    of = "PostgreSQL peer" if group == "tenure-fleet" else "peer"
    ratio = None if value is None or best is None or best[1] == 0 else value / best[1]
    target = f">= {need:.2f}" if higher else f"<= {need:.2f}"
    if ratio is None:
        verdict = "n/a"
    else:
        verdict = "PASS" if (ratio >= need if higher else ratio <= need) else "MISS"
    return GoalLine(f"{name} {of}", ratio, target, verdict, "—" if best is None else best[0])


def render(summary: dict[str, dict[str, Any]], lines: list[GoalLine], rounds: int, markdown: bool = False) -> str:
    rows = [[f"system (median of {rounds} rounds)", *(label for _, label, _, _ in METRICS), "rounds ok"]]
    for m in summary.values():
        cells = ["—" if m[key] is None else fmt.format(m[key]) for key, _, fmt, _ in METRICS]
        ok = f"{m['rounds_ok']}" + (f" ({m['rounds_failed']} FAILED)" if m["rounds_failed"] else "")
        rows.append([m["label"], *cells, ok])
    goal_rows = [["goal (ratio of medians)", "measured", "target", "verdict", "against"]]
    for g in lines:
        goal_rows.append([g.name, "—" if g.value is None else f"{g.value:.2f}", g.target, g.verdict, g.against])
    table = broker_report._table  # noqa: SLF001 - the broker benchmark's table formatter
    return table(rows, markdown) + "\n\n" + table(goal_rows, markdown)
