"""Fairness benchmark: owner B's start latency while owner A floods, and throughput with fairness and limits on vs off.

Run from the repository root::

    .venv/bin/python -m bench.fairness_bench [--rounds 3] [--quick] [--window W] [--split]

The default deployment: one SQLite file migrated to head (a template made once with :func:`jobs.schema.upgrade`,
copied fresh for every measurement, so each starts from the same empty state), the ``SQLiteBroker`` on that file,
and real ``python -m dramatiq bench.fairness_app --processes 2 --threads 8`` workers. The kinds are
:mod:`bench.fairness_app`'s no-ops on one queue: ``bench_fair_limited`` (a per-owner concurrency limit of 1,000,
which never limits how many run but runs the limit's bookkeeping on every submit, claim and completion) and
``bench_fair_plain`` (no limit). Runtime settings are saved with :func:`settings.runtime.put_settings` before the
workers start.

Each round measures, in this order:

1. **B idle** — fair share on (``fair_share.enabled = true``, the default window unless ``--window``). Workers
   start and are warmed up (every process logged "ready for action", 32 warm-up jobs done, 1 s pause); then owner B
   submits ``bench_fair_limited`` jobs one by one at a steady 20/s for 10 s (one ``jobs.submit`` transaction each).
   Each job's start latency is its row's ``started_at - created_at`` (``created_at`` is taken by ``jobs.submit``
   before its transaction, ``started_at`` by the claim); p50 / p99 over B's jobs. It is also split in two: the
   ``jobs.submit`` call itself (mostly waiting for SQLite's writer lock when workers hold it) and from the call's
   return to ``started_at``.
2. **B under flood** — the same settings, a fresh file. Owner A first queues a flood of 20,000
   ``bench_fair_limited`` jobs (500 per transaction); then the workers start on it, and once the first 32 of A's
   jobs are done, B submits exactly as in (1) while A's backlog drains. B's latency counts only B's jobs created
   before A's last start (while A still had jobs waiting; the number is reported). Also A's throughput meanwhile
   (A's jobs completed during B's submit window ÷ its length).
3. **throughput on vs off** — N jobs (default 10,000) of four owners, queued owner after owner (each owner's
   jobs together, as a flood would), then drained by the workers exactly as :func:`bench.broker_bench.drain` does
   (a gate in front of the job middleware until every process holds a message; N ÷ (gate → last completion
   committed)). **On**: ``fair_share.enabled = true`` (and ``--window``), every other job of the limited kind.
   **Off**: ``fair_share.enabled = false`` and every job of the plain kind (no limit declared): admission still runs
   (each submit's verdict, with nothing to count; each claim batch's look for waiting jobs of its queue) but has
   nothing to hold. ``--split`` adds "fair share only" (on, all plain) and "limits only" (off, every other job
   limited: with N = 10,000, 1,250 limited jobs per owner, so 250 of each owner's wait for their key, as the limit
   counts admitted jobs, until others finish). The variants
   alternate (in order in odd rounds, reversed in even ones); each one's jobs/s ÷ off's, per round, and the same
   with the submit counted too, 1 / (1/submit + 1/drain) (with fair share on, a held job's message is written in
   the drain instead of the submit).

Afterwards every measurement checks its job rows (every job succeeded, none left waiting). Goals (from issue 17),
judged on the median of the per-round ratios: B's p99 under flood ≤ 2 × B's p99 idle; throughput on ≥ 0.85 × off.
The machine's load (``/proc/loadavg``) is recorded around every phase. Results go to
``bench/results/fairness/<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

import jobs
from jobs import schema
from settings.environment import Settings
from settings.runtime import put_settings

from . import report
from .broker_bench import THREADS, Config, Target, _fs_type, _git, _pct, drain, loadavg, log, wait_until
from .fairness_app import LIMITED, PLAIN, declare_kinds
from .job_worker import build_broker
from .jobs_bench import settings_for, worker_env
from .ledger import LedgerReader
from .procs import REPO, Workers

APP = "bench.fairness_app"
OWNER_A = "flood-a"
OWNER_B = "steady-b"
WARMUP_OWNER = "warm-up"
THROUGHPUT_OWNERS = ("owner-1", "owner-2", "owner-3", "owner-4")
#: Jobs done before B starts submitting (the workers have connected, fetched and claimed: they are warm).
WARMUP_JOBS = 32
SUBMIT_BATCH = 500
GOAL_LATENCY_RATIO = 2.0
GOAL_THROUGHPUT_RATIO = 0.85
READY_LINE = b"Worker process is ready for action."


@dataclass(frozen=True)
class FairConfig:
    workdir: Path
    template: Path
    processes: int
    rate: float
    seconds: float
    flood: int
    n: int
    window: int | None

    def settings(self, fair_share: bool) -> dict[str, Any]:
        """The runtime settings batch of a variant (saved before its workers start)."""
        values: dict[str, Any] = {"fair_share.enabled": fair_share}
        if fair_share and self.window is not None:
            values["fair_share.window"] = self.window
        return values


@dataclass(frozen=True)
class Variant:
    """A throughput drain's configuration: fair share on or off, and which jobs are of the limited kind."""

    name: str
    fair_share: bool
    #: Every *limited_every*-th job is of the limited kind, the others of the plain one (0: none).
    limited_every: int

    def kind(self, i: int) -> str:
        return LIMITED if self.limited_every and i % self.limited_every == 0 else PLAIN


