"""Medians over several broker benchmark runs: ``python -m bench.summarize bench/results/*.json [--markdown]``.

Each run's numbers come from ``bench.broker_bench``; this prints, per target and metric, the median over the
given runs, then the Tenure/peer ratios and the goal verdicts computed on those medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from . import report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.summarize", description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    docs = [json.loads(f.read_text()) for f in args.files]
    runs = [report.metrics_of(d) for d in docs]
    sizes = (docs[0]["config"]["backlog_small"], docs[0]["config"]["backlog_large"])
    for f, d in zip(args.files, docs, strict=True):
        print(f"{f.name}: load start {d['load_start']} end {d['load_end']}, n={d['config']['n']}, {d['seconds']:.0f} s")
    print(f"\nmedians over {len(runs)} runs:\n")
    print(report.render(report.medians(runs), sizes, markdown=args.markdown))
    # Ratios are paired within a run (same machine load), so the verdict that counts is on the median of the
    # per-run ratios, not on the ratio of the medians above.
    per_run = [report.goals(r) for r in runs]
    rows = [["goal (per-run ratio)", *(f"run {i + 1}" for i in range(len(runs))), "median", "target", "verdict"]]
    for k, g in enumerate(per_run[0]):
        values = [pr[k].value for pr in per_run]
        known = [v for v in values if v is not None]
        med = statistics.median(known) if known else None
        ok = None if med is None else report.goal_ok(g.name, med)
        rows.append(
            [
                g.name,
                *("—" if v is None else f"{v:.2f}" for v in values),
                "—" if med is None else f"{med:.2f}",
                g.target,
                "n/a" if ok is None else ("PASS" if ok else "MISS"),
            ]
        )
    print()
    print(report._table(rows, args.markdown))  # noqa: SLF001
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
