"""No-regression check of the job layer: ``bench.jobs_bench`` on an old and a new commit, alternated in one run.

Run from the repository root::

    .venv/bin/python -m bench.jobs_compare [--old 6886b16^] [--new HEAD] [--pairs 4] [--n 5000]

Both commits are exported with ``git archive`` into a temporary directory (their committed trees, nothing
uncommitted; no worktree is registered) and each side runs its own ``python -m bench.jobs_bench --rounds 1``
there, as a subprocess, so old workers run old code and new workers new code. The sides alternate (old, new,
new, old, old, new, …: neither always goes first into a quieter or busier minute), ``--pairs`` times each; every
run writes its own results JSON, read back here. Printed per worker shape: each side's jobs/s per run, the
medians, the per-pair ratio new ÷ old with its median and spread, and PASS when the median ratio is at least
:data:`GOAL` (0.95). A second table does the same for each run's submits and drain together (see
:func:`submitted_and_drained`). The machine's load average is recorded before every run. Results go to
``bench/results/jobs/compare-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import report
from .broker_bench import _git, loadavg, log
from .procs import REPO

GOAL = 0.95


def export(ref: str, into: Path) -> str:
    """The tree of commit *ref* under *into*; returns the full commit id."""
    commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=REPO, check=True, capture_output=True)
    into.mkdir(parents=True)
    tar = into.with_suffix(".tar")
    tar.write_bytes(archive.stdout)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    tar.unlink()
    return commit


def run_side(tree: Path, n: int, shapes: str, fair_share: str = "on") -> dict[str, Any]:
    """One ``bench.jobs_bench`` round (every shape) in *tree*; its results document."""
    results = tree / "bench" / "results" / "jobs"
    before = set(results.glob("*.json")) if results.exists() else set()
    env = {**os.environ, "PYTHONPATH": str(tree), "BENCH_FAIR_SHARE": fair_share}
    subprocess.run(
        [sys.executable, "-m", "bench.jobs_bench", "--n", str(n), "--rounds", "1", "--processes", shapes],
        cwd=tree,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (new,) = set(results.glob("*.json")) - before
    return json.loads(new.read_text())


def drained(shape: dict[str, float]) -> float:
    """A run's jobs/s: the drain alone (the figure the goal is set on)."""
    return shape["jobs_per_s"]


def submitted_and_drained(shape: dict[str, float]) -> float:
    """A run's jobs/s from the first submit to the last job done, had the drain followed the submits:
    ``1 / (1 / submit/s + 1 / drain/s)``. Fair share moves a held job's message from its submit to the
    drain (the claim that frees its place in the window writes it), so the drain alone counts that work
    on one side only."""
    return 1 / (1 / shape["submit_per_s"] + 1 / shape["jobs_per_s"])


def summarize(
    runs: list[dict[str, Any]], metric: Callable[[dict[str, float]], float] = drained
) -> dict[str, dict[str, Any]]:
    """Per shape: both sides' jobs/s (*metric*) per run, medians, per-pair ratios."""
    out: dict[str, dict[str, Any]] = {}
    for shape in runs[0]["doc"]["summary"]:
        old = [metric(r["doc"]["summary"][shape]) for r in runs if r["side"] == "old"]
        new = [metric(r["doc"]["summary"][shape]) for r in runs if r["side"] == "new"]
        ratios = [b / a for a, b in zip(old, new, strict=True)]
        out[shape] = {
            "old_jobs_per_s": old,
            "new_jobs_per_s": new,
            "old_median": statistics.median(old),
            "new_median": statistics.median(new),
            "ratios": ratios,
            "ratio_median": statistics.median(ratios),
            "ratio_of_medians": statistics.median(new) / statistics.median(old),
            "checks_ok": all(r["doc"]["all_checks_ok"] for r in runs),
        }
    return out


def render(summary: dict[str, dict[str, Any]], markdown: bool = False) -> str:
    rows = [
        [
            "shape",
            "old jobs/s (runs)",
            "new jobs/s (runs)",
            "old median",
            "new median",
            "new/old per pair",
            "median ratio",
            "verdict",
        ]
    ]
    for shape, s in summary.items():
        rows.append(
            [
                shape,
                " / ".join(f"{v:,.0f}" for v in s["old_jobs_per_s"]),
                " / ".join(f"{v:,.0f}" for v in s["new_jobs_per_s"]),
                f"{s['old_median']:,.0f}",
                f"{s['new_median']:,.0f}",
                " / ".join(f"{v:.2f}" for v in s["ratios"]),
                f"{s['ratio_median']:.2f}",
                "PASS" if s["ratio_median"] >= GOAL else "MISS",
            ]
        )
    return report._table(rows, markdown)  # noqa: SLF001 - the broker benchmark's table formatter


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.jobs_compare", description=__doc__.split("\n")[0])
    p.add_argument("--old", default="6886b16^", help="the old commit (default 6886b16^)")
    p.add_argument("--new", default="HEAD", help="the new commit (default HEAD)")
    p.add_argument("--pairs", type=int, default=4, help="runs per side (default 4)")
    p.add_argument("--n", type=int, default=5000, help="jobs per drain (default 5000)")
    p.add_argument("--processes", default="1,2", help="worker shapes, as bench.jobs_bench takes them")
    p.add_argument("--markdown", action="store_true")
    p.add_argument(
        "--fair-share",
        choices=("on", "off"),
        default="on",
        help="the new side's fair share (default on, as shipped; the old side predates it): BENCH_FAIR_SHARE",
    )
    args = p.parse_args(argv)
    started = datetime.now(UTC)
    scratch = Path(tempfile.mkdtemp(prefix="tenure-jobs-compare-"))
    runs: list[dict[str, Any]] = []
    try:
        trees = {"old": scratch / "old", "new": scratch / "new"}
        commits = {side: export(ref, trees[side]) for side, ref in (("old", args.old), ("new", args.new))}
        log(f"old {commits['old'][:10]} ({args.old}), new {commits['new'][:10]} ({args.new}); {args.pairs} pairs")
        order = ["old", "new", "new", "old"]
        for k in range(2 * args.pairs):
            side = order[k % 4]
            load = loadavg()
            doc = run_side(trees[side], args.n, args.processes, args.fair_share)
            runs.append({"side": side, "load_before": load, "doc": doc})
            shapes = ", ".join(f"{s} {m['jobs_per_s']:,.0f} jobs/s" for s, m in doc["summary"].items())
            log(f"run {k + 1}: {side}: {shapes}; load before {load}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = summarize(runs)
    end_to_end = summarize(runs, submitted_and_drained)
    print("\ndrain (jobs/s of the drain alone; the goal):")
    print(render(summary, args.markdown))
    print("\nsubmit + drain (1 / (1/submit/s + 1/drain/s) of each run):")
    print(render(end_to_end, args.markdown))
    print(f"\nload averages before each run: {[r['load_before'][0] for r in runs]}")
    out = REPO / "bench" / "results" / "jobs" / f"compare-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "command": " ".join(
                    [".venv/bin/python -m bench.jobs_compare", *(argv if argv is not None else sys.argv[1:])]
                ),
                "started": started.isoformat(timespec="seconds"),
                "commits": commits,
                "summary": summary,
                "summary_submit_and_drain": end_to_end,
                "runs": [
                    {"side": r["side"], "load_before": r["load_before"], "summary": r["doc"]["summary"]} for r in runs
                ],
            },
            indent=2,
        )
    )
    print(f"results: {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