ON = Variant("on", fair_share=True, limited_every=2)
OFF = Variant("off", fair_share=False, limited_every=0)
#: ``--split``: what each half of "on" costs alone.
FAIR_ONLY = Variant("fair share only", fair_share=True, limited_every=0)
LIMITS_ONLY = Variant("limits only", fair_share=False, limited_every=2)


@dataclass(frozen=True)
class Submitted:
    """One of B's jobs as its submitter saw it."""

    job_id: str
    #: How long the ``jobs.submit`` call took (mostly waiting for SQLite's writer lock when it is busy).
    took_ms: float
    #: Wall-clock time (ms) the call returned: its transaction had committed.
    returned_ms: float


@dataclass
class Client:
    """The submitting side: an engine on the deployment's file and a registry with the benchmark's kinds."""

    engine: Engine
    registry: jobs.Registry
    settings: Settings

    def submit(self, owner_id: str, kind: str, target: Engine | Session | None = None) -> str:
        """One no-op job (committed now, or in *target*'s transaction); its id."""
        return jobs.submit(
            target or self.engine,
            owner_id=owner_id,
            kind=kind,
            payload={},
            registry=self.registry,
            settings=self.settings,
        ).id

    def submit_many(self, plan: Sequence[tuple[str, str]]) -> float:
        """Submit ``(owner, kind)`` jobs, :data:`SUBMIT_BATCH` per transaction; returns submits per second."""
        t0 = time.perf_counter()
        for start in range(0, len(plan), SUBMIT_BATCH):
            with Session(self.engine) as session, session.begin():
                for owner_id, kind in plan[start : start + SUBMIT_BATCH]:
                    self.submit(owner_id, kind, session)
        return len(plan) / (time.perf_counter() - t0)

    def steady(self, owner_id: str, kind: str, rate: float, seconds: float) -> tuple[list[Submitted], float]:
        """Submit one job every 1/*rate* s for *seconds*, one transaction each; returns the jobs and the rate
        achieved."""
        submitted: list[Submitted] = []
        count = int(rate * seconds)
        start = time.perf_counter()
        for i in range(count):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            t0 = time.perf_counter()
            job_id = self.submit(owner_id, kind)
            submitted.append(Submitted(job_id, 1000 * (time.perf_counter() - t0), 1000 * time.time()))
        return submitted, count / (time.perf_counter() - start)


