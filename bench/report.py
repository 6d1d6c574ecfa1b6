"""Tables, ratios and goal verdicts for broker benchmark results (shared by the benchmark and ``bench.summarize``)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Metrics = dict[str, dict[str, float]]  # target -> metric -> value

TARGET_ORDER = ["sqlite-normal", "sqlite-full", "redis", "rabbitmq", "rabbitmq-confirms"]

#: (metric key, label, format, higher is better)
METRICS: list[tuple[str, str, str, bool]] = [
    ("enqueue_per_s", "enqueue/s (1 producer)", "{:,.0f}", True),
    ("drain_1x8_per_s", "drain/s 1 proc x 8 thr", "{:,.0f}", True),
    ("drain_2x8_per_s", "drain/s 2 proc x 8 thr", "{:,.0f}", True),
    ("latency_p50_ms", "enqueue->start p50 ms", "{:.2f}", False),
    ("latency_p99_ms", "enqueue->start p99 ms", "{:.2f}", False),
    ("idle_cpu_pct", "idle worker CPU %", "{:.2f}", False),
]

BACKLOG_METRICS: list[tuple[str, str, str]] = [
    ("backlog_small_per_s", "drain/s with {small:,} queued (1x8)", "{:,.0f}"),
    ("backlog_large_per_s", "drain/s with {large:,} queued (1x8)", "{:,.0f}"),
    ("backlog_ratio", "large / small", "{:.2f}"),
]


@dataclass
class Goal:
    name: str
    value: float | None
    target: str
    status: str


def _get(m: Metrics, target: str, key: str) -> float | None:
    v = m.get(target, {}).get(key)
    return None if v is None else float(v)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def goals(m: Metrics) -> list[Goal]:
    """The issue's goals, judged on one run's (or the medians') numbers."""
    out: list[Goal] = []

    def ratio_goal(name: str, a: float | None, b: float | None, ok: Callable[[float], bool], target: str) -> None:
        r = _ratio(a, b)
        out.append(Goal(name, r, target, "n/a" if r is None else ("PASS" if ok(r) else "MISS")))

    n, f, rmq, rmqc = "sqlite-normal", "sqlite-full", "rabbitmq", "rabbitmq-confirms"
    ratio_goal(
        "drain 1x8: NORMAL / RabbitMQ",
        _get(m, n, "drain_1x8_per_s"),
        _get(m, rmq, "drain_1x8_per_s"),
        lambda r: r >= 1.0,
        ">= 1.00",
    )
    ratio_goal(
        "drain 2x8: NORMAL / RabbitMQ",
        _get(m, n, "drain_2x8_per_s"),
        _get(m, rmq, "drain_2x8_per_s"),
        lambda r: r >= 1.25,
        ">= 1.25",
    )
    ratio_goal(
        "enqueue: NORMAL / RabbitMQ",
        _get(m, n, "enqueue_per_s"),
        _get(m, rmq, "enqueue_per_s"),
        lambda r: r >= 1.0,
        ">= 1.00",
    )
    ratio_goal(
        "enqueue: FULL / RabbitMQ-confirms",
        _get(m, f, "enqueue_per_s"),
        _get(m, rmqc, "enqueue_per_s"),
        lambda r: r >= 3.0,
        ">= 3.00",
    )
    ratio_goal(
        "latency p50: NORMAL / RabbitMQ",
        _get(m, n, "latency_p50_ms"),
        _get(m, rmq, "latency_p50_ms"),
        lambda r: r <= 1.0,
        "<= 1.00",
    )
    ratio_goal(
        "latency p99: NORMAL / RabbitMQ",
        _get(m, n, "latency_p99_ms"),
        _get(m, rmq, "latency_p99_ms"),
        lambda r: r <= 1.0,
        "<= 1.00",
    )
    for t in (n, f):
        cpu = _get(m, t, "idle_cpu_pct")
        out.append(
            Goal(
                f"idle worker CPU % ({t})", cpu, "<= 1.00", "n/a" if cpu is None else ("PASS" if cpu <= 1.0 else "MISS")
            )
        )
    r = _get(m, "sqlite-backlog", "backlog_ratio")
    out.append(
        Goal(
            "drain with 1M queued / with 1k queued",
            r,
            ">= 0.90",
            "n/a" if r is None else ("PASS" if r >= 0.9 else "MISS"),
        )
    )
    return out


def goal_ok(name: str, value: float) -> bool:
    """Judge *value* against the target of the goal called *name* (as listed by :func:`goals`)."""
    target = next(g.target for g in goals({}) if g.name == name)
    op, threshold = target.split()
    return value >= float(threshold) if op == ">=" else value <= float(threshold)


def _fmt(fmt: str, v: float | None) -> str:
    return "—" if v is None else fmt.format(v)


def render(m: Metrics, backlog_sizes: tuple[int, int] | None = None, markdown: bool = False) -> str:
    """The results table, the Tenure/peer ratios and the goal verdicts as text (or Markdown)."""
    targets = [t for t in TARGET_ORDER if t in m]
    rows: list[list[str]] = [["metric", *targets]]
    for key, label, fmt, _ in METRICS:
        if any(key in m[t] for t in targets):
            rows.append([label, *(_fmt(fmt, _get(m, t, key)) for t in targets)])
    lines = [_table(rows, markdown), ""]

    peers = [p for p in ("rabbitmq", "redis") if p in m]
    tenure = [t for t in ("sqlite-normal", "sqlite-full") if t in m]
    if peers and tenure:
        header = ["ratio (Tenure / peer)"] + [f"{t} / {p}" for t in tenure for p in peers]
        rrows = [header]
        for key, label, _, higher in METRICS:
            cells = [_fmt("{:.2f}x", _ratio(_get(m, t, key), _get(m, p, key))) for t in tenure for p in peers]
            if any(c != "—" for c in cells):
                rrows.append([f"{label} ({'higher' if higher else 'lower'} is better)", *cells])
        if "rabbitmq-confirms" in m:
            rrows.append(
                ["enqueue/s vs RabbitMQ-confirms"]
                + [
                    _fmt("{:.2f}x", _ratio(_get(m, t, "enqueue_per_s"), _get(m, "rabbitmq-confirms", "enqueue_per_s")))
                    for t in tenure
                    for _ in peers
                ]
            )
        lines += [_table(rrows, markdown), ""]
    if "sqlite-normal" in m and "sqlite-full" in m:
        nf = [["NORMAL vs FULL", "NORMAL", "FULL", "FULL / NORMAL"]]
        for key, label, fmt, _ in METRICS:
            a, b = _get(m, "sqlite-normal", key), _get(m, "sqlite-full", key)
            if a is not None or b is not None:
                nf.append([label, _fmt(fmt, a), _fmt(fmt, b), _fmt("{:.2f}x", _ratio(b, a))])
        lines += [_table(nf, markdown), ""]
    if "sqlite-backlog" in m:
        small, large = backlog_sizes or (0, 0)
        brows = [["SQLite backlog (NORMAL)", "value"]]
        for key, label, fmt in BACKLOG_METRICS:
            brows.append([label.format(small=small, large=large), _fmt(fmt, _get(m, "sqlite-backlog", key))])
        lines += [_table(brows, markdown), ""]
    grows = [["goal", "measured", "target", "verdict"]]
    for g in goals(m):
        grows.append([g.name, _fmt("{:.2f}", g.value), g.target, g.status])
    lines.append(_table(grows, markdown))
    return "\n".join(lines)


def _table(rows: Sequence[Sequence[str]], markdown: bool) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    if markdown:
        out = ["| " + " | ".join(c.ljust(w) for c, w in zip(rows[0], widths, strict=True)) + " |"]
        out.append("|" + "|".join(("-" * (w + 1)) + ":" if i else "-" * (w + 2) for i, w in enumerate(widths)) + "|")
        for r in rows[1:]:
            out.append(
                "| "
                + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                + " |"
            )
        return "\n".join(out)
    out = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(rows[0], widths, strict=True)))
    ]
    out.append("  ".join("-" * w for w in widths))
    for r in rows[1:]:
        out.append(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        )
    return "\n".join(out)


def medians(runs: Sequence[Metrics]) -> Metrics:
    """Per target and metric, the median over the runs that measured it."""
    out: Metrics = {}
    for run in runs:
        for target, values in run.items():
            for key, v in values.items():
                out.setdefault(target, {}).setdefault(key, [])  # type: ignore[arg-type]
                out[target][key].append(v)  # type: ignore[attr-defined]
    return {t: {k: statistics.median(vs) for k, vs in d.items()} for t, d in out.items()}  # type: ignore[arg-type]


def metrics_of(result: dict[str, Any]) -> Metrics:
    """The numeric metrics of one results JSON document."""
    return {t: {k: v for k, v in d.items() if isinstance(v, int | float)} for t, d in result["targets"].items()}
