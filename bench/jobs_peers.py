"""Tenure's job layer beside the Python job systems that keep durable jobs, in one run: a benchmark, not a test.

Run from the repository root (the peers come with the ``bench`` extra: ``.venv/bin/pip install -e '.[bench]'``;
Oban's Python 3.12 virtualenv is made at set-up, see :mod:`bench.peers.oban_peer`)::

    .venv/bin/python -m bench.jobs_peers [--n 10000] [--rounds 3] [--systems a,b,…] [--quick]

Systems (``--list``; ``--systems`` also takes ``tenure`` and ``peers``): the Tenure deployments of
:data:`bench.peers.tenure.VARIANTS` (SQLite; PostgreSQL + Redis and PostgreSQL + RabbitMQ with ``tenure relay``),
procrastinate, pgqueuer and Oban for Python on PostgreSQL, Celery with Redis broker and results, RQ with
``SimpleWorker`` and with fork-per-job, huey on SQLite. Each runs no-op jobs under its own worker CLI, on a store
made fresh for each round (:mod:`bench.peers.services`).

Per system and round (:mod:`bench.peers.phases`): submit/s of N jobs by one producer, no worker running; drain of
them by 1 worker process × 8 threads/tasks (gate-timed, ended by the system's own store showing all N done; then
the store must hold exactly the jobs done, else the round FAILS); N more submitted, drained by 2 × 8; enqueue→start
latency p50/p99 with a 1 × 8 worker at a steady 100 jobs/s for 10 s. Rounds alternate the systems (round 1: every
system in order, round 2: again, …); the load average is recorded before and after each system's round.

Printed: medians per system, and the issue's goals as ratios of medians with PASS/MISS
(:mod:`bench.peers.report`). Written: ``bench/results/peers/<timestamp>.json`` (gitignored), every round's numbers
and checks. The exit code is 1 if any round failed its check, 130 if interrupted (cleanup still runs: workers
stopped by PID, databases dropped, the Redis database flushed, RabbitMQ queues deleted, the scratch directory
removed unless a round failed or ``--workdir`` was given).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .broker_bench import _fs_type, _git, loadavg, log
from .peers import report, tenure
from .peers.celery_peer import Celery
from .peers.huey_peer import Huey
from .peers.oban_peer import VENV as OBAN_VENV
from .peers.oban_peer import Oban
from .peers.pgqueuer_peer import Pgqueuer
from .peers.phases import THREADS, Phase, drain, latency, log_tail, submit
from .peers.procrastinate_peer import Procrastinate
from .peers.rq_peer import FORK as RQ_FORK
from .peers.rq_peer import SIMPLE as RQ_SIMPLE
from .peers.system import RoundContext, System
from .procs import REPO

#: Every system, in the order of the issue's table (and of each round).
SYSTEMS: tuple[System, ...] = (
    *tenure.SYSTEMS,
    Pgqueuer(),
    Oban(),
    Huey(),
    RQ_SIMPLE,
    Celery(),
    Procrastinate(),
    RQ_FORK,
)
#: The smallest N: every worker process of a 2 × 8 drain (RQ: 16 of them) must get a job before the gate opens.
MIN_N = 100
PACKAGES = ("dramatiq", "procrastinate", "pgqueuer", "celery", "kombu", "rq", "huey", "redis", "psycopg", "pika")


def select(spec: str | None) -> list[System]:
    if not spec:
        return list(SYSTEMS)
    names = {n.strip() for n in spec.split(",") if n.strip()}
    groups = {
        "tenure": {s.name for s in SYSTEMS if s.group != "peer"},
        "peers": {s.name for s in SYSTEMS if s.group == "peer"},
    }
    wanted = set().union(*(groups.get(n, {n}) for n in names))
    unknown = wanted - {s.name for s in SYSTEMS}
    if unknown:
        raise SystemExit(f"unknown system(s) {', '.join(sorted(unknown))}: see --list")
    return [s for s in SYSTEMS if s.name in wanted]


def run_round(system: System, cfg: argparse.Namespace, workdir: Path, run_id: str, index: int) -> dict[str, Any]:
    """One system's round: submit, drain 1×8, submit, drain 2×8, latency. A failed check is recorded, not raised."""
    sysdir = workdir / f"r{index}-{system.name}"
    sysdir.mkdir(parents=True)
    rc = RoundContext(run_id, index, sysdir, sysdir / "processes.log")
    n = cfg.n
    res: dict[str, Any] = {"system": system.name, "round": index, "load_before": loadavg(), "error": None}
    t0 = time.monotonic()
    try:
        with system.deploy(rc) as d:
            try:
                phase = Phase(rc, d)
                res["submit_per_s"] = submit(phase, n)
                res["drain_1x8"] = drain(phase, 1, n, 0)
                res["drain_1x8_per_s"] = res["drain_1x8"]["per_s"]
                res["submit_again_per_s"] = submit(phase, n)
                res["drain_2x8"] = drain(phase, 2, n, n)
                res["drain_2x8_per_s"] = res["drain_2x8"]["per_s"]
                res["latency"] = latency(phase, cfg.latency_rate, cfg.latency_seconds, 2 * n)
                res["latency_p50_ms"] = res["latency"]["p50_ms"]
                res["latency_p99_ms"] = res["latency"]["p99_ms"]
            finally:
                d.close()
    except Exception as e:  # noqa: BLE001 - any failure fails this round loudly; the other systems still run
        res["error"] = f"{type(e).__name__}: {e}"
        log(f"round {index} {system.name}: FAILED: {res['error']}\n--- {rc.log} (tail) ---\n{log_tail(rc.log)}")
    res["load_after"] = loadavg()
    res["seconds"] = time.monotonic() - t0
    if res["error"] is None:
        lat = res["latency"]
        log(
            f"round {index} {system.name}: submit {res['submit_per_s']:,.0f}/s; drain 1x8 {res['drain_1x8_per_s']:,.0f}"
            f"/s, 2x8 {res['drain_2x8_per_s']:,.0f}/s; latency p50 {lat['p50_ms']:.1f} ms p99 {lat['p99_ms']:.1f} ms "
            f"({lat['samples']} at {lat['rate_achieved']:.0f}/s); checks ok; load {res['load_before']} -> "
            f"{res['load_after']}; {res['seconds']:.0f} s"
        )
    return res