@contextlib.contextmanager
def client(url: str) -> Iterator[Client]:
    settings = settings_for(url)
    broker = build_broker(settings)
    registry = jobs.Registry()
    declare_kinds(broker, registry)
    engine = jobs.make_engine(url, busy_timeout_ms=settings.sqlite_busy_timeout_ms)
    try:
        yield Client(engine, registry, settings)
    finally:
        engine.dispose()
        broker.close()


# -- deployments -------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def deployment(cfg: FairConfig, name: str, fair_share: bool) -> Iterator[str]:
    """A fresh copy of the migrated template with the variant's runtime settings saved; yields its URL and
    removes the file afterwards."""
    path = cfg.workdir / f"{name}.db"
    shutil.copyfile(cfg.template, path)
    url = f"sqlite:///{path}"
    engine = jobs.make_engine(url)
    try:
        put_settings(engine, cfg.settings(fair_share), 0, "bench")
    finally:
        engine.dispose()
    try:
        yield url
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


@contextlib.contextmanager
def running_workers(cfg: FairConfig, url: str, tag: str) -> Iterator[LedgerReader]:
    """P × 8 workers of :mod:`bench.fairness_app` with the gate open, every process ready; stopped on exit."""
    ledger = LedgerReader(str(cfg.workdir / f"ledger-{tag}"))
    ledger.reset()
    ledger.open_gate()
    log_path = cfg.workdir / f"workers-{tag}.log"
    workers = Workers(
        url, {}, ledger.directory, cfg.processes, THREADS, str(log_path), app=APP, extra_env=worker_env(url)
    )
    try:
        wait_until(
            lambda: log_path.read_bytes().count(READY_LINE) >= cfg.processes,
            90,
            f"{cfg.processes} worker processes ready",
            workers.check,
        )
        yield ledger
    finally:
        workers.stop()


def _rows(path: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql, args).fetchall()


def _count(path: str, sql: str, *args: Any) -> int:
    return int(_rows(path, sql, *args)[0][0])


def _succeeded(path: str, owner_id: str) -> int:
    return _count(path, "SELECT count(*) FROM jobs WHERE owner_id = ? AND status = 'succeeded'", owner_id)


def b_latencies(path: str, submitted: Sequence[Submitted], created_before: int | None = None) -> dict[str, Any]:
    """B's start latencies: ``started_at - created_at`` of each job (the goal's; ``created_at`` is taken before the
    submit's transaction), of it the submit call, and from the submit's return to the start. Only jobs created at
    or before *created_before*."""
    rows = {
        job_id: (created, started)
        for job_id, created, started in _rows(
            path, "SELECT id, created_at, started_at FROM jobs WHERE owner_id = ? AND started_at IS NOT NULL", OWNER_B
        )
    }
    mine = [(s, *rows[s.job_id]) for s in submitted if created_before is None or rows[s.job_id][0] <= created_before]
    latencies = sorted(float(started - created) for _, created, started in mine)
    return {
        "b": _latency_stats(latencies),
        "b_submit_call_ms": _latency_stats(sorted(s.took_ms for s, _, _ in mine)),
        "b_after_submit_ms": _latency_stats(sorted(started - s.returned_ms for s, _, started in mine)),
        "samples_ms": latencies,
    }


def _check(path: str, expected: int) -> dict[str, Any]:
    """The deployment's job rows: by status, and how many still wait for admission."""
    by_status = dict(_rows(path, "SELECT status, count(*) FROM jobs GROUP BY status"))
    held = _count(path, "SELECT count(*) FROM jobs WHERE held IS NOT NULL")
    return {"by_status": by_status, "held": held, "ok": by_status.get("succeeded", 0) == expected and held == 0}


def _latency_stats(values: list[float]) -> dict[str, Any]:
    return {
        "samples": len(values),
        "p50_ms": _pct(values, 50),
        "p90_ms": _pct(values, 90),
        "p99_ms": _pct(values, 99),
        "max_ms": values[-1] if values else float("nan"),
    }


# -- phases ------------------------------------------------------------------------------------------------------


