"""Benchmark: ``/metrics`` scrape time with 1,000,000 messages in the SQLite database.

Usage::

    .venv/bin/python bench/metrics_bench.py [--messages 1000000] [--scrapes 20] [--db PATH] [--keep]

Builds (or reuses, with ``--db`` on an existing file) a broker database with the requested number
of ``broker_messages`` rows in the broker's row shape (``broker.store.MessageStore.message_insert``)
spread over 4 queues and every state (ready, delayed, leased with some expired leases, dead), then
times:

* ``broker.stats()`` (the broker's operators' API, for comparison);
* ``monitoring.collectors.DatabaseCollector`` alone (the SQL of ``monitoring/store.py``);
* a full ``/metrics`` HTTP request (werkzeug server on 127.0.0.1, ``render_metrics`` with a
  multiprocess directory holding the files of 8 processes) — the number that must stay ≤ 200 ms.

Prints p50/p99/max in milliseconds for each. Not a test: results go to docs/monitoring.md.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUEUES = ("default", "render", "asr", "notify")
#: Share of rows per state: due ready, delayed, leased (some expired), dead.
MIX = (("ready", 0.80), ("delayed", 0.10), ("leased", 0.02), ("dead", 0.08))


def populate(path: str, n: int, *, seed: int = 7) -> None:
    """Create the broker schema in *path* and insert *n* message rows (no-op if already that full)."""
    from broker.store import _split_sql, schema_sql

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = OFF")
    for statement in _split_sql(schema_sql()):
        conn.execute(statement)
    have = conn.execute("SELECT count(*) FROM broker_messages").fetchone()[0]
    if have >= n:
        conn.close()
        return
    rng = random.Random(seed)
    now = int(time.time() * 1000)
    owners = [f"bench-host:{1000 + i}:{uuid.uuid4().hex[:8]}" for i in range(8)]
    body = b'{"queue_name":"default","actor_name":"work","args":[1],"kwargs":{},"options":{},' + b"x" * 120 + b"}"
    conn.execute("BEGIN")
    batch: list[tuple] = []
    for i in range(have, n):
        queue = QUEUES[i % len(QUEUES)]
        r = rng.random()
        acc, state = 0.0, "ready"
        for name, share in MIX:
            acc += share
            if r < acc:
                state = name
                break
        enqueued = now - rng.randint(0, 3_600_000)
        eta = enqueued if state != "delayed" else now + rng.randint(1_000, 86_400_000)
        priority = -rng.choice((0, 0, 0, 10))
        row = [queue, uuid.UUID(int=rng.getrandbits(128)).hex, "work", priority, eta, enqueued, body]
        if state == "leased":
            expires = now + 30_000 if rng.random() < 0.9 else now - 5_000
            row += [1, rng.choice(owners), expires, 1, None]
        elif state == "dead":
            row += [2, None, None, 3, enqueued + 1000]
        else:
            row += [0, None, None, 0, None]
        batch.append(tuple(row))
        if len(batch) >= 50_000:
            _insert(conn, batch)
            batch.clear()
    _insert(conn, batch)
    conn.execute("COMMIT")  # no ANALYZE: the broker never runs it, so neither does the benchmark
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def _insert(conn: sqlite3.Connection, rows: list[tuple]) -> None:
    conn.executemany(
        "INSERT INTO broker_messages (queue, message_id, actor, priority, eta, enqueued_at, body, state, "
        "lease_owner, lease_expires, deliveries, dead_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )


def fill_multiproc_dir(path: str, processes: int = 8) -> None:
    """Write the metric files of *processes* worker processes (each one a real child process)."""
    code = (
        "import monitoring.metrics as m\n"
        "for q in ('default','render','asr','notify'):\n"
        "    for a in ('work','render_video','transcribe'):\n"
        "        m.MESSAGES_ENQUEUED.labels(q, a).inc(10)\n"
        "        for o in m.OUTCOMES: m.MESSAGES_PROCESSED.labels(q, a, o).inc(3)\n"
        "        m.MESSAGE_DURATION.labels(q, a).observe(0.2)\n"
        "        m.MESSAGE_QUEUE_WAIT.labels(q, a).observe(0.05)\n"
        "        m.MESSAGES_IN_PROGRESS.labels(q, a).set(0)\n"
        "m.LEASE_RENEWALS.inc(100)\n"
    )
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=path, PYTHONPATH=str(ROOT))
    for _ in range(processes):
        subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=str(ROOT))


def timed(fn, runs: int) -> list[float]:
    fn()  # warm the page cache and the connection path
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def report(label: str, ms: list[float]) -> None:
    ms = sorted(ms)
    p99 = ms[min(len(ms) - 1, int(round(0.99 * (len(ms) - 1))))]
    print(f"{label:<38} p50 {statistics.median(ms):7.1f} ms   p99 {p99:7.1f} ms   max {ms[-1]:7.1f} ms  (n={len(ms)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--db", help="database file to build or reuse (default: a temporary file)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary database")
    args = parser.parse_args()

    tmp = tempfile.mkdtemp(prefix="tenure-metrics-bench-")
    db = args.db or os.path.join(tmp, "bench.db")
    multiproc = os.path.join(tmp, "prom")
    os.makedirs(multiproc)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = multiproc  # before prometheus_client is imported

    t0 = time.perf_counter()
    populate(db, args.messages)
    print(f"database: {db} ({args.messages:,} messages; built/checked in {time.perf_counter() - t0:.1f} s)")
    fill_multiproc_dir(multiproc)

    from werkzeug.serving import WSGIRequestHandler, make_server

    from broker import SQLiteBroker
    from monitoring.collectors import DatabaseCollector, default_sources
    from monitoring.exposition import make_wsgi_app

    broker = SQLiteBroker(f"sqlite:///{os.path.abspath(db)}", middleware=[])
    report("broker.stats()", timed(broker.stats, args.scrapes))

    sources = default_sources(broker)
    collector = DatabaseCollector(sources)
    report("DatabaseCollector.collect()", timed(lambda: list(collector.collect()), args.scrapes))

    class QuietHandler(WSGIRequestHandler):
        def log_request(self, *args: object, **kwargs: object) -> None:
            pass

    server = make_server("127.0.0.1", 0, make_wsgi_app(sources), request_handler=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}/metrics"

    def scrape() -> None:
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = resp.read()
        assert b"tenure_queue_messages" in body

    report("GET /metrics (full scrape)", timed(scrape, args.scrapes))
    server.shutdown()
    thread.join()
    broker.close()
    if args.keep:
        print(f"kept: {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
