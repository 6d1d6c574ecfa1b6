"""The write gate's state in the job database: gates of different processes (here: separate engines that
contend like processes do) see one state, one probe per window in all, one alert per transition in all."""

from __future__ import annotations

import errno
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from sqlalchemy import Engine

from jobs.db import make_engine
from jobs.schema import upgrade
from tasks.domain.write_gate import GateTransition, OutputRootDegraded, WriteGate
from tasks.store import SQLGateStore
from tests.integration.jobs.support import postgres_database

ENOSPC = OSError(errno.ENOSPC, "No space left on device")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.services)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'tenure.db'}"
    else:
        with postgres_database() as url:
            yield url


@pytest.fixture()
def engines(database_url: str) -> Iterator[list[Engine]]:
    """Four engines on one migrated database, each as if in its own worker process."""
    upgrade(database_url)
    with ExitStack() as stack:
        made = []
        for _ in range(4):
            engine = make_engine(database_url, serialize_writers=False)
            stack.callback(engine.dispose)
            made.append(engine)
        yield made


def gates(engines: list[Engine], root: Path, clock: FakeClock, alerts: list[GateTransition], probe) -> list[WriteGate]:  # type: ignore[no-untyped-def]
    return [
        WriteGate(root, clock=clock, alert=alerts.append, probe=probe, cooldown_s=30, store=SQLGateStore(e))
        for e in engines
    ]


def test_one_state_for_every_process(engines: list[Engine], tmp_path: Path) -> None:
    clock, alerts, probes = FakeClock(), [], []
    release = threading.Event()
    outcome = {"fail": True}

    def probe(root: Path) -> None:
        probes.append(root)
        release.wait(5)
        if outcome["fail"]:
            raise OSError(errno.ENOSPC, "No space left on device")

    first, *others = gates(engines, tmp_path, clock, alerts, probe)

    # One process's write fails: the root degrades for all of them, alerted once
    assert first.report_failure(ENOSPC, "job-a")
    assert others[0].report_failure(ENOSPC, "job-b")  # a second failure elsewhere: no second alert
    assert [(a.state, a.error) for a in alerts] == [("degraded", "ENOSPC: No space left on device")]
    for n, gate in enumerate(others):
        assert gate.state == "degraded"
        with pytest.raises(OutputRootDegraded, match="ENOSPC") as refused:
            gate.check(f"job-r{n}")  # refused fast: no write, no probe of its own
        assert refused.value.retry_in_s == pytest.approx(30)
    assert probes == []

    # After the cool-down, callers in every process ask at once: exactly one probes
    clock.now += 30
    results: list[str] = []

    def ask(gate: WriteGate, n: int) -> None:
        try:
            gate.check(f"job-t{n}")
            results.append("ok")
        except OutputRootDegraded:
            results.append("refused")

    threads = [threading.Thread(target=ask, args=(g, n)) for n, g in enumerate([first, *others] * 2)]
    for t in threads:
        t.start()
    release.set()
    for t in threads:
        t.join(10)
    assert len(probes) == 1 and results == ["refused"] * 8 and len(alerts) == 1
    record = first.store.gate_get(first.key)
    assert record is not None and record.last_probe_at == clock.now and record.next_probe_at == clock.now + 30

    # The next window: one probe succeeds; recovery is alerted once, with every process's refused jobs
    outcome["fail"] = False
    clock.now += 30
    others[2].check("job-c")
    assert others[2].check("job-d") is None and first.check("job-e") is None  # healthy everywhere, no probe
    assert len(probes) == 2 and [a.state for a in alerts] == ["degraded", "healthy"]
    recovered = alerts[1]
    assert recovered.blocked_job_ids == {"job-a", "job-b", "job-r0", "job-r1", "job-r2"} | {
        f"job-t{n}" for n in range(8)
    }
    assert recovered.degraded_for_s == pytest.approx(60)
    assert first.blocked_job_ids == frozenset() and first.store.gate_degraded() == {}


def test_file_level_errors_do_not_touch_the_shared_state(engines: list[Engine], tmp_path: Path) -> None:
    [gate, *_] = gates(engines, tmp_path, FakeClock(), [], lambda root: None)
    assert not gate.report_failure(OSError(errno.ENAMETOOLONG, "File name too long"), "j")
    assert gate.store.gate_get(gate.key) is None and gate.state == "healthy"
