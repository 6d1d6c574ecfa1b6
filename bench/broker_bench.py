"""Broker benchmark: Tenure's SQLiteBroker against Dramatiq's RedisBroker and RabbitmqBroker, in one run.

Run from the repository root::

    .venv/bin/python -m bench.broker_bench [--n 20000] [--only sqlite,redis,rabbitmq,rabbitmq-confirms] [--quick]

Targets: ``sqlite-normal`` / ``sqlite-full`` (SQLiteBroker, ``synchronous=NORMAL`` / ``FULL``, a fresh file in a
temporary directory on local disk), ``redis`` (RedisBroker, 127.0.0.1:6379 db 13), ``rabbitmq`` (RabbitmqBroker,
127.0.0.1:5672), ``rabbitmq-confirms`` (``confirm_delivery=True``; enqueue only — confirms do not change
consuming), and ``sqlite-backlog`` (part of ``sqlite``). Every broker uses Dramatiq's default middleware and the
same no-op actor (:mod:`bench.app`) on one queue, which starts empty (flushed / a fresh file).

What is measured, per target:

1. **enqueue/s** — one producer thread sends N messages (``actor.send``) with no worker running.
2. **drain/s** — N messages are queued, then real worker processes (``python -m dramatiq bench.app --processes P
   --threads 8``, P = 1 and 2, Dramatiq's default prefetch) start. Every actor call first waits at a gate until all
   P processes have received a message, so start-up time and start-up skew are excluded; drain/s = N / (time from
   opening the gate to the last message recorded). Completion is detected the same way for every broker: each
   actor call increments a per-process counter in a shared-memory ledger (:mod:`bench.ledger`, ~1 µs).
3. **enqueue→start latency** p50/p99 — with one 1 × 8 worker idle-waiting, the producer sends at a steady 200 msg/s
   for ~10 s, stamping ``time.time()`` into the message; the actor records ``time.time() - stamp``.
4. **idle CPU** — right after (3), the same worker process sits idle ~10 s; CPU = Δ(utime + stime) from
   ``/proc/<pid>/stat`` of the worker process (the child of the ``dramatiq`` master) / wall time.
5. **SQLite backlog** (NORMAL) — drain/s of N messages (1 × 8) from a queue holding 1,000 + N rows vs 1,000,000 + N
   rows. Rows are bulk-inserted with sqlite3 in exactly the shape ``SQLiteBroker.enqueue`` writes (a template row
   is produced by a real enqueue and copied with fresh message ids), then the WAL is checkpointed.

The machine's load (``/proc/loadavg``) is recorded before and after each target: the machine may be shared, so
compare runs made at low load and take medians over several runs (``python -m bench.summarize``). Results are
printed (table, Tenure/peer ratios, PASS/MISS per goal) and written to ``bench/results/<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dramatiq

from . import report
from .app import QUEUE, build_broker, declare_actor
from .ledger import LedgerReader
from .procs import CLK_TCK, REPO, Workers, cpu_ns, cpu_ticks

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
RABBITMQ_URL = os.environ.get("BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
REDIS_NAMESPACE = "tenure-bench"
THREADS = 8
POLL_S = 0.005

ALL_TARGETS = ["rabbitmq-confirms", "rabbitmq", "redis", "sqlite-normal", "sqlite-full", "sqlite-backlog"]
GROUPS = {
    "sqlite": ["sqlite-normal", "sqlite-full", "sqlite-backlog"],
    "redis": ["redis"],
    "rabbitmq": ["rabbitmq"],
    "rabbitmq-confirms": ["rabbitmq-confirms"],
}


@dataclass
class Config:
    n: int
    latency_s: float
    rate: float
    idle_s: float
    backlog_small: int
    backlog_large: int
    workdir: Path
    verbose: bool = True


@dataclass
class Target:
    name: str
    url: str
    options: dict[str, Any]
    phases: tuple[str, ...]
    results: dict[str, Any] = field(default_factory=dict)


def log(msg: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str, check: Callable[[], None] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(POLL_S)


# -- brokers -----------------------------------------------------------------------------------------------------


def make_targets(cfg: Config, names: list[str]) -> list[Target]:
    sqlite_dir = cfg.workdir
    specs = {
        "sqlite-normal": Target(
            "sqlite-normal",
            f"sqlite:///{sqlite_dir}/normal.db",
            {"synchronous": "NORMAL"},
            ("enqueue", "drain", "latency"),
        ),
        "sqlite-full": Target(
            "sqlite-full", f"sqlite:///{sqlite_dir}/full.db", {"synchronous": "FULL"}, ("enqueue", "drain", "latency")
        ),
        "sqlite-backlog": Target(
            "sqlite-backlog", f"sqlite:///{sqlite_dir}/backlog.db", {"synchronous": "NORMAL"}, ("backlog",)
        ),
        "redis": Target("redis", REDIS_URL, {"namespace": REDIS_NAMESPACE}, ("enqueue", "drain", "latency")),
        "rabbitmq": Target("rabbitmq", RABBITMQ_URL, {}, ("enqueue", "drain", "latency")),
        "rabbitmq-confirms": Target("rabbitmq-confirms", RABBITMQ_URL, {"confirm_delivery": True}, ("enqueue",)),
    }
    return [specs[n] for n in ALL_TARGETS if n in names]


def clean(target: Target) -> None:
    """Start from an empty queue: a fresh SQLite file, or flushed Redis keys / RabbitMQ queues."""
    if target.url.startswith("sqlite:"):
        path = Path(target.url[len("sqlite:///") :])
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
        return
    b = build_broker(target.url, target.options)
    try:
        declare_actor(b)
        if target.url.startswith("redis"):
            client = b.client  # type: ignore[attr-defined]
            keys = list(client.scan_iter(f"{REDIS_NAMESPACE}*"))
            if keys:
                client.delete(*keys)
        else:
            b.flush_all()
    finally:
        b.close()


@contextlib.contextmanager
def producer(target: Target) -> Iterator[dramatiq.Actor]:
    """A producer-side broker (in this process) and the benchmark actor bound to it."""
    b = build_broker(target.url, target.options)
    try:
        yield declare_actor(b)
    finally:
        b.close()


def sqlite_path(target: Target) -> str:
    return target.url[len("sqlite:///") :]


def sqlite_pending(target: Target) -> int:
    with contextlib.closing(sqlite3.connect(sqlite_path(target))) as conn:
        return conn.execute("SELECT count(*) FROM broker_messages WHERE state IN (0, 1)").fetchone()[0]


# -- phases ------------------------------------------------------------------------------------------------------


def enqueue_n(actor: dramatiq.Actor, n: int) -> float:
    send = actor.send
    t0 = time.perf_counter()
    for _ in range(n):
        send(0.0)
    return n / (time.perf_counter() - t0)


def drain(
    cfg: Config,
    target: Target,
    processes: int,
    expected: int,
    tag: str,
    *,
    app: str = "bench.app",
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Start P × 8 workers of *app* against a pre-filled queue; time gate-open → *expected* messages recorded."""
    ledger = LedgerReader(str(cfg.workdir / f"ledger-{target.name}-{tag}"))
    ledger.reset()
    workers = Workers(
        target.url,
        target.options,
        ledger.directory,
        processes,
        THREADS,
        str(cfg.workdir / "workers.log"),
        app=app,
        extra_env=extra_env,
    )
    try:
        wait_until(lambda: ledger.processes_ready() >= processes, 90, f"{processes} worker processes", workers.check)
        pids = workers.worker_pids()
        cpu0 = {p: cpu_ns(p) for p in pids}
        t0 = ledger.open_gate()
        wait_until(lambda: ledger.total() >= expected, max(120, expected / 100), f"{expected} messages", workers.check)
        cpu1 = {p: cpu_ns(p) for p in pids}
        wall = time.time() - t0
        tallies = ledger.tallies()
    finally:
        workers.stop()
    last = max(t.last for t in tallies)
    elapsed = last - t0
    return {
        "per_s": expected / elapsed,
        "seconds": elapsed,
        "processed": sum(t.count for t in tallies),
        "per_process": [t.count for t in tallies],
        # CPU of each worker process (all threads) from gate-open until completion was seen, % of one core
        "worker_cpu_pct": [100.0 * (cpu1[p] - cpu0[p]) / 1e9 / wall for p in pids],
    }


