"""The real job layer, driven by hand for web tests: a worker identity that claims and finishes jobs.

Web tests submit through the API or the UI; where a test needs a job in some state (running, failed,
with progress or an event) this driver makes it get there the way a worker would — a real claim, real
progress and events, a real outcome through the completer — on the test's own database file. No
worker thread runs: nothing happens to a job unless the test asks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jobs
from broker import SQLiteBroker
from jobs import JobContext, payloads
from jobs.execution.binding import JobMiddleware
from jobs.execution.completer import Cancelled, Failed, Succeeded
from jobs.registry import Registry
from settings.environment import Settings

#: The kinds the web tests submit (a small, fast pair with a form of each field type the UI renders).
ECHO = payloads.schema(
    "Echo",
    "Returns its text.",
    text=payloads.field("string", "Text", "what to echo", required=True, max_length=2000),
    times=payloads.field("integer", "Times", "how often", minimum=1, maximum=100, default=1),
)
SLEEP = payloads.schema(
    "Sleep", "Sleeps.", seconds=payloads.field("number", "Seconds", "how long", unit="s", minimum=0, required=True)
)


def declare_kinds(registry: Registry, broker: SQLiteBroker) -> None:
    registry.kind("echo", payload=ECHO, summary=lambda p: str(p["text"]), broker=broker)(
        lambda ctx, *, text, times=1: {"echo": " ".join([text] * times)}
    )
    registry.kind("sleep", queue="slow", payload=SLEEP, broker=broker)(lambda ctx, *, seconds: None)


@dataclass
class JobDriver:
    """A worker identity on the web test's database (see the module docstring)."""

    engine: Any
    broker: SQLiteBroker
    registry: Registry
    settings: Settings
    output_root: Path
    _contexts: dict[str, JobContext] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.worker = JobMiddleware(self.settings, engine=self.engine, registry=self.registry, check_schema=False)
        self.worker.worker.broker = self.broker

    # -- reading --------------------------------------------------------------------------------------
    def job(self, job_id: str) -> jobs.JobRecord:
        return jobs.get_job(self.engine, job_id, owner_id="", is_admin=True)

    def status(self, job_id: str) -> str:
        return str(self.job(job_id).status)

    def count(self) -> int:
        return len(jobs.list_jobs(self.engine, owner_id="", is_admin=True, limit=500))

    def payload(self, job_id: str) -> dict[str, Any]:
        import json

        from jobs import db, store

        with db.read(self.engine) as conn:
            row = store.job_get(conn, job_id)
        assert row is not None
        return dict(json.loads(row.payload))

    # -- making things happen -------------------------------------------------------------------------
    def submit(self, owner_id: str, kind: str = "echo", payload: dict[str, Any] | None = None) -> jobs.JobRecord:
        return jobs.submit(
            self.engine,
            owner_id=owner_id,
            kind=kind,
            payload=payload if payload is not None else {"text": "hi"},
            registry=self.registry,
            settings=self.settings,
        )

    def start(self, job_id: str) -> JobContext:
        """Claim the job (queued → running, attempt + 1) as a worker would."""
        ctx = self._contexts.get(job_id)
        if ctx is not None and not (ctx.completed or ctx.lost):
            return ctx
        self._its_turn(job_id)
        ctx = self.worker.claimer.claim(self.broker, job_id)
        assert ctx is not None, f"job {job_id} is not claimable"
        self._contexts[job_id] = ctx
        return ctx

    def _its_turn(self, job_id: str) -> None:
        """A job waiting in its queue's fair-share window (a test world queues many) is admitted now, as the
        window would admit it once the jobs ahead of it had started: a test picks which job runs."""
        from jobs import admission, db
        from jobs.admission_store import QUEUE, HeldJob

        with db.write(self.engine) as tx:
            tx.broker = self.broker
            row = jobs.store.job_get(tx.conn, job_id)
            if row is None or row.held != QUEUE:
                return
            waiting = HeldJob.of(row)
            now = jobs.store.now_ms()
            admission.admit(tx, waiting, now=now, delay_ms=0, fair=False, waiting=(QUEUE, row.queue_name))

    def progress(self, job_id: str, fraction: float, message: str | None = None) -> None:
        ctx = self.start(job_id)
        ctx._progress_due = 0.0  # written at once, as if the progress interval had passed
        ctx.progress(fraction, message)

    def event(self, job_id: str, type_: str, **data: Any) -> int:
        return self.start(job_id).event(type_, **data)

    def succeed(self, job_id: str, result: Any = None) -> None:
        self._finish(job_id, Succeeded(jobs.store.dumps(result)))

    def fail(self, job_id: str, error: str = "RuntimeError: boom") -> None:
        """The attempt fails for good (no retry), with *error* as its stored error."""
        self._finish(job_id, Failed(error))

    def cancel_running(self, job_id: str) -> None:
        self._finish(job_id, Cancelled())

    def _finish(self, job_id: str, outcome: Any) -> None:
        ctx = self.start(job_id)
        self.worker.runner.record(ctx, outcome)
        assert self.status(job_id) != "running", f"the outcome of job {job_id} was not recorded"

    def write_file(self, job_id: str, name: str, data: bytes) -> Path:
        """A file the job produced, where the gateway looks for it."""
        directory = self.output_root / job_id
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / name
        path.write_bytes(data)
        return path