def versions(systems: list[System]) -> dict[str, str]:
    out: dict[str, str] = {"python": sys.version.split()[0]}
    for p in PACKAGES:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = "not installed"
    if any(s.name == "oban" for s in systems):
        probe = "import importlib.metadata as m, sys; print(m.version('oban'), sys.version.split()[0])"
        got = subprocess.run([str(OBAN_VENV / "bin" / "python"), "-c", probe], capture_output=True, text=True)
        out["oban"], _, out["oban_python"] = got.stdout.strip().partition(" ")
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.jobs_peers", description=__doc__.split("\n")[0])
    p.add_argument("--systems", default=None, help="comma-separated names (see --list), or tenure / peers")
    p.add_argument("--n", type=int, default=None, help=f"jobs per drain (default 10000; quick 1000; >= {MIN_N})")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 3; quick 1)")
    p.add_argument("--latency-rate", type=float, default=100.0, help="jobs/s of the latency phase (default 100)")
    p.add_argument("--latency-seconds", type=float, default=None, help="its length (default 10 s; quick 3 s)")
    p.add_argument("--quick", action="store_true", help="N=1000, one round, 3 s of latency: a smoke run")
    p.add_argument("--workdir", default=None, help="scratch directory, kept (default: a temp dir)")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    p.add_argument("--no-save", action="store_true", help="do not write bench/results/peers/<timestamp>.json")
    p.add_argument("--list", action="store_true", help="list the systems and exit")
    args = p.parse_args(argv)
    args.n = args.n or (1_000 if args.quick else 10_000)
    args.rounds = args.rounds or (1 if args.quick else 3)
    if args.n < MIN_N:
        # Below that, one worker process may fetch every job before another holds one, and the gate never opens.
        p.error(f"--n must be at least {MIN_N}")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    args.latency_seconds = args.latency_seconds or (3.0 if args.quick else 10.0)
    return args


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for s in SYSTEMS:
            print(f"{s.name:<20} {s.group:<15} {s.label}")
        return 0
    systems = select(args.systems)
    # Handled here, even where the shell started this in the background with SIGINT ignored: an ignored signal
    # stays ignored in every program started from here, and RQ's worker pool stops its workers with SIGINT.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    run_id = uuid.uuid4().hex[:8]
    keep = args.workdir is not None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="tenure-peers-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC)
    doc: dict[str, Any] = {
        "command": " ".join([".venv/bin/python -m bench.jobs_peers", *(argv if argv is not None else sys.argv[1:])]),
        "started": started.isoformat(timespec="seconds"),
        "config": {
            "n": args.n,
            "rounds": args.rounds,
            "threads": THREADS,
            "latency_rate": args.latency_rate,
            "latency_seconds": args.latency_seconds,
            "systems": [s.name for s in systems],
            "tenure_variants": [asdict(v) for v in tenure.VARIANTS if v.name in {s.name for s in systems}],
            "workdir_fs": _fs_type(workdir),
        },
        "machine": {
            "cores": os.cpu_count(),
            "git_head": _git("rev-parse", "HEAD"),
            "git_dirty": _git("status", "--porcelain"),
        },
        "load_start": loadavg(),
        "rounds": [],
        "interrupted": False,
    }
    for s in systems:
        try:
            s.prepare(workdir / "setup.log")
        except Exception as e:
            print(f"set-up of {s.name} failed: {e}; see {workdir / 'setup.log'}", file=sys.stderr)
            return 1
    try:
        doc["versions"] = versions(systems)
        log(f"run {run_id}: {len(systems)} systems, n={args.n}, {args.rounds} rounds; workdir {workdir}")
        for index in range(1, args.rounds + 1):
            for s in systems:
                doc["rounds"].append(run_round(s, args, workdir, run_id, index))
    except KeyboardInterrupt:
        doc["interrupted"] = True
        log("interrupted: everything started has been stopped and removed")
    failed = [r for r in doc["rounds"] if r["error"] is not None]
    if not keep and not failed:
        shutil.rmtree(workdir, ignore_errors=True)
    doc["load_end"] = loadavg()
    doc["seconds"] = (datetime.now(UTC) - started).total_seconds()
    described = [{"name": s.name, "label": s.label, "group": s.group, "postgres": s.postgres} for s in systems]
    doc["summary"] = report.summarize(doc["rounds"], described)
    lines = report.goals(doc["summary"])
    doc["goals"] = [asdict(g) for g in lines]
    print()
    print(report.render(doc["summary"], lines, args.rounds, args.markdown))
    if failed:
        print(f"\n{len(failed)} round(s) FAILED (scratch kept: {workdir}):")
        for r in failed:
            print(f"  round {r['round']} {r['system']}: {r['error']}")
    print(f"\nload average start {doc['load_start']} end {doc['load_end']}; took {doc['seconds']:.0f} s")
    if not args.no_save:
        out = REPO / "bench" / "results" / "peers" / f"{started.strftime('%Y%m%dT%H%M%SZ')}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2))
        print(f"results: {out.relative_to(REPO)}")
    if doc["interrupted"]:
        return 130
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