def latency_and_idle(cfg: Config, target: Target) -> dict[str, Any]:
    """Steady-rate enqueue→start latency on an idle 1 × 8 worker, then that worker's idle CPU."""
    ledger = LedgerReader(str(cfg.workdir / f"ledger-{target.name}-latency"))
    ledger.reset()
    ledger.open_gate()
    workers = Workers(target.url, target.options, ledger.directory, 1, THREADS, str(cfg.workdir / "workers.log"))
    try:
        with producer(target) as actor:
            actor.send(0.0)  # warm-up: proves the worker is consuming
            wait_until(lambda: ledger.total() >= 1, 90, "the worker to start", workers.check)
            time.sleep(1.0)
            count = int(cfg.latency_s * cfg.rate)
            start = time.perf_counter()
            for i in range(count):
                delay = start + i / cfg.rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                actor.send(time.time())
            achieved = count / (time.perf_counter() - start)
        wait_until(lambda: ledger.total() >= count + 1, 60, "latency messages", workers.check)
        lat = sorted(ledger.latencies())
        # idle CPU of the worker process(es) and of the dramatiq master
        time.sleep(1.0)
        pids = workers.worker_pids()
        before = {p: (cpu_ticks(p), cpu_ns(p)) for p in [workers.pid, *pids]}
        t0 = time.monotonic()
        time.sleep(cfg.idle_s)
        after = {p: (cpu_ticks(p), cpu_ns(p)) for p in before}
        wall = time.monotonic() - t0
    finally:
        workers.stop()
    pct = {p: 100.0 * (after[p][1] - before[p][1]) / 1e9 / wall for p in before}
    pct_ticks = {p: 100.0 * (after[p][0] - before[p][0]) / CLK_TCK / wall for p in before}
    return {
        "latency_samples": len(lat),
        "latency_rate_achieved": achieved,
        "latency_p50_ms": 1000 * _pct(lat, 50),
        "latency_p90_ms": 1000 * _pct(lat, 90),
        "latency_p99_ms": 1000 * _pct(lat, 99),
        "latency_max_ms": 1000 * lat[-1],
        "idle_cpu_pct": max(pct[p] for p in pids),
        "idle_cpu_ticks_pct": max(pct_ticks[p] for p in pids),
        "idle_cpu_master_pct": pct[workers.pid],
        "idle_seconds": wall,
    }


