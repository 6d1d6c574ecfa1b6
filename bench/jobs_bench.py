"""Job-layer benchmark: jobs end to end through real Dramatiq workers, beside the raw SQLite broker, in one run.

Run from the repository root::

    .venv/bin/python -m bench.jobs_bench [--n 5000] [--rounds 3] [--quick]

One fresh SQLite file in a temporary directory on local disk is migrated to the head revision (what
``tenure db upgrade`` does: :func:`jobs.schema.upgrade`); the broker is a ``SQLiteBroker`` on that same file, as in
a default Tenure deployment (``TENURE_BROKER_URL`` unset), so a job's row and its message commit together.

What is measured, per round (each round alternates raw and jobs so both see the same machine load):

1. **raw enqueue/s** — one producer thread sends N plain messages (``actor.send``, the no-op actor of
   :mod:`bench.app`, queue ``tenure_bench``), no worker running.
2. **raw drain/s** — real ``python -m dramatiq bench.app --processes P --threads 8`` workers drain them; exactly
   :func:`bench.broker_bench.drain`: every message waits at a gate until all P processes hold one, drain/s =
   N / (gate opened → last message recorded in the shared-memory ledger).
2b. **raw + round trip msgs/s** — the same drain again (N more plain messages), but every actor call first waits
   for one empty write in its process's ack writer (``SQLiteBroker.write_with_acks``, ``BENCH_ROUND_TRIP=1``): the
   thread hand-off a job's claim makes, without any SQL of its own. Its ratio to raw drain/s is the ceiling a job
   layer with a claim per job before the actor starts can reach on this machine.
3. **submit/s** — one producer thread calls ``jobs.submit(engine, owner_id=…, kind="bench_job_noop", payload={})``
   N times (job row + status event + broker message in one transaction each), no worker running.
4. **jobs/s** — real ``python -m dramatiq bench.jobs_app --processes P --threads 8`` workers (the job middleware
   installed by ``jobs.install``) run them. The same drain function and gate, but the gate is a middleware in
   front of the job middleware (so every claim is inside the timed window) and a job is recorded only after its
   actor returned, i.e. after claim (queued → running + status event), ``ctx.progress(1.0, "done")`` and
   completion (running → succeeded + status event) have committed. jobs/s = N / (gate opened → last job recorded).
   Afterwards the job table must hold N more ``succeeded`` jobs with progress 1.0 (checked, reported).

Rounds are run for P = 1 and P = 2 (1 × 8 and 2 × 8 threads); the printed figures are medians over the rounds, with
the ratio jobs/s ÷ raw drain/s per round and its median (goal ≥ 0.5). The machine's load (``/proc/loadavg``) is
recorded before and after each round. Results go to ``bench/results/jobs/<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jobs
from jobs import schema
from settings.environment import Settings

from . import report
from .broker_bench import THREADS, Config, Target, _fs_type, _git, drain, enqueue_n, loadavg, log, producer
from .job_worker import build_broker
from .jobs_app import KIND, declare_kind
from .procs import REPO

OWNER = "bench"
GOAL_RATIO = 0.5


def settings_for(url: str) -> Settings:
    """The settings a worker reads from ``TENURE_DATABASE_URL=url`` and nothing else."""
    return Settings.from_env({"TENURE_DATABASE_URL": url})


def worker_env(url: str) -> dict[str, str]:
    # Only the database URL: every other TENURE_* setting at its default, whatever this shell has set.
    return {"TENURE_DATABASE_URL": url, "TENURE_BROKER_URL": "", "TENURE_JOB_LEASE_TTL_S": ""}


def submit_n(url: str, n: int) -> float:
    """Submit *n* no-op jobs from this thread; returns submits per second."""
    settings = settings_for(url)
    broker = build_broker(settings)
    registry = jobs.Registry()
    declare_kind(broker, registry)
    engine = jobs.make_engine(url, busy_timeout_ms=settings.sqlite_busy_timeout_ms)
    try:
        jobs.submit(engine, owner_id=OWNER, kind=KIND, payload={}, registry=registry, settings=settings)  # warm-up
        t0 = time.perf_counter()
        for _ in range(n - 1):
            jobs.submit(engine, owner_id=OWNER, kind=KIND, payload={}, registry=registry, settings=settings)
        return (n - 1) / (time.perf_counter() - t0)
    finally:
        engine.dispose()
        broker.close()


def raw_enqueue(target: Target, n: int) -> float:
    with producer(target) as actor:
        actor.send(0.0)  # warm-up (connection, schema check); counted in the drain like the others
        return enqueue_n(actor, n - 1)


def job_counts(path: str) -> dict[str, Any]:
    with sqlite3.connect(path) as conn:
        by_status = dict(conn.execute("SELECT status, count(*) FROM jobs GROUP BY status").fetchall())
        done_with_progress = conn.execute(
            "SELECT count(*) FROM jobs WHERE status = 'succeeded' AND progress = 1.0 AND progress_message = 'done'"
        ).fetchone()[0]
        attempts = conn.execute("SELECT max(attempt) FROM jobs").fetchone()[0]
        pending = conn.execute("SELECT count(*) FROM broker_messages WHERE state IN (0, 1)").fetchone()[0]
    return {
        "by_status": by_status,
        "succeeded_with_progress": done_with_progress,
        "max_attempt": attempts,
        "broker_pending": pending,
    }


def run_round(cfg: Config, url: str, processes: int, index: int) -> dict[str, Any]:
    """raw enqueue → raw drain → submit → jobs drain, all with P × 8 workers; returns this round's numbers."""
    tag = f"{processes}x{THREADS}"
    path = url[len("sqlite:///") :]
    raw = Target("raw", url, {}, ())
    res: dict[str, Any] = {"processes": processes, "load_before": loadavg()}
    res["raw_enqueue_per_s"] = raw_enqueue(raw, cfg.n)
    d = drain(cfg, raw, processes, cfg.n, f"{tag}-{index}")
    res["raw_drain_per_s"], res["raw_drain"] = d["per_s"], d
    # The same drain with one empty round trip to the ack writer per message (what a job's claim waits
    # for, without its SQL): how much of the gap the hand-off alone explains.
    raw_enqueue(raw, cfg.n)
    rt = drain(cfg, raw, processes, cfg.n, f"{tag}-{index}-rt", extra_env={"BENCH_ROUND_TRIP": "1"})
    res["round_trip_per_s"], res["round_trip_drain"] = rt["per_s"], rt
    before = job_counts(path)["by_status"].get("succeeded", 0)
    res["submit_per_s"] = submit_n(url, cfg.n)
    jt = Target("jobs", url, {}, ())
    j = drain(cfg, jt, processes, cfg.n, f"{tag}-{index}", app="bench.jobs_app", extra_env=worker_env(url))
    res["jobs_per_s"], res["jobs_drain"] = j["per_s"], j
    time.sleep(0.2)  # the last job's ack may still be in flight when the ledger shows it; nothing else
    counts = job_counts(path)
    res["check"] = counts
    res["check_ok"] = (
        counts["by_status"].get("succeeded", 0) - before == cfg.n
        and counts["succeeded_with_progress"] == counts["by_status"].get("succeeded", 0)
        and set(counts["by_status"]) == {"succeeded"}
    )
    res["ratio"] = res["jobs_per_s"] / res["raw_drain_per_s"]
    res["round_trip_ratio"] = res["round_trip_per_s"] / res["raw_drain_per_s"]
    res["load_after"] = loadavg()
    log(
        f"round {index} {tag}: raw enqueue {res['raw_enqueue_per_s']:,.0f}/s drain {res['raw_drain_per_s']:,.0f}/s; "
        f"raw+round trip {res['round_trip_per_s']:,.0f}/s ({res['round_trip_ratio']:.2f}); "
        f"submit {res['submit_per_s']:,.0f}/s jobs {res['jobs_per_s']:,.0f}/s; ratio {res['ratio']:.2f}; "
        f"worker CPU % raw {_cpu(d)} jobs {_cpu(j)}; "
        f"check {'ok' if res['check_ok'] else 'FAILED ' + json.dumps(counts)}; load {res['load_after']}"
    )
    return res