def b_idle(cfg: FairConfig, index: int) -> dict[str, Any]:
    """B submits at a steady rate on an otherwise idle system (warm workers)."""
    res: dict[str, Any] = {"load_before": loadavg()}
    with deployment(cfg, f"idle-{index}", fair_share=True) as url, client(url) as c:
        path = url[len("sqlite:///") :]
        with running_workers(cfg, url, f"idle-{index}") as ledger:
            c.submit_many([(WARMUP_OWNER, LIMITED)] * WARMUP_JOBS)
            wait_until(lambda: ledger.total() >= WARMUP_JOBS, 60, "the warm-up jobs")
            time.sleep(1.0)
            submitted, res["rate_achieved"] = c.steady(OWNER_B, LIMITED, cfg.rate, cfg.seconds)
            count = len(submitted)
            wait_until(lambda: _succeeded(path, OWNER_B) >= count, 60, "B's jobs")
        res.update(b_latencies(path, submitted))
        res["check"] = _check(path, WARMUP_JOBS + count)
    res["b_submitted"] = count
    res["load_after"] = loadavg()
    log(
        f"round {index} B idle: p50 {res['b']['p50_ms']:.1f} ms p99 {res['b']['p99_ms']:.1f} ms "
        f"({count} jobs at {res['rate_achieved']:.1f}/s); check {'ok' if res['check']['ok'] else res['check']}; "
        f"load {res['load_after']}"
    )
    return res


def b_under_flood(cfg: FairConfig, index: int) -> dict[str, Any]:
    """A queues a flood; B submits at the same steady rate while A's backlog drains."""
    res: dict[str, Any] = {"load_before": loadavg()}
    with deployment(cfg, f"flood-{index}", fair_share=True) as url, client(url) as c:
        path = url[len("sqlite:///") :]
        res["flood_submit_per_s"] = c.submit_many([(OWNER_A, LIMITED)] * cfg.flood)
        with running_workers(cfg, url, f"flood-{index}") as ledger:
            wait_until(lambda: ledger.total() >= WARMUP_JOBS, 60, "A's first jobs")
            window_start = jobs.store.now_ms()
            submitted, res["rate_achieved"] = c.steady(OWNER_B, LIMITED, cfg.rate, cfg.seconds)
            count = len(submitted)
            window_end = jobs.store.now_ms()
            res["a_waiting_at_b_end"] = _count(
                path, "SELECT count(*) FROM jobs WHERE owner_id = ? AND started_at IS NULL", OWNER_A
            )
            wait_until(lambda: _succeeded(path, OWNER_B) >= count, 60 + cfg.flood / 100, "B's jobs")
        a_last_start = _count(path, "SELECT max(started_at) FROM jobs WHERE owner_id = ?", OWNER_A)
        res.update(b_latencies(path, submitted, created_before=a_last_start))
        a_done = _count(
            path,
            "SELECT count(*) FROM jobs WHERE owner_id = ? AND status = 'succeeded' AND completed_at BETWEEN ? AND ?",
            OWNER_A,
            window_start,
            window_end,
        )
        by_status = dict(_rows(path, "SELECT status, count(*) FROM jobs WHERE owner_id = ? GROUP BY status", OWNER_B))
    res["b_submitted"] = count
    res["b_under_flood"] = res["b"]["samples"]
    res["b_check"] = {"by_status": by_status, "ok": by_status == {"succeeded": count}}
    res["a_per_s"] = a_done / ((window_end - window_start) / 1000)
    res["load_after"] = loadavg()
    log(
        f"round {index} B under flood: p50 {res['b']['p50_ms']:.1f} ms p99 {res['b']['p99_ms']:.1f} ms "
        f"({res['b_under_flood']} of {count} jobs while A waited; A {res['a_per_s']:,.0f} jobs/s meanwhile, "
        f"{res['a_waiting_at_b_end']:,} of A's left when B's last was submitted); "
        f"check {'ok' if res['b_check']['ok'] else res['b_check']}; load {res['load_after']}"
    )
    return res