def _pct(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def bulk_fill(target: Target, rows: int) -> float:
    """Insert *rows* READY rows as ``SQLiteBroker.enqueue`` would; returns seconds taken."""
    with producer(target) as actor:
        actor.send(0.0)  # creates the schema and one genuine row to copy
    path = sqlite_path(target)
    t0 = time.perf_counter()
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA synchronous = NORMAL")
        queue, message_id, actor_name, priority, eta, enqueued_at, body = conn.execute(
            "SELECT queue, message_id, actor, priority, eta, enqueued_at, body FROM broker_messages"
        ).fetchone()
        conn.execute("DELETE FROM broker_messages")
        old = message_id.encode()
        assert body.count(old) == 1, "template body must contain its message id once"
        base = eta - rows  # one row per millisecond, all due
        chunk = 50_000
        for start in range(0, rows, chunk):
            batch = []
            for i in range(start, min(rows, start + chunk)):
                mid = str(uuid.UUID(int=i + 1))
                batch.append((queue, mid, actor_name, priority, base + i, base + i, body.replace(old, mid.encode())))
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "INSERT INTO broker_messages (queue, message_id, actor, priority, eta, enqueued_at, body) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                batch,
            )
            conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return time.perf_counter() - t0


def run_target(cfg: Config, target: Target) -> None:
    res = target.results
    res["load_before"] = loadavg()
    clean(target)
    if "enqueue" in target.phases:
        with producer(target) as actor:
            res["enqueue_per_s"] = enqueue_n(actor, cfg.n)
        log(f"{target.name}: enqueue {res['enqueue_per_s']:,.0f}/s")
    if "drain" in target.phases:
        d1 = drain(cfg, target, 1, cfg.n, "1x8")
        res["drain_1x8_per_s"], res["drain_1x8"] = d1["per_s"], d1
        log(f"{target.name}: drain 1x8 {d1['per_s']:,.0f}/s ({d1['seconds']:.2f} s)")
        with producer(target) as actor:
            res["enqueue_again_per_s"] = enqueue_n(actor, cfg.n)
        d2 = drain(cfg, target, 2, cfg.n, "2x8")
        res["drain_2x8_per_s"], res["drain_2x8"] = d2["per_s"], d2
        log(f"{target.name}: drain 2x8 {d2['per_s']:,.0f}/s ({d2['seconds']:.2f} s, per process {d2['per_process']})")
        if target.url.startswith("sqlite"):
            res["left_after_drains"] = sqlite_pending(target)
    if "latency" in target.phases:
        lat = latency_and_idle(cfg, target)
        res.update(lat)
        log(
            f"{target.name}: latency p50 {lat['latency_p50_ms']:.2f} ms p99 {lat['latency_p99_ms']:.2f} ms "
            f"({lat['latency_samples']} samples); idle CPU {lat['idle_cpu_pct']:.2f} %"
        )
    if "backlog" in target.phases:
        for label, backlog in (("small", cfg.backlog_small), ("large", cfg.backlog_large)):
            clean(target)
            fill_s = bulk_fill(target, backlog + cfg.n)
            d = drain(cfg, target, 1, cfg.n, f"backlog-{label}")
            res[f"backlog_{label}_per_s"], res[f"backlog_{label}"] = d["per_s"], {**d, "queued": backlog + cfg.n}
            res[f"backlog_{label}_fill_s"] = fill_s
            res[f"backlog_{label}_db_mb"] = os.path.getsize(sqlite_path(target)) / 1e6
            log(f"{target.name}: {backlog + cfg.n:,} queued (filled in {fill_s:.1f} s): drain 1x8 {d['per_s']:,.0f}/s")
        res["backlog_ratio"] = res["backlog_large_per_s"] / res["backlog_small_per_s"]
        clean(target)
    res["load_after"] = loadavg()


