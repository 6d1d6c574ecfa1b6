"""Readiness shows an output root the workers' write gate holds degraded (its state is in the job database)."""

from __future__ import annotations

import errno
import time

import pytest

from tasks.domain.write_gate import WriteGate
from tasks.store import SQLGateStore


def test_readiness_fails_while_a_worker_holds_an_output_root_degraded(client, web_engine, root, alice, tmp_path):  # type: ignore[no-untyped-def]
    ready = client.get("/api/health/ready", headers=root.bearer)
    assert ready.status_code == 200, ready.json
    assert ready.json["components"]["output_roots"] == {
        "status": "ok",
        "detail": "no output root is degraded",
        "duration_ms": ready.json["components"]["output_roots"]["duration_ms"],
    }

    # A worker's write fails with ENOSPC: the gate (on the shared store) degrades the root
    worker_root = tmp_path / "worker-outputs"
    gate = WriteGate(worker_root, clock=time.time, store=SQLGateStore(web_engine))
    assert gate.report_failure(OSError(errno.ENOSPC, "No space left on device"), "job-1")

    failing = client.get("/api/health/ready", headers=root.bearer)
    assert failing.status_code == 503
    component = failing.json["components"]["output_roots"]
    assert component["status"] == "fail"
    assert f"output root {worker_root} is degraded: ENOSPC: No space left on device" in component["detail"]
    assert "detail" not in client.get("/api/health/ready", headers=alice.bearer).json["components"]["output_roots"]

    # A probe finds it writable again: ready again
    worker_root.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gate, "clock", lambda: time.time() + gate.cooldown_s + 1)
        gate.check("job-2")
    assert gate.state == "healthy"
    assert client.get("/api/health/ready", headers=root.bearer).status_code == 200
