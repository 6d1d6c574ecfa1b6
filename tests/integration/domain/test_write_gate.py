"""The output-root write gate on a real full tmpfs, and with an injected failing writer."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.domain.write_gate import (
    GateTransition,
    OutputRootDegraded,
    WriteGate,
    WriteGateRegistry,
    is_root_failure,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs mounted for this test (needs root and mount permission)."""
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mountpoint)], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(f"mount -t tmpfs not permitted here: {result.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def fill(root: Path) -> Path:
    """Fill the file system until ENOSPC; return the filler file."""
    filler = root / "filler"
    with open(filler, "wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"x" * 4096)
                os.fsync(f.fileno())
    return filler


def write_output(gate: WriteGate, job_id: str, size: int = 16 * 1024) -> None:
    with gate.guard(job_id):
        (gate.root / f"{job_id}-clip.mp4").write_bytes(b"v" * size)


def test_full_tmpfs_degrades_once_refuses_fast_alerts_once_and_recovers(tiny_fs: Path) -> None:
    # Given a healthy gate on a tiny file system that is then filled up
    clock = FakeClock()
    alerts: list[GateTransition] = []
    probes: list[float] = []
    gate = WriteGate(tiny_fs, clock=clock, alert=alerts.append)
    real_probe = gate.probe
    gate.probe = lambda root: (probes.append(clock.now), real_probe(root))[1]
    write_output(gate, "job-0")
    filler = fill(tiny_fs)

    # When a job's write fails with ENOSPC, the root degrades and alerts once
    with pytest.raises(OSError) as caught:
        write_output(gate, "job-1")
    assert caught.value.errno == errno.ENOSPC
    assert gate.state == "degraded" and gate.error == "ENOSPC: No space left on device"
    assert [(a.state, a.error) for a in alerts] == [("degraded", "ENOSPC: No space left on device")]

    # Then further jobs are refused fast with the cached error, without touching the disk or alerting
    started = time.perf_counter()
    for n in range(2, 52):
        with pytest.raises(OutputRootDegraded, match="ENOSPC"):
            gate.check(f"job-{n}")
    assert (time.perf_counter() - started) / 50 < 0.005
    assert probes == [] and len(alerts) == 1

    # After the cool-down one caller probes with a real write; still full, so still degraded, no new alert
    clock.now += 31
    with pytest.raises(OutputRootDegraded):
        gate.check("job-52")
    with pytest.raises(OutputRootDegraded):
        gate.check("job-53")  # same window: no second probe
    assert len(probes) == 1 and len(alerts) == 1

    # Space returns: nothing changes before the next window, then the probe succeeds and recovery is alerted once
    filler.unlink()
    with pytest.raises(OutputRootDegraded):
        gate.check("job-54")
    clock.now += 31
    gate.check("job-55")
    assert gate.state == "healthy" and len(probes) == 2
    assert [a.state for a in alerts] == ["degraded", "healthy"]
    recovered = alerts[-1]
    assert recovered.blocked_job_ids == {f"job-{n}" for n in range(1, 55)}
    assert recovered.degraded_for_s == pytest.approx(62)
    assert gate.blocked_job_ids == frozenset()
    write_output(gate, "job-56")
    assert (tiny_fs / "job-56-clip.mp4").stat().st_size == 16 * 1024
    assert not list(tiny_fs.glob(".tenure-write-probe-*"))


def test_injected_failing_writer_single_prober_per_window(tmp_path: Path) -> None:
    # Given a gate whose probe blocks until released, and fails with EACCES the first time
    clock = FakeClock()
    alerts: list[GateTransition] = []
    release = threading.Event()
    calls: list[int] = []

    def probe(root: Path) -> None:
        calls.append(1)
        release.wait(5)
        if len(calls) == 1:
            raise PermissionError(errno.EACCES, "Permission denied")

    gate = WriteGate(tmp_path, clock=clock, alert=alerts.append, probe=probe, cooldown_s=30)
    assert gate.report_failure(PermissionError(errno.EACCES, "Permission denied", str(tmp_path)), "job-a")
    assert gate.report_failure(OSError(errno.ENOSPC, "No space left on device"), "job-b")  # already degraded
    assert len(alerts) == 1 and gate.error == "EACCES: Permission denied"

    # When 8 threads ask at once after the cool-down
    clock.now += 30
    outcomes: list[str] = []

    def ask(n: int) -> None:
        try:
            gate.check(f"job-t{n}")
            outcomes.append("ok")
        except OutputRootDegraded:
            outcomes.append("refused")

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.2)  # let the seven non-probers be refused while the probe is in flight
    assert len(calls) == 1 and outcomes.count("refused") == 7
    release.set()
    for t in threads:
        t.join(5)

    # Then exactly one probed (and failed): all refused, no new alert; the next window recovers
    assert outcomes == ["refused"] * 8 and len(calls) == 1 and len(alerts) == 1
    clock.now += 30
    gate.check("job-c")
    assert len(calls) == 2 and [a.state for a in alerts] == ["degraded", "healthy"]
    assert alerts[1].blocked_job_ids == {"job-a", "job-b", *(f"job-t{n}" for n in range(8))}


def test_file_level_errors_do_not_degrade_the_root(tmp_path: Path) -> None:
    gate = WriteGate(tmp_path)
    assert not gate.report_failure(OSError(errno.ENAMETOOLONG, "File name too long"), "j")
    assert not gate.report_failure(FileNotFoundError(errno.ENOENT, "No such file"), "j")  # root still exists
    assert not gate.report_failure(ValueError("not an OS error"), "j")
    assert gate.state == "healthy"


def test_vanished_root_degrades(tmp_path: Path) -> None:
    root = tmp_path / "mount"
    root.mkdir()
    gate = WriteGateRegistry(clock=FakeClock()).gate(root)
    root.rmdir()
    with pytest.raises(FileNotFoundError):
        write_output(gate, "job-1")
    assert gate.state == "degraded" and gate.error.startswith("ENOENT")
    assert is_root_failure(FileNotFoundError(errno.ENOENT, "x"), root)


def test_registry_reports_degraded_roots_for_health(tmp_path: Path) -> None:
    registry = WriteGateRegistry(clock=FakeClock())
    a, b = registry.gate(tmp_path / "a"), registry.gate(tmp_path / "b")
    assert registry.gate(tmp_path / "a") is a
    b.report_failure(OSError(errno.EROFS, "Read-only file system"))
    assert registry.degraded() == {b.root: "EROFS: Read-only file system"}
