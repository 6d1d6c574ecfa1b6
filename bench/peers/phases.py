"""The three measurements :mod:`bench.jobs_peers` makes of every system, the same way for each.

* :func:`submit` — one producer process (:mod:`bench.peers.produce`, in the system's interpreter) submits N jobs,
  no worker running; submits per second over the N - 1 after the first.
* :func:`drain` — the system's worker commands start against those N jobs. Every job first waits at the gate of
  :mod:`bench.peers.ledger` until each worker process holds one, so boot time and boot skew stay out; the drain
  ends when the system's **own store** shows every job done (polled every few milliseconds once the jobs' ledger
  shows N starts). drain/s = N / (gate opened → store showed all done). Then the workers stop and the store must
  hold exactly the jobs done so far and nothing else (queued, running, failed, missing): else
  :class:`CheckFailed`.
* :func:`latency` — one 1 × 8 worker, idle and consuming (one warm-up job done), then the producer submits at a
  steady rate, each job stamped just before its submit call; each job records ``start - stamp``. p50, p99, max.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.broker_bench import wait_until

from .ledger import DIR_ENV, LedgerReader
from .processes import Launched, run_tool, stop_all
from .system import Counts, Deployment, RoundContext

THREADS = 8
#: How often the store is read once the ledger shows every job started.
STORE_POLL_S = 0.002
#: Longest wait for worker processes to boot and take their first job.
BOOT_TIMEOUT_S = 180.0


class CheckFailed(RuntimeError):
    """The system's store does not hold exactly the jobs it should after a phase."""


@dataclass(frozen=True)
class Phase:
    rc: RoundContext
    deployment: Deployment

    def produce(self, *args: str) -> dict[str, Any]:
        d = self.deployment
        ids = self.rc.workdir / "ids.txt"
        out = run_tool(
            [d.python, "-m", "bench.peers.produce", d.app, *args, "--ids", str(ids)],
            d.env,
            self.rc.log,
            self.rc.run_id,
            timeout_s=3600,
        )
        d.submitted(ids.read_text().split())
        return json.loads(out.strip().splitlines()[-1])

    def start_workers(self, processes: int, ledger: LedgerReader) -> list[Launched]:
        env = {**self.deployment.env, DIR_ENV: str(ledger.directory)}
        launched: list[Launched] = []
        try:
            for cmd in self.deployment.worker_commands(processes, THREADS):
                launched.append(Launched(cmd, env, self.rc.log, self.rc.run_id))
        except BaseException:
            stop_all(launched)
            raise
        return launched

    def wait_store(self, expected: int, timeout_s: float, check: Any) -> float:
        """Poll the store until it shows *expected* jobs done; the wall time it did."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.deployment.counts().done >= expected:
                return time.time()
            check()
            if time.monotonic() > deadline:
                raise CheckFailed(f"the store shows {self.deployment.counts()} after {timeout_s:.0f} s, not {expected}")
            time.sleep(STORE_POLL_S)

    def checked(self, expected: int, what: str) -> Counts:
        counts = self.deployment.counts()
        if not counts.exactly(expected):
            raise CheckFailed(
                f"{what}: the store holds {counts.done} done and {counts.other}, expected {expected} done"
            )
        return counts


def _all_running(launched: list[Launched]) -> Any:
    def check() -> None:
        for p in launched:
            p.check()

    return check


def submit(phase: Phase, n: int) -> float:
    return float(phase.produce("submit", "--n", str(n))["per_s"])


def drain(phase: Phase, processes: int, n: int, done_before: int) -> dict[str, Any]:
    ledger = LedgerReader(phase.rc.workdir / f"ledger-{processes}x{THREADS}")
    ready = phase.deployment.workers_started(processes, THREADS)
    timeout_s = max(120.0, n / 20)
    t_launch = time.time()
    launched = phase.start_workers(processes, ledger)
    check = _all_running(launched)
    try:
        wait_until(lambda: ledger.workers_ready() >= ready, BOOT_TIMEOUT_S, f"{ready} worker processes", check)
        t0 = ledger.open_gate()
        wait_until(lambda: ledger.total() >= n, timeout_s, f"{n} jobs started", check)
        t_done = phase.wait_store(done_before + n, timeout_s, check)
    finally:
        stop_all(launched)
    t_stopped = time.time()
    counts = phase.checked(done_before + n, f"drain {processes}x{THREADS}")
    starts = [start for start, _ in ledger.records()]
    return {
        "per_s": n / (t_done - t0),
        "seconds": t_done - t0,
        "seconds_to_last_start": max(starts) - t0,
        "started": len(starts),
        "workers": ledger.workers_ready(),
        "boot_seconds": t0 - t_launch,
        "stop_seconds": t_stopped - t_done,
        "done": counts.done,
    }


def latency(phase: Phase, rate: float, seconds: float, done_before: int) -> dict[str, Any]:
    ledger = LedgerReader(phase.rc.workdir / "ledger-latency")
    ledger.open_gate()
    launched = phase.start_workers(1, ledger)
    check = _all_running(launched)
    try:
        phase.produce("submit", "--n", "1")  # warm-up: the worker is up and consuming once it is done
        wait_until(lambda: ledger.total() >= 1, BOOT_TIMEOUT_S, "the warm-up job", check)
        phase.wait_store(done_before + 1, 60, check)
        time.sleep(1.0)
        sent = phase.produce("steady", "--rate", str(rate), "--seconds", str(seconds))
        expected = done_before + 1 + sent["sent"]
        wait_until(lambda: ledger.total() >= 1 + sent["sent"], 120, "the latency jobs", check)
        phase.wait_store(expected, 120, check)
    finally:
        stop_all(launched)
    phase.checked(expected, "latency")
    lat = sorted(ledger.latencies())
    return {
        "samples": len(lat),
        "rate_achieved": sent["rate"],
        "p50_ms": 1000 * _pct(lat, 50),
        "p90_ms": 1000 * _pct(lat, 90),
        "p99_ms": 1000 * _pct(lat, 99),
        "max_ms": 1000 * lat[-1],
        "done": expected,
    }


def _pct(sorted_values: list[float], p: float) -> float:
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