def _cpu(drained: dict[str, Any]) -> str:
    return "/".join(f"{v:.0f}" for v in drained.get("worker_cpu_pct", []))


def summarize(rounds: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for p in sorted({r["processes"] for r in rounds}):
        rs = [r for r in rounds if r["processes"] == p]
        out[f"{p}x{THREADS}"] = {
            k: statistics.median(r[k] for r in rs)
            for k in (
                "raw_enqueue_per_s",
                "raw_drain_per_s",
                "round_trip_per_s",
                "round_trip_ratio",
                "submit_per_s",
                "jobs_per_s",
                "ratio",
            )
        }
    return out


def render(summary: dict[str, dict[str, float]], rounds: int, markdown: bool = False) -> str:
    rows = [[f"metric (median of {rounds} rounds)", *summary]]
    for key, label, fmt in (
        ("raw_enqueue_per_s", "raw enqueue/s (1 producer)", "{:,.0f}"),
        ("submit_per_s", "jobs.submit/s (1 producer)", "{:,.0f}"),
        ("raw_drain_per_s", "raw drain msgs/s", "{:,.0f}"),
        ("round_trip_per_s", "raw + 1 ack-writer round trip msgs/s", "{:,.0f}"),
        ("round_trip_ratio", "  that / raw msgs/s (per-round)", "{:.2f}"),
        ("jobs_per_s", "jobs/s end to end", "{:,.0f}"),
        ("ratio", "jobs/s / raw msgs/s (per-round)", "{:.2f}"),
    ):
        rows.append([label, *(fmt.format(summary[c][key]) for c in summary)])
    goals = [["goal", "measured", "target", "verdict"]]
    for c, m in summary.items():
        goals.append(
            [
                f"jobs/s / raw drain/s, {c}",
                f"{m['ratio']:.2f}",
                f">= {GOAL_RATIO:.2f}",
                "PASS" if m["ratio"] >= GOAL_RATIO else "MISS",
            ]
        )
    table = report._table  # noqa: SLF001 - the broker benchmark's table formatter
    return table(rows, markdown) + "\n\n" + table(goals, markdown)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.jobs_bench", description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=None, help="messages / jobs per phase (default 5000; quick 1000)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per worker shape (default 3; quick 1)")
    p.add_argument("--processes", default="1,2", help="worker processes per shape, comma-separated (default 1,2)")
    p.add_argument("--quick", action="store_true", help="N=1000, one round")
    p.add_argument("--workdir", default=None, help="directory for the SQLite file and logs (default: a temp dir)")
    p.add_argument("--no-save", action="store_true", help="do not write bench/results/jobs/<timestamp>.json")
    return p.parse_args(argv)


def _fair_share_off(url: str) -> None:
    """Save ``fair_share.enabled: false`` (``BENCH_FAIR_SHARE=off``): every job gets its message at submit,
    as before admission existed, to measure the job layer without it."""
    from settings.runtime import put_settings

    engine = jobs.make_engine(url)
    try:
        put_settings(engine, {"fair_share.enabled": False}, 0, "bench")
    finally:
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    n = args.n or (1_000 if args.quick else 5_000)
    rounds = args.rounds or (1 if args.quick else 3)
    shapes = [int(x) for x in args.processes.split(",") if x.strip()]
    keep = args.workdir is not None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="tenure-jobs-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = Config(n=n, latency_s=0, rate=0, idle_s=0, backlog_small=0, backlog_large=0, workdir=workdir)
    url = f"sqlite:///{workdir}/tenure.db"
    started = datetime.now(UTC)
    doc: dict[str, Any] = {
        "command": " ".join([".venv/bin/python -m bench.jobs_bench", *(argv if argv is not None else sys.argv[1:])]),
        "started": started.isoformat(timespec="seconds"),
        "config": {"n": n, "rounds": rounds, "shapes": shapes, "threads": THREADS, "workdir_fs": _fs_type(workdir)},
        "machine": {
            "cores": os.cpu_count(),
            "sqlite": sqlite3.sqlite_version,
            "git_head": _git("rev-parse", "HEAD"),
            "git_dirty": _git("status", "--porcelain", "broker", "jobs"),
        },
        "load_start": loadavg(),
        "rounds": [],
    }
    try:
        revision = schema.upgrade(url)
        if os.environ.get("BENCH_FAIR_SHARE") == "off":
            _fair_share_off(url)
            doc["config"]["fair_share"] = "off"
        log(f"workdir {workdir} ({doc['config']['workdir_fs']}); schema {revision}; load {doc['load_start']}")
        for i in range(rounds):
            for p in shapes:
                doc["rounds"].append(run_round(cfg, url, p, i + 1))
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    doc["load_end"] = loadavg()
    doc["seconds"] = (datetime.now(UTC) - started).total_seconds()
    doc["summary"] = summarize(doc["rounds"])
    doc["all_checks_ok"] = all(r["check_ok"] for r in doc["rounds"])
    print()
    print(render(doc["summary"], rounds))
    print(f"\njob table checks: {'all ok' if doc['all_checks_ok'] else 'FAILED (see the JSON)'}")
    print(f"load average start {doc['load_start']} end {doc['load_end']}; took {doc['seconds']:.0f} s")
    if not args.no_save:
        out = REPO / "bench" / "results" / "jobs" / f"{started.strftime('%Y%m%dT%H%M%SZ')}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2))
        print(f"results: {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
