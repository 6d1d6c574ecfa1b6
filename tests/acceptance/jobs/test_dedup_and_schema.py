"""Concurrent dedup across 8 processes; a worker refuses a database at an unknown newer revision."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .procs import ROOT, deployment

SUBMITTER = "tests.acceptance.jobs.apps.submit_once"
PROCESSES = 8


def _submitters(env: dict[str, str], go: Path, runs: list[tuple[str, str, dict[str, int]]]) -> list[dict[str, object]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", SUBMITTER, owner, key, json.dumps(payload), str(go)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for owner, key, payload in runs
    ]
    try:
        time.sleep(0.2)
        go.touch()
        outputs = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err.decode()
            outputs.append(json.loads(out.decode().strip().splitlines()[-1]))
        return outputs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.timeout(120)
def test_concurrent_submits_with_one_key_make_one_job(backend: str, tmp_path: Path) -> None:
    with deployment(backend, tmp_path) as d:
        results = _submitters(d.env, tmp_path / "go", [("alice", "same-key", {"n": 1})] * PROCESSES)
        assert len({r["id"] for r in results}) == 1
        assert sorted(bool(r["created"]) for r in results) == [False] * (PROCESSES - 1) + [True]
        assert d.scalar("SELECT count(*) FROM jobs") == 1
        # a different request with that key, and the same key for another owner
        later = _submitters(d.env, tmp_path / "go2", [("alice", "same-key", {"n": 2}), ("bob", "same-key", {"n": 1})])
        assert later[0] == {"conflict": True}
        assert later[1]["created"] is True and later[1]["id"] != results[0]["id"]
        assert d.scalar("SELECT count(*) FROM jobs") == 2


@pytest.mark.timeout(60)
def test_worker_refuses_unknown_newer_revision_and_leaves_the_file(tmp_path: Path) -> None:
    with deployment("sqlite", tmp_path) as d:
        path = tmp_path / "tenure.db"
        d.engine.dispose()
        with sqlite3.connect(path) as raw:
            raw.execute("DELETE FROM alembic_version")
            raw.execute("INSERT INTO alembic_version (version_num) VALUES ('9999_from_the_future')")
        raw.close()
        with sqlite3.connect(path) as raw:
            raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        raw.close()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        worker = d.start_worker()
        assert worker.wait(60) != 0
        log = d.logs()
        assert "does not know" in log and "9999_from_the_future" in log
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
