"""The output-root write gate in real workers: a full tmpfs degrades once, refuses fast, alerts once, recovers."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

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