def throughput(cfg: FairConfig, variant: Variant, index: int) -> dict[str, Any]:
    """Drain N jobs of four owners under *variant*; jobs/s and the job table's check."""
    res: dict[str, Any] = {"variant": variant.name, "load_before": loadavg()}
    per_owner = cfg.n // len(THROUGHPUT_OWNERS)
    plan = [(owner, variant.kind(i)) for owner in THROUGHPUT_OWNERS for i in range(per_owner)]
    with deployment(cfg, f"{variant.name}-{index}", fair_share=variant.fair_share) as url:
        path = url[len("sqlite:///") :]
        with client(url) as c:
            res["submit_per_s"] = c.submit_many(plan)
        res["held_before"] = _count(path, "SELECT count(*) FROM jobs WHERE held IS NOT NULL")
        drain_cfg = Config(
            n=len(plan), latency_s=0, rate=0, idle_s=0, backlog_small=0, backlog_large=0, workdir=cfg.workdir
        )
        target = Target(f"fair-{variant.name}", url, {}, ())
        d = drain(drain_cfg, target, cfg.processes, len(plan), str(index), app=APP, extra_env=worker_env(url))
        time.sleep(0.2)  # the last completion's ack may still be in flight when the ledger shows it
        res["check"] = _check(path, len(plan))
    res["jobs_per_s"], res["drain"] = d["per_s"], d
    res["load_after"] = loadavg()
    log(
        f"round {index} throughput {variant.name}: {res['jobs_per_s']:,.0f} jobs/s "
        f"(submit {res['submit_per_s']:,.0f}/s, {res['held_before']:,} waiting before the drain); "
        f"check {'ok' if res['check']['ok'] else res['check']}; load {res['load_after']}"
    )
    return res


def run_round(cfg: FairConfig, index: int, variants: Sequence[Variant]) -> dict[str, Any]:
    """One round: B idle, B under flood, then the throughput variants (reversed in even rounds)."""
    idle = b_idle(cfg, index)
    flood = b_under_flood(cfg, index)
    drains = {v.name: throughput(cfg, v, index) for v in (variants if index % 2 else variants[::-1])}
    checks = [idle["check"]["ok"], flood["b_check"]["ok"], *(d["check"]["ok"] for d in drains.values())]
    return {
        "index": index,
        "idle": idle,
        "flood": flood,
        "throughput": drains,
        "latency_ratio": flood["b"]["p99_ms"] / idle["b"]["p99_ms"],
        # every variant's jobs/s relative to "off" (the goal is "on")
        "throughput_ratios": {name: d["jobs_per_s"] / drains["off"]["jobs_per_s"] for name, d in drains.items()},
        # the same with the submit counted too: fair share writes a held job's message in the drain, not the submit
        "end_to_end_ratios": {name: _end_to_end(d) / _end_to_end(drains["off"]) for name, d in drains.items()},
        "checks_ok": all(checks),
    }


def _end_to_end(drain: dict[str, Any]) -> float:
    """Jobs/s from the first submit to the last completion, the two phases back to back: 1 / (1/submit + 1/drain)."""
    return 1 / (1 / drain["submit_per_s"] + 1 / drain["jobs_per_s"])


# -- report ------------------------------------------------------------------------------------------------------


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds (ratios: the median of the per-round ratios), and the p99s of all rounds' samples."""

    def med(values: list[float]) -> float:
        return statistics.median(values)

    variants = list(rounds[0]["throughput"])
    out: dict[str, Any] = {}
    for phase in ("idle", "flood"):
        for part, name in (("b", ""), ("b_submit_call_ms", "submit_call_"), ("b_after_submit_ms", "after_submit_")):
            for p in ("p50", "p99"):
                out[f"{phase}_{name}{p}_ms"] = med([r[phase][part][f"{p}_ms"] for r in rounds])
        out[f"pooled_{phase}_p99_ms"] = _pct(sorted(v for r in rounds for v in r[phase]["samples_ms"]), 99)
    return {
        **out,
        "a_per_s": med([r["flood"]["a_per_s"] for r in rounds]),
        "latency_ratio": med([r["latency_ratio"] for r in rounds]),
        "jobs_per_s": {v: med([r["throughput"][v]["jobs_per_s"] for r in rounds]) for v in variants},
        "throughput_ratios": {v: med([r["throughput_ratios"][v] for r in rounds]) for v in variants},
        "end_to_end_ratios": {v: med([r["end_to_end_ratios"][v] for r in rounds]) for v in variants},
    }


