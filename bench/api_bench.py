"""API latency benchmark: ``GET /api/v1/jobs/{id}`` at a steady request rate against real gunicorn.

Run from the repository root::

    .venv/bin/python -m bench.api_bench [--rate 200] [--seconds 20] [--clients 8] [--auth token|basic]

Set-up, all fresh and on 127.0.0.1: a temporary directory; a SQLite file there migrated to the head revision
(:func:`jobs.schema.upgrade`, what ``tenure db upgrade`` does); an admin account and an API token created with
:mod:`accounts` (what ``tenure users create NAME --admin --password-stdin`` and the UI's Tokens page do);
gunicorn started exactly as the Procfile's ``web`` process (``gunicorn -c gunicorn.conf.py 'webapp:create_app()'``:
gthread, 2 workers × 32 threads unless ``TENURE_WEB_*`` says otherwise) with ``PORT`` a free port,
``PROMETHEUS_MULTIPROC_DIR`` a fresh empty directory and ``TENURE_DATABASE_URL`` the new file. A few jobs are
submitted through ``POST /api/v1/jobs`` (no worker runs, so they stay queued). Only the job reads are timed.

Load: an open-loop schedule — request *i* is due at ``t0 + i / rate`` whatever happened to earlier requests — spread
round-robin over ``--clients`` threads, each with its own keep-alive ``httpx.Client`` (connections warmed up before
``t0``), cycling over the submitted job ids, with ``Authorization: Bearer …`` (or HTTP Basic with ``--auth basic``,
which costs a scrypt check per request). Per request two latencies are kept:

* **service** — send → full response read (what a client that is on time sees);
* **from schedule** — due time → full response read: includes any wait because the client thread was still busy
  or was scheduled late, so a server stall is not hidden by the client slowing down (no coordinated omission).

Printed: p50/p90/p99/max of both, the achieved rate, errors (non-200 or exceptions), gunicorn workers' CPU over
the window and the machine's load (``/proc/loadavg``) before and after; the goal is p99 ≤ 25 ms (judged on the
from-schedule latency, the stricter one). gunicorn is stopped by PID (SIGTERM to the master, then SIGKILL to any
process of it still alive). Results go to ``bench/results/api/<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from . import report
from .broker_bench import _git, _pct, loadavg, log
from .procs import REPO, children_of, cpu_ns, stop_tree

GOAL_P99_MS = 25.0
USERNAME = "bench-admin"
#: What the jobs are submitted as (no worker runs: they stay queued; only reads are timed).
JOB_KIND = "notify_webhook"
JOB_PAYLOAD = {"channel": "bench", "event_type": "bench.ping", "data": {"n": 1}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gunicorn:
    """``gunicorn -c gunicorn.conf.py 'webapp:create_app()'`` in *workdir*, stopped by PID."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.log_path = workdir / "gunicorn.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        gunicorn = str(Path(sys.executable).with_name("gunicorn"))
        self.proc = subprocess.Popen(
            [gunicorn, "-c", str(REPO / "gunicorn.conf.py"), "webapp:create_app()"],
            cwd=workdir,  # anything written relative to the working directory stays in the temp dir
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self._known: set[int] = set()

    def workers(self) -> list[int]:
        kids = children_of(self.proc.pid)
        self._known.update(kids)
        return kids

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"gunicorn exited with code {self.proc.returncode}: {self.tail()}")

    def tail(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self, timeout_s: float = 15.0) -> None:
        self.workers()
        stop_tree(self.proc, self._known, _is_gunicorn, timeout_s)
        self._log.close()


