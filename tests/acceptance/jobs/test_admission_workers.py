"""Admission with real workers (2 processes × 8 threads) on SQLite and on PostgreSQL + Redis.

- A concurrency limit of 2 on one key is never exceeded — checked from every attempt's running interval
  in the job events — while 400 jobs of that key and 400 of other keys run, and the other keys' jobs are
  not held up behind its backlog.
- After a SIGKILL of the worker running a key's jobs, the key's full limit is usable again once their
  leases expired, and never exceeded meanwhile.
- Fair share (SQLite): owner A queues 5,000 jobs, then owner B submits 50; all of B's start before A's 500th
  later one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

import jobs

from .procs import Client, Deployment, client, deployment, wait_for

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    # Admission is decided in the job store: on PostgreSQL the same with any broker (the PostgreSQL broker's
    # refills, which write messages in the admitting transaction, run in its chaos test).
    pytest.param("postgres", id="postgres+redis", marks=pytest.mark.services),
]
FINAL = ("succeeded", "failed", "cancelled", "interrupted")


def _submit_many(c: Client, d: Deployment, kind: str, payloads: list[dict], owner_id: str = "u1") -> None:
    for start in range(0, len(payloads), 500):
        with Session(d.engine) as session, session.begin():
            for payload in payloads[start : start + 500]:
                jobs.submit(
                    session, owner_id=owner_id, kind=kind, payload=payload, registry=c.registry, settings=c.settings
                )


def _intervals(d: Deployment, key: str) -> list[tuple[int, int]]:
    """Every attempt of *key*'s jobs as ``(started, stopped)`` in ms: from its ``running`` status event to
    the job's next status event (or now, if it still runs)."""
    rows = d.rows(
        "SELECT e.job_id, e.created_at, e.data FROM job_events e JOIN jobs j ON j.id = e.job_id "
        "WHERE j.concurrency_key = :k AND e.type = 'status' ORDER BY e.job_id, e.sequence",
        k=f"acc.limited={key}",
    )
    spans: list[tuple[int, int]] = []
    open_since: dict[str, int] = {}
    for job_id, at, data in rows:
        status = json.loads(data)["status"]
        if job_id in open_since:
            spans.append((open_since.pop(job_id), int(at)))
        if status == "running":
            open_since[job_id] = int(at)
    now = jobs.store.now_ms()
    return spans + [(since, now) for since in open_since.values()]


def _most_at_once(spans: list[tuple[int, int]]) -> int:
    """The most intervals open at one instant (an interval ending at t is closed before one starting at t)."""
    edges = sorted([(end, -1) for _, end in spans] + [(start, 1) for start, _ in spans])
    most = running = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def _all_final(d: Deployment, count: int, timeout_s: float) -> None:
    wait_for(
        f"{count} jobs final",
        lambda: d.scalar(f"SELECT count(*) FROM jobs WHERE status IN {FINAL}") == count,
        timeout_s,
        d,
    )


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_keys_limit_holds_across_workers_and_other_keys_run_past_its_backlog(backend: str, tmp_path: Path) -> None:
    with deployment(backend, tmp_path) as d, client(d) as c:
        d.start_relay()
        workers = d.start_worker(threads=8, processes=2)
        d.wait_ready(workers)
        hot = [{"key": "hot", "sleep_ms": 5} for _ in range(400)]
        others = [{"key": f"k{n % 200}", "sleep_ms": 5} for n in range(400)]
        _submit_many(c, d, "acc_limited", hot + others)
        _all_final(d, 800, 200)
        assert d.scalar("SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 800
        assert _most_at_once(_intervals(d, "hot")) == 2
        assert max(_most_at_once(_intervals(d, f"k{n}")) for n in range(200)) <= 2
        # The other keys did not wait for the hot key's backlog: they were all done while it had most
        # of its jobs still to run (400 × 5 ms two at a time is at least 1 s).
        others_done = d.scalar("SELECT max(completed_at) FROM jobs WHERE concurrency_key <> 'acc.limited=hot'")
        hot_done_then = d.scalar(
            "SELECT count(*) FROM jobs WHERE concurrency_key = 'acc.limited=hot' AND completed_at <= :t",
            t=others_done,
        )
        assert hot_done_then < 200, f"only {400 - hot_done_then} of the hot key's jobs were left"


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sigkilled_workers_slots_come_back_when_their_leases_expire(backend: str, tmp_path: Path) -> None:
    with deployment(backend, tmp_path) as d, client(d) as c:
        d.start_relay()
        victim = d.start_worker(threads=4)
        d.wait_ready(victim)
        _submit_many(c, d, "acc_limited", [{"key": "k", "sleep_ms": 1500} for _ in range(6)])
        wait_for("two jobs running", lambda: d.scalar("SELECT count(*) FROM jobs WHERE status = 'running'") == 2, 30, d)
        d.kill(victim)
        killed_at = jobs.store.now_ms()
        rescuer = d.start_worker(threads=8)
        d.wait_ready(rescuer)
        _all_final(d, 6, 120)
        assert d.scalar("SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 6
        spans = _intervals(d, "k")
        assert _most_at_once(spans) == 2
        # After the killed attempts' leases expired, the key ran two at a time again.
        after = [(s, e) for s, e in spans if s > killed_at]
        assert _most_at_once(after) == 2
        assert d.scalar("SELECT count(*) FROM jobs WHERE attempt = 2") == 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_newcomers_jobs_start_before_the_floods_500th_later_job(tmp_path: Path) -> None:
    # One deployment: the rotation is the same code on both (the window's refills on PostgreSQL are
    # checked by the limit tests above, which pass through the same admission).
    with deployment("sqlite", tmp_path) as d, client(d) as c:
        d.start_relay()
        workers = d.start_worker(threads=8, processes=2)
        d.wait_ready(workers)
        _submit_many(c, d, "acc_noop", [{} for _ in range(5000)], owner_id="flood")
        submitted_b = jobs.store.now_ms()
        _submit_many(c, d, "acc_noop", [{} for _ in range(50)], owner_id="newcomer")
        _all_final(d, 5050, 240)
        b_starts = [r[0] for r in d.rows("SELECT started_at FROM jobs WHERE owner_id = 'newcomer'")]
        a_later = [
            r[0]
            for r in d.rows(
                "SELECT started_at FROM jobs WHERE owner_id = 'flood' AND started_at >= :t ORDER BY started_at",
                t=submitted_b,
            )
        ]
        assert len(b_starts) == 50 and len(a_later) >= 500, (len(b_starts), len(a_later))
        assert max(b_starts) < a_later[499], (
            f"the newcomer's last start came after {sum(a < max(b_starts) for a in a_later)} of the flood's"
        )