def render(summary: dict[str, Any], rounds: list[dict[str, Any]], cfg: FairConfig, markdown: bool = False) -> str:
    """The per-round table with medians, the pooled p99s and the goal verdicts."""
    rows = [["metric", *(f"round {r['index']}" for r in rounds), "median"]]

    def row(label: str, values: list[float], fmt: str, median: float) -> None:
        rows.append([label, *(fmt.format(v) for v in values), fmt.format(median)])

    for phase, label in (("idle", "idle"), ("flood", "A flooding")):
        for p in ("p50", "p99"):
            row(f"B {p} ms, {label}", [r[phase]["b"][f"{p}_ms"] for r in rounds], "{:.1f}", summary[f"{phase}_{p}_ms"])
        for part, name, what in (
            ("b_submit_call_ms", "submit_call_", "in the submit call"),
            ("b_after_submit_ms", "after_submit_", "after it returned"),
        ):
            values = [r[phase][part]["p99_ms"] for r in rounds]
            row(f"  p99 {what}", values, "{:.1f}", summary[f"{phase}_{name}p99_ms"])
    row("  p99 flood / p99 idle", [r["latency_ratio"] for r in rounds], "{:.2f}", summary["latency_ratio"])
    row("A jobs/s meanwhile", [r["flood"]["a_per_s"] for r in rounds], "{:,.0f}", summary["a_per_s"])
    for v, per_s in summary["jobs_per_s"].items():
        row(f"jobs/s, {v}", [r["throughput"][v]["jobs_per_s"] for r in rounds], "{:,.0f}", per_s)
    for v, ratio in summary["throughput_ratios"].items():
        if v != OFF.name:
            row(f"  {v} / off", [r["throughput_ratios"][v] for r in rounds], "{:.2f}", ratio)
    for v, ratio in summary["end_to_end_ratios"].items():
        if v != OFF.name:
            row(f"  {v} / off, submit + drain", [r["end_to_end_ratios"][v] for r in rounds], "{:.2f}", ratio)
    table = report._table  # noqa: SLF001 - the broker benchmark's table formatter
    latency, on = summary["latency_ratio"], summary["throughput_ratios"][ON.name]
    goals = [
        ["goal (median of per-round ratios)", "measured", "target", "verdict"],
        [
            f"B p99 under flood / idle (B {cfg.rate:g}/s for {cfg.seconds:g} s, flood {cfg.flood:,})",
            f"{latency:.2f}",
            f"<= {GOAL_LATENCY_RATIO:.2f}",
            "PASS" if latency <= GOAL_LATENCY_RATIO else "MISS",
        ],
        [
            f"jobs/s on / off (N = {cfg.n:,}, {cfg.processes}x{THREADS})",
            f"{on:.2f}",
            f">= {GOAL_THROUGHPUT_RATIO:.2f}",
            "PASS" if on >= GOAL_THROUGHPUT_RATIO else "MISS",
        ],
    ]
    pooled = (
        f"all rounds' samples pooled: B p99 idle {summary['pooled_idle_p99_ms']:.1f} ms, "
        f"under flood {summary['pooled_flood_p99_ms']:.1f} ms"
    )
    return table(rows, markdown) + "\n\n" + pooled + "\n\n" + table(goals, markdown)


