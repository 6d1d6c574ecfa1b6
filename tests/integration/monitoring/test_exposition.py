"""/metrics in multiprocess mode: real child processes write the metric files, a scrape merges them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from monitoring.exposition import (
    live_gauge_pids,
    make_wsgi_app,
    mark_dead,
    pid_alive,
    prepare_multiproc_dir,
    reap_dead_processes,
    render_metrics,
)

ROOT = Path(__file__).resolve().parents[3]

#: A child that records metrics as a worker would, then (with "wait") blocks until stdin closes.
CHILD = """
import sys
import monitoring.metrics as m
m.MESSAGES_PROCESSED.labels("q", "work", "ok").inc(int(sys.argv[1]))
m.MESSAGES_IN_PROGRESS.labels("q", "work").inc(1)
m.WORKER_PROCESSES.inc()
print("ready", flush=True)
if sys.argv[2] == "wait":
    sys.stdin.read()
"""


def start_child(directory: Path, processed: int, wait: bool) -> subprocess.Popen[str]:
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(directory), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(processed), "wait" if wait else "exit"],
        env=env,
        cwd=str(ROOT),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def samples(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(body.decode())
        for s in f.samples
    }


PROCESSED = ("tenure_messages_processed_total", (("actor", "work"), ("outcome", "ok"), ("queue", "q")))
IN_PROGRESS = ("tenure_messages_in_progress", (("actor", "work"), ("queue", "q")))
WORKERS = ("tenure_worker_processes", ())


def test_dead_process_live_gauges_disappear_and_counters_keep_their_totals(tmp_path: Path) -> None:
    # Given: two "workers"; one still runs, one exited without any hook (as after SIGKILL)
    directory = prepare_multiproc_dir(tmp_path / "prom")
    running = start_child(directory, 3, wait=True)
    gone = start_child(directory, 4, wait=False)
    gone.wait(timeout=30)
    try:
        assert not pid_alive(gone.pid)
        assert set(live_gauge_pids(directory)) == {running.pid, gone.pid}

        # When: a scrape (it reaps dead pids first)
        body, status, headers = render_metrics(path=directory)

        # Then: only the running process's live gauges count; both counters still add up
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        s = samples(body)
        assert s[PROCESSED] == 7
        assert s[IN_PROGRESS] == 1
        assert s[WORKERS] == 1
        assert live_gauge_pids(directory) == [running.pid]
    finally:
        running.stdin.close()  # type: ignore[union-attr]
        running.wait(timeout=30)

    # And: after the last one exits, its gauges go too (gunicorn's child_exit would call mark_dead)
    mark_dead(running.pid, directory)
    s = samples(render_metrics(path=directory)[0])
    assert s[PROCESSED] == 7
    assert IN_PROGRESS not in s
    assert live_gauge_pids(directory) == []


def test_reap_dead_processes_keeps_living_pids(tmp_path: Path) -> None:
    directory = prepare_multiproc_dir(tmp_path / "prom")
    (directory / f"gauge_livesum_{os.getpid()}.db").write_bytes(b"")
    (directory / "gauge_livesum_999999999.db").write_bytes(b"")
    (directory / "counter_999999999.db").write_bytes(b"")
    assert reap_dead_processes(directory) == [999999999]
    assert sorted(p.name for p in directory.iterdir()) == ["counter_999999999.db", f"gauge_livesum_{os.getpid()}.db"]


def test_prepare_multiproc_dir_wipes_an_earlier_run(tmp_path: Path) -> None:
    directory = tmp_path / "prom"
    directory.mkdir()
    (directory / "counter_1.db").write_bytes(b"old")
    (directory / "sub").mkdir()
    assert prepare_multiproc_dir(directory) == directory
    assert list(directory.iterdir()) == []
    assert prepare_multiproc_dir(tmp_path / "new" / "prom").is_dir()


def test_reaping_can_be_turned_off(tmp_path: Path) -> None:
    directory = prepare_multiproc_dir(tmp_path / "prom")
    gone = start_child(directory, 1, wait=False)
    gone.wait(timeout=30)
    s = samples(render_metrics(path=directory, reap_dead=False)[0])
    assert s[IN_PROGRESS] == 1
    assert live_gauge_pids(directory) == [gone.pid]


def test_single_process_mode_exports_this_process_registry(monkeypatch) -> None:
    import monitoring.metrics as m

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    m.LEASES_LOST.inc(0)
    assert ("tenure_leases_lost_total", ()) in samples(render_metrics()[0])


def test_wsgi_app_serves_metrics_and_refuses_post(tmp_path: Path, monkeypatch) -> None:
    directory = prepare_multiproc_dir(tmp_path / "prom")
    start_child(directory, 2, wait=False).wait(timeout=30)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))  # read by the scrape, not by prometheus_client
    built: list[int] = []
    app = make_wsgi_app(lambda: built.append(1) or [])
    seen: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        seen.append(status)

    body = b"".join(app({"REQUEST_METHOD": "POST"}, start_response))
    assert seen[-1].startswith("405") and body == b""
    for _ in range(2):
        body = b"".join(app({"REQUEST_METHOD": "GET"}, start_response))
        assert seen[-1] == "200 OK"
        assert samples(body)[PROCESSED] == 2
    assert built == [1]  # sources built once, on the first request
