"""Liveness and readiness checks against real components."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from broker import SQLiteBroker
from monitoring.health import live, ready, standard_checks


def test_live_is_always_ok() -> None:
    report = live()
    assert report.ok and report.http_status == 200
    assert report.to_dict()["components"]["process"]["status"] == "ok"


def test_ready_with_every_component_up(sqlite_url: str, tmp_path: Path) -> None:
    broker = SQLiteBroker(sqlite_url, middleware=[])
    try:
        out = tmp_path / "out"
        out.mkdir()
        report = ready(standard_checks(broker=broker, database=lambda: "rev abc123 (head)", output_dir=out))
    finally:
        broker.close()
    assert report.ok and report.http_status == 200
    body = report.to_dict()
    assert body["status"] == "ok"
    assert list(body["components"]) == ["database", "broker", "output_dir"]
    assert body["components"]["database"]["detail"] == "rev abc123 (head)"
    assert list(out.iterdir()) == []  # the probe file was removed


def test_ready_fails_per_component_and_hides_details_from_anonymous_callers(tmp_path: Path) -> None:
    def not_at_head() -> object:
        raise RuntimeError("database is at revision 0003, head is 0005")

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    report = ready(standard_checks(database=not_at_head, output_dir=not_a_dir))
    assert not report.ok and report.http_status == 503
    details = report.to_dict()
    assert details["components"]["database"] == {
        "status": "fail",
        "detail": "RuntimeError: database is at revision 0003, head is 0005",
        "duration_ms": details["components"]["database"]["duration_ms"],
    }
    assert details["components"]["output_dir"]["status"] == "fail"
    assert report.to_dict(details=False) == {
        "status": "fail",
        "components": {"database": {"status": "fail"}, "output_dir": {"status": "fail"}},
    }


def test_database_callable_returning_false_is_not_ready() -> None:
    assert not ready(standard_checks(database=lambda: False)).ok


def test_a_hung_check_fails_in_bounded_time() -> None:
    hold = threading.Event()

    def hangs() -> str:
        hold.wait(30)
        return "late"

    t0 = time.monotonic()
    report = ready({"slow": hangs, "fast": lambda: "ok"}, timeout_s=0.2)
    elapsed = time.monotonic() - t0
    hold.set()
    assert elapsed < 2
    assert [(c.name, c.ok, c.detail) for c in report.components] == [("slow", False, "timed out"), ("fast", True, "ok")]


def test_unreachable_sqlite_broker_is_not_ready(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    broker = SQLiteBroker(f"sqlite:///{tmp_path}/file/broker.db", middleware=[])
    try:
        report = ready(standard_checks(broker=broker))
    finally:
        broker.close()
    assert not report.ok and report.components[0].name == "broker"


@pytest.mark.services
def test_redis_broker_check(redis_url: str) -> None:
    pytest.importorskip("redis")
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=redis_url, middleware=[])
    try:
        report = ready(standard_checks(broker=broker))
    finally:
        broker.close()
    assert report.ok and report.components[0].detail == "redis"

    down = RedisBroker(url="redis://127.0.0.1:1/0", middleware=[])
    assert not ready(standard_checks(broker=down)).ok
    down.close()