# -- main --------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.fairness_bench", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 3; quick 1)")
    p.add_argument("--processes", type=int, default=2, help="worker processes of 8 threads (default 2)")
    p.add_argument("--rate", type=float, default=20.0, help="B's submits per second (default 20)")
    p.add_argument("--seconds", type=float, default=None, help="how long B submits (default 10; quick 3)")
    p.add_argument("--flood", type=int, default=None, help="A's flood, jobs (default 20000; quick 4000)")
    p.add_argument("--n", type=int, default=None, help="jobs per throughput drain (default 10000; quick 2000)")
    p.add_argument("--window", type=int, default=None, help="save fair_share.window (default: the setting's default)")
    p.add_argument("--split", action="store_true", help="also drain with fair share only and with limits only")
    p.add_argument("--quick", action="store_true", help="a smoke run: one short round")
    p.add_argument("--workdir", default=None, help="directory for the SQLite files and logs (default: a temp dir)")
    p.add_argument("--no-save", action="store_true", help="do not write bench/results/fairness/<timestamp>.json")
    args = p.parse_args(argv)
    # A drain's gate opens once every process holds a message; each prefetches up to 2 × 8, so the window
    # must leave the last process at least one.
    if args.window is not None and args.window <= 2 * THREADS * (args.processes - 1):
        p.error(f"--window must be more than {2 * THREADS * (args.processes - 1)} with {args.processes} processes")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    keep = args.workdir is not None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="tenure-fairness-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = FairConfig(
        workdir=workdir,
        template=workdir / "template.db",
        processes=args.processes,
        rate=args.rate,
        seconds=args.seconds or (3.0 if args.quick else 10.0),
        flood=args.flood or (4_000 if args.quick else 20_000),
        n=args.n or (2_000 if args.quick else 10_000),
        window=args.window,
    )
    rounds = args.rounds or (1 if args.quick else 3)
    variants = [ON, OFF, FAIR_ONLY, LIMITS_ONLY] if args.split else [ON, OFF]
    started = datetime.now(UTC)
    doc: dict[str, Any] = {
        "command": " ".join(
            [".venv/bin/python -m bench.fairness_bench", *(argv if argv is not None else sys.argv[1:])]
        ),
        "started": started.isoformat(timespec="seconds"),
        "config": {
            "rounds": rounds,
            "processes": cfg.processes,
            "threads": THREADS,
            "rate": cfg.rate,
            "seconds": cfg.seconds,
            "flood": cfg.flood,
            "n": cfg.n,
            "window": cfg.window,
            "variants": [v.name for v in variants],
            "workdir_fs": _fs_type(workdir),
        },
        "machine": {
            "cores": os.cpu_count(),
            "sqlite": sqlite3.sqlite_version,
            "git_head": _git("rev-parse", "HEAD"),
            "git_dirty": _git("status", "--porcelain", "broker", "jobs", "settings"),
        },
        "load_start": loadavg(),
        "rounds": [],
    }
    try:
        revision = schema.upgrade(f"sqlite:///{cfg.template}")
        log(f"workdir {workdir} ({doc['config']['workdir_fs']}); schema {revision}; load {doc['load_start']}")
        for i in range(rounds):
            doc["rounds"].append(run_round(cfg, i + 1, variants))
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    doc["load_end"] = loadavg()
    doc["seconds"] = (datetime.now(UTC) - started).total_seconds()
    doc["summary"] = summarize(doc["rounds"])
    doc["all_checks_ok"] = all(r["checks_ok"] for r in doc["rounds"])
    print()
    print(render(doc["summary"], doc["rounds"], cfg))
    print(f"\njob table checks: {'all ok' if doc['all_checks_ok'] else 'FAILED (see the JSON)'}")
    print(f"load average start {doc['load_start']} end {doc['load_end']}; took {doc['seconds']:.0f} s")
    if not args.no_save:
        out = REPO / "bench" / "results" / "fairness" / f"{started.strftime('%Y%m%dT%H%M%SZ')}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2))
        print(f"results: {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