# -- main --------------------------------------------------------------------------------------------------------


def machine_facts() -> dict[str, Any]:
    import redis  # noqa: PLC0415

    facts: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "dramatiq": dramatiq.__version__,
        "kernel": platform.release(),
        "git_head": _git("rev-parse", "HEAD"),
        "git_dirty_broker": _git("status", "--porcelain", "broker"),
    }
    try:
        facts["redis_server"] = redis.Redis.from_url(REDIS_URL).info("server")["redis_version"]
    except Exception as e:  # noqa: BLE001
        facts["redis_server"] = f"unavailable: {e}"
    try:
        import pika  # noqa: PLC0415

        conn = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
        version = conn._impl.server_properties.get("version", "?")  # noqa: SLF001
        facts["rabbitmq_server"] = version.decode() if isinstance(version, bytes) else str(version)
        conn.close()
    except Exception as e:  # noqa: BLE001
        facts["rabbitmq_server"] = f"unavailable: {e}"
    return facts


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.broker_bench", description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=None, help="messages per enqueue/drain phase (default 20000; quick 2000)")
    p.add_argument(
        "--only",
        default="sqlite,redis,rabbitmq,rabbitmq-confirms",
        help="comma-separated: sqlite (= sqlite-normal,sqlite-full,sqlite-backlog), redis, rabbitmq, "
        "rabbitmq-confirms, or single SQLite targets",
    )
    p.add_argument("--quick", action="store_true", help="N=2000, 3 s latency and idle phases, 100k backlog")
    p.add_argument("--latency-seconds", type=float, default=None)
    p.add_argument("--rate", type=float, default=200.0, help="latency phase send rate, msg/s")
    p.add_argument("--idle-seconds", type=float, default=None)
    p.add_argument("--backlog", type=int, default=None, help="large backlog (default 1,000,000; quick 100,000)")
    p.add_argument("--workdir", default=None, help="directory for SQLite files and logs (default: a temp dir, removed)")
    p.add_argument("--no-save", action="store_true", help="do not write bench/results/<timestamp>.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names: list[str] = []
    for part in (s.strip() for s in args.only.split(",") if s.strip()):
        expanded = GROUPS.get(part, [part])
        for name in expanded:
            if name not in ALL_TARGETS:
                raise SystemExit(f"unknown target {name!r}; choose from {', '.join([*GROUPS, *ALL_TARGETS])}")
            names.append(name)
    keep = args.workdir is not None
    # Local disk, not tmpfs, so that synchronous=FULL really fsyncs (the default tempdir here is on ext4).
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="tenure-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = Config(
        n=args.n or (2_000 if args.quick else 20_000),
        latency_s=args.latency_seconds or (3.0 if args.quick else 10.0),
        rate=args.rate,
        idle_s=args.idle_seconds or (3.0 if args.quick else 10.0),
        backlog_small=1_000,
        backlog_large=args.backlog or (100_000 if args.quick else 1_000_000),
        workdir=workdir,
    )
    started = datetime.now(UTC)
    doc: dict[str, Any] = {
        "command": " ".join([".venv/bin/python -m bench.broker_bench", *(argv if argv is not None else sys.argv[1:])]),
        "started": started.isoformat(timespec="seconds"),
        "config": {
            "n": cfg.n,
            "threads": THREADS,
            "latency_seconds": cfg.latency_s,
            "rate": cfg.rate,
            "idle_seconds": cfg.idle_s,
            "backlog_small": cfg.backlog_small,
            "backlog_large": cfg.backlog_large,
            "workdir_fs": _fs_type(workdir),
            "queue": QUEUE,
        },
        "machine": machine_facts(),
        "load_start": loadavg(),
        "targets": {},
    }
    log(f"workdir {workdir} ({doc['config']['workdir_fs']}); load {doc['load_start']}; targets {names}")
    targets = make_targets(cfg, names)
    try:
        for target in targets:
            try:
                run_target(cfg, target)
            except Exception as e:  # noqa: BLE001 - report and continue with the other brokers
                log(f"{target.name}: FAILED: {type(e).__name__}: {e}")
                target.results["error"] = f"{type(e).__name__}: {e}"
            doc["targets"][target.name] = target.results
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    doc["load_end"] = loadavg()
    doc["seconds"] = (datetime.now(UTC) - started).total_seconds()
    metrics = report.metrics_of(doc)
    print()
    print(report.render(metrics, (cfg.backlog_small, cfg.backlog_large)))
    print(f"\nload average start {doc['load_start']} end {doc['load_end']}; took {doc['seconds']:.0f} s")
    if not args.no_save:
        out = REPO / "bench" / "results" / f"{started.strftime('%Y%m%dT%H%M%SZ')}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2))
        print(f"results: {out.relative_to(REPO)}")
    return 0


def _fs_type(path: Path) -> str:
    from broker.connection import filesystem_type  # noqa: PLC0415

    return filesystem_type(str(path)) or "?"


if __name__ == "__main__":
    raise SystemExit(main())
