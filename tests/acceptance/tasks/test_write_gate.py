"""The output-root write gate in real workers: a full tmpfs degrades once, refuses fast, alerts once, recovers."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from tasks.domain.demo_recording import DemoRecording

from .conftest import Fleet


@pytest.fixture()
def tiny_output_root(fleet: Fleet) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted at the fleet's output root (needs root and mount permission)."""
    root = fleet.output_root
    root.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(root)], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(f"mount -t tmpfs not permitted here: {result.stderr.strip()}")
    try:
        yield root
    finally:
        fleet.stop()
        subprocess.run(["umount", "-l", str(root)], check=False)


def fill(root: Path) -> Path:
    filler = root / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_full_output_root_degrades_once_refuses_fast_and_recovers(
    fleet: Fleet, recording: DemoRecording, tiny_output_root: Path
) -> None:
    # Given a worker whose output root is full
    filler = fill(tiny_output_root)
    fleet.worker("main", ("default", "render"), threads=1, TENURE_WRITE_GATE_COOLDOWN_S="3")
    imported = fleet.wait_terminal(fleet.submit("import_recording", {"folder": str(recording.folder)}).id)
    render = {"session_id": imported.result["session_id"], "start_s": 1.0, "end_s": 3.0, "width": 320, "height": 180}

    # When a render fails on it, and another is started while the root is degraded
    a = fleet.submit("render_clip", render, max_attempts=8).id
    fleet.wait(lambda: fleet.event(a, "output_root_degraded"), 60, "the root to degrade")
    b = fleet.submit("render_clip", render | {"name": "second"}, max_attempts=8).id
    refused = fleet.wait(lambda: (j := fleet.job(b)).error and j, 30, "the second render to be refused")

    # Then the second was refused at once with the cached error, and retried later (not failed)
    assert "is degraded" in refused.error and "ENOSPC" in refused.error
    assert refused.status in ("queued", "running")
    assert fleet.event(b, "ffmpeg_started") is None

    # When space returns, both complete on a later attempt
    filler.unlink()
    for job_id in (a, b):
        job = fleet.wait_terminal(job_id, 90)
        assert job.status == "succeeded", job.error
        assert job.attempt >= 2 and Path(job.result["path"]).is_file()

    # And there was one alert per transition in this worker, not one per job
    log = (fleet.tmp / "main.log").read_text()
    alerts = [line for line in log.splitlines() if "ALERT output root" in line]
    assert len(alerts) == 2
    assert "is degraded: ENOSPC" in alerts[0] and "recovered after" in alerts[1]


def alerts_in(fleet: Fleet) -> list[str]:
    """Every ALERT line of every worker's log, in time order (lines start with their timestamp)."""
    lines = [line for log in fleet.tmp.glob("*.log") for line in log.read_text().splitlines() if "ALERT" in line]
    return sorted(lines)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_gate_is_shared_by_worker_processes_and_recovery_runs_the_blocked_jobs_at_once(
    fleet: Fleet, recording: DemoRecording, tiny_output_root: Path
) -> None:
    # Given a full output root, a long cool-down (the refused jobs' backoff), and a first worker process
    filler = fill(tiny_output_root)
    fleet.env_extra["TENURE_WRITE_GATE_COOLDOWN_S"] = "30"
    fleet.worker("first", ("default", "render"), threads=1)
    imported = fleet.wait_terminal(fleet.submit("import_recording", {"folder": str(recording.folder)}).id)
    render = {"session_id": imported.result["session_id"], "start_s": 1.0, "end_s": 3.0, "width": 320, "height": 180}

    # When a render fails on it there, the root degrades (in the database)
    a = fleet.submit("render_clip", render, max_attempts=8).id
    fleet.wait(lambda: fleet.event(a, "output_root_degraded"), 60, "the root to degrade")
    [(state, error)] = fleet.sql("SELECT state, error FROM output_root_health")
    assert state == "degraded" and error.startswith("ENOSPC")
    fleet.stop("first")

    # Then a second worker process, which never wrote there, refuses a render fast with the cached error
    fleet.worker("second", ("render",), threads=1)
    b = fleet.submit("render_clip", render | {"name": "second"}, max_attempts=8).id
    refused = fleet.wait(lambda: (j := fleet.job(b)).error and j, 60, "the second worker to refuse")
    assert refused.status == "queued" and "is degraded: ENOSPC" in refused.error
    assert fleet.event(b, "ffmpeg_started") is None and fleet.event(b, "output_root_degraded") is None
    assert {r.job_id for r in fleet.sql("SELECT job_id FROM output_root_blocked_jobs")} == {a, b}
    assert len(alerts_in(fleet)) == 1  # the degradation, once, by the first process only
    waits = {j: fleet.sql("SELECT run_after FROM jobs WHERE id = :id", id=j)[0][0] for j in (a, b)}
    assert all(w > time.time() * 1000 + 20_000 for w in waits.values())  # both wait out the cool-down

    # When space returns and the probe window opens (aged in the database, not slept), the next job probes
    filler.unlink()
    fleet.worker("first-again", ("default", "render"), threads=1)
    with fleet.engine.begin() as conn:
        conn.execute(text("UPDATE output_root_health SET next_probe_at = 0"))
    c = fleet.submit("render_clip", render | {"name": "third"}, max_attempts=8).id

    # Then the blocked jobs run at once (their backoff cleared), long before it would have ended
    for job_id in (a, b, c):
        job = fleet.wait_terminal(job_id, 60)
        assert job.status == "succeeded", job.error
    for job_id, wait_until in waits.items():
        [(completed,)] = fleet.sql("SELECT completed_at FROM jobs WHERE id = :id", id=job_id)
        assert completed < wait_until - 15_000
        assert any(e.type == "run_now" and e.data == {"by": "write-gate"} for e in fleet.events(job_id))
    [(state,)] = fleet.sql("SELECT state FROM output_root_health")
    assert state == "healthy" and fleet.sql("SELECT count(*) FROM output_root_blocked_jobs")[0][0] == 0
    # And each transition was alerted once across all the processes
    alerts = alerts_in(fleet)
    assert len(alerts) == 2 and "is degraded: ENOSPC" in alerts[0] and "recovered after" in alerts[1]
