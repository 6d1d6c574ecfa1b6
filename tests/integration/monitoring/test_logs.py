"""Lifecycle log lines: allow-listed fields only, and the metrics they feed."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

import monitoring.metrics as m
from monitoring.logs import LIFECYCLE_LOGGER, LifecycleFormatter, install, log_event


@pytest.fixture()
def lifecycle() -> Iterator[io.StringIO]:
    logger = logging.getLogger(LIFECYCLE_LOGGER)
    saved = (list(logger.handlers), logger.level, logger.propagate)
    stream = io.StringIO()
    install(stream=stream)
    yield stream
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def value(name: str, **labels: str) -> float:
    return m.REGISTRY.get_sample_value(name, labels) or 0.0


def test_job_layer_style_record_prints_only_allow_listed_fields(lifecycle: io.StringIO) -> None:
    # The job layer does not import monitoring: it logs a plain record with extra={"tenure": {...}}
    logging.getLogger("tenure.lifecycle").info(
        "job.completed",
        extra={
            "tenure": {
                "event": "job.completed",
                "job_id": "j-42",
                "kind": "render",
                "attempt": 2,
                "outcome": "succeeded",
                "duration_s": 1.2345678,
                "payload": {"password": "hunter2"},
                "result": {"secret": "s3cr3t"},
            }
        },
    )
    line = lifecycle.getvalue().strip()
    assert "event=job.completed job_id=j-42 kind=render attempt=2 outcome=succeeded duration_s=1.234568" in line
    assert "hunter2" not in line and "s3cr3t" not in line and "payload" not in line


def test_values_are_single_line_quoted_and_truncated(lifecycle: io.StringIO) -> None:
    log_event("job.failed", job_id="j 1", kind="asr", attempt=1, outcome="failed", error_type="Bad\nThing" + "x" * 500)
    line = lifecycle.getvalue()
    assert line.count("\n") == 1
    assert 'job_id="j 1"' in line
    assert len(line) < 400


def test_json_lines() -> None:
    record = logging.LogRecord(LIFECYCLE_LOGGER, logging.INFO, __file__, 1, "job.started", (), None)
    record.tenure = {"event": "job.started", "job_id": "j-1", "kind": "import", "attempt": 1, "args": [1, 2]}
    data = json.loads(LifecycleFormatter(as_json=True).format(record))
    assert {k: data[k] for k in ("event", "job_id", "kind", "attempt", "level")} == {
        "event": "job.started",
        "job_id": "j-1",
        "kind": "import",
        "attempt": 1,
        "level": "INFO",
    }
    assert "args" not in data


def test_other_records_format_normally() -> None:
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "plain %s", ("text",), None)
    assert LifecycleFormatter().format(record).endswith("WARNING x plain text")


def test_events_feed_metrics(lifecycle: io.StringIO) -> None:
    before = (
        value("tenure_jobs_finished_total", kind="notify-test", outcome="cancelled"),
        value("tenure_stale_attempts_total"),
        value("tenure_schedule_fires_total", schedule="resync-test", result="duplicate"),
    )
    log_event("job.cancelled", job_id="j-9", kind="notify-test", attempt=1, outcome="cancelled")
    log_event("job.stale_write", job_id="j-9", kind="notify-test", attempt=1)
    log_event("schedule.fire", schedule="resync-test", result="duplicate")
    log_event("schedule.fire", schedule="resync-test", result="not-a-result")  # ignored, not a new label
    after = (
        value("tenure_jobs_finished_total", kind="notify-test", outcome="cancelled"),
        value("tenure_stale_attempts_total"),
        value("tenure_schedule_fires_total", schedule="resync-test", result="duplicate"),
    )
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 1]
    assert (
        m.REGISTRY.get_sample_value(
            "tenure_schedule_fires_total", {"schedule": "resync-test", "result": "not-a-result"}
        )
        is None
    )


def test_record_schedule_fire_refuses_unknown_results() -> None:
    with pytest.raises(ValueError):
        m.record_schedule_fire("nightly", "maybe")


def test_log_event_counts_without_a_handler_and_once_with_one(lifecycle: io.StringIO) -> None:
    # A periodiq process never boots MetricsMiddleware: log_event must count by itself
    logger = logging.getLogger(LIFECYCLE_LOGGER)
    handlers, logger.handlers[:] = list(logger.handlers), []
    try:
        log_event("schedule.fire", level=logging.DEBUG, schedule="lonely-test", result="fired", tick="t")
    finally:
        logger.handlers[:] = handlers
    assert value("tenure_schedule_fires_total", schedule="lonely-test", result="fired") == 1
    # With the metrics handler installed (the lifecycle fixture), the record is not counted again
    log_event("schedule.fire", schedule="lonely-test", result="skipped", ticks=3)
    assert value("tenure_schedule_fires_total", schedule="lonely-test", result="skipped") == 3
    assert "event=schedule.fire schedule=lonely-test result=skipped ticks=3" in lifecycle.getvalue()
    log_event("schedule.fire", schedule="lonely-test", result="skipped", ticks=True)  # not a count: ignored
    assert value("tenure_schedule_fires_total", schedule="lonely-test", result="skipped") == 3