def _is_gunicorn(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"gunicorn" in f.read()
    except OSError:
        return False


def prepare(workdir: Path) -> tuple[str, str, str]:
    """Migrate a fresh database; create the admin and a token. Returns (url, password, token)."""
    import accounts
    from jobs import schema  # noqa: PLC0415
    from jobs.db import make_engine  # noqa: PLC0415

    url = f"sqlite:///{workdir / 'tenure.db'}"
    schema.upgrade(url)
    engine = make_engine(url)
    try:
        password = secrets.token_urlsafe(18)
        user, _ = accounts.create_user(engine, USERNAME, password, role="admin")
        _, token = accounts.create_token(engine, user.id, "api-bench")
    finally:
        engine.dispose()
    return url, password, token


def wait_live(base_url: str, server: Gunicorn, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        server.check()
        try:
            if httpx.get(base_url + "/api/health/live", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"gunicorn not live after {timeout_s:.0f} s: {server.tail()}")
        time.sleep(0.1)


def submit_jobs(base_url: str, headers: dict[str, str], count: int) -> list[str]:
    ids = []
    with httpx.Client(base_url=base_url, headers=headers, timeout=10) as client:
        for i in range(count):
            r = client.post("/api/v1/jobs", json={"kind": JOB_KIND, "payload": {**JOB_PAYLOAD, "data": {"n": i}}})
            if r.status_code != 201:
                raise RuntimeError(f"POST /api/v1/jobs: {r.status_code} {r.text[:300]}")
            ids.append(r.json()["id"])
    return ids


def drive(
    base_url: str, headers: dict[str, str], job_ids: list[str], rate: float, seconds: float, clients: int
) -> dict[str, Any]:
    """The open-loop GET schedule; returns per-request samples and errors."""
    total = int(rate * seconds)
    service: list[float] = []
    scheduled: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    ready = threading.Barrier(clients + 1)
    start: list[float] = []

    def client_thread(k: int) -> None:
        with httpx.Client(base_url=base_url, headers=headers, timeout=10) as client:
            for _ in range(3):  # warm the keep-alive connection (and the server's code paths)
                client.get(f"/api/v1/jobs/{job_ids[k % len(job_ids)]}")
            ready.wait()
            ready.wait()  # the main thread has set t0
            t0 = start[0]
            mine_service: list[float] = []
            mine_sched: list[float] = []
            mine_err: list[str] = []
            for i in range(k, total, clients):
                due = t0 + i / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                sent = time.perf_counter()
                try:
                    r = client.get(f"/api/v1/jobs/{job_ids[i % len(job_ids)]}")
                    r.read()
                    done = time.perf_counter()
                    if r.status_code != 200:
                        mine_err.append(f"HTTP {r.status_code}")
                        continue
                except httpx.HTTPError as e:
                    mine_err.append(f"{type(e).__name__}: {e}")
                    continue
                mine_service.append(done - sent)
                mine_sched.append(done - due)
            with lock:
                service.extend(mine_service)
                scheduled.extend(mine_sched)
                errors.extend(mine_err)

    threads = [threading.Thread(target=client_thread, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    ready.wait()
    start.append(time.perf_counter() + 0.05)
    ready.wait()
    for t in threads:
        t.join(seconds + 60)
    wall = time.perf_counter() - start[0]
    return {"total": total, "service": service, "scheduled": scheduled, "errors": errors, "wall": wall}


def stats_ms(values: list[float]) -> dict[str, float]:
    v = sorted(values)
    return {
        "p50_ms": 1000 * _pct(v, 50),
        "p90_ms": 1000 * _pct(v, 90),
        "p99_ms": 1000 * _pct(v, 99),
        "max_ms": 1000 * v[-1] if v else float("nan"),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.api_bench", description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=float, default=200.0, help="requests per second (default 200)")
    p.add_argument("--seconds", type=float, default=20.0, help="length of the timed window (default 20)")
    p.add_argument("--clients", type=int, default=8, help="client threads, one keep-alive connection each")
    p.add_argument("--jobs", type=int, default=5, help="jobs submitted, then read in turn (default 5)")
    p.add_argument("--auth", choices=("token", "basic"), default="token", help="bearer token (default) or Basic")
    p.add_argument("--no-save", action="store_true", help="do not write bench/results/api/<timestamp>.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="tenure-api-bench-"))
    started = datetime.now(UTC)
    doc: dict[str, Any] = {
        "command": " ".join([".venv/bin/python -m bench.api_bench", *(argv if argv is not None else sys.argv[1:])]),
        "started": started.isoformat(timespec="seconds"),
        "config": {k: getattr(args, k) for k in ("rate", "seconds", "clients", "jobs", "auth")},
        "machine": {
            "cores": os.cpu_count(),
            "git_head": _git("rev-parse", "HEAD"),
            "git_dirty": _git("status", "--porcelain", "broker", "jobs", "webapp"),
        },
    }
    server: Gunicorn | None = None
    try:
        url, password, token = prepare(workdir)
        port = free_port()
        multiproc = workdir / "prometheus"
        multiproc.mkdir()
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "PORT": str(port),
            "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
            "TENURE_DATABASE_URL": url,
            "TENURE_BROKER_URL": "",
            "TENURE_OUTPUT_ROOT": str(workdir / "outputs"),
            "TENURE_SECRET_KEY": secrets.token_hex(32),
        }
        env.pop("TENURE_WEB_BIND", None)
        base_url = f"http://127.0.0.1:{port}"
        server = Gunicorn(env, workdir)
        wait_live(base_url, server)
        workers = server.workers()
        log(f"gunicorn {server.proc.pid} on {base_url}, workers {workers}; load {loadavg()}")
        if args.auth == "token":
            headers = {"Authorization": f"Bearer {token}"}
        else:
            headers = {"Authorization": "Basic " + base64.b64encode(f"{USERNAME}:{password}".encode()).decode()}
        job_ids = submit_jobs(base_url, headers, args.jobs)
        time.sleep(1.0)
        doc["load_before"] = loadavg()
        cpu_before = {p: cpu_ns(p) for p in workers}
        t0 = time.monotonic()
        run = drive(base_url, headers, job_ids, args.rate, args.seconds, args.clients)
        window = time.monotonic() - t0
        cpu_after = {p: cpu_ns(p) for p in workers}
        doc["load_after"] = loadavg()
        server.check()
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    ok = len(run["service"])
    doc["results"] = {
        "requests": run["total"],
        "ok": ok,
        "errors": len(run["errors"]),
        "error_samples": sorted(set(run["errors"]))[:10],
        "achieved_rate": ok / run["wall"],
        "service": stats_ms(run["service"]),
        "from_schedule": stats_ms(run["scheduled"]),
        "gunicorn_worker_cpu_pct": {str(p): 100 * (cpu_after[p] - cpu_before[p]) / 1e9 / window for p in workers},
    }
    doc["seconds"] = (datetime.now(UTC) - started).total_seconds()
    res = doc["results"]
    p99 = res["from_schedule"]["p99_ms"]
    doc["verdict"] = "PASS" if p99 <= GOAL_P99_MS and res["errors"] == 0 else "MISS"
    rows = [["GET /api/v1/jobs/{id}", "p50 ms", "p90 ms", "p99 ms", "max ms"]]
    for key, label in (("service", "service (send -> response)"), ("from_schedule", "from schedule (due -> response)")):
        s = res[key]
        rows.append([label, *(f"{s[k]:.2f}" for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms"))])
    print()
    print(report._table(rows, False))  # noqa: SLF001 - the broker benchmark's table formatter
    cpu = ", ".join(f"{v:.0f} %" for v in res["gunicorn_worker_cpu_pct"].values())
    print(
        f"\n{res['ok']:,} ok / {res['requests']:,} requests at {res['achieved_rate']:.1f} req/s "
        f"({args.clients} clients, {args.auth}); errors {res['errors']} {res['error_samples'] or ''}"
    )
    print(f"gunicorn worker CPU: {cpu}; load before {doc['load_before']} after {doc['load_after']}")
    print(f"goal p99 (from schedule) <= {GOAL_P99_MS:.0f} ms and no errors: {p99:.2f} ms -> {doc['verdict']}")
    if not args.no_save:
        out = REPO / "bench" / "results" / "api" / f"{started.strftime('%Y%m%dT%H%M%SZ')}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2))
        print(f"results: {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
