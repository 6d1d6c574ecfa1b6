"""Job kinds for the web app's end-to-end tests: small, fast and deterministic.

Both the web process (``TENURE_WEB_TASKS_APP=tests.e2e.apps.web_kinds:compose``) and the worker
(``python -m dramatiq tests.e2e.apps.web_kinds:compose``) compose themselves with :func:`compose`:
Tenure's own composition root (settings, broker, job and schedule middleware, the real kinds) plus
the kinds, the plain actor and the schedule declared here, on the same broker.
"""

from __future__ import annotations

import time
from pathlib import Path

import dramatiq

import jobs
import tasks
from jobs import JobContext, payloads
from tasks.scheduling import cron, schedule_job
from tests.fast_stop import FastStop

from .hourly import declare_hourly_tick

QUEUE = "e2e"
SLOW_QUEUE = "e2e_slow"


PROGRESS = payloads.schema(
    "Count through steps",
    "Reports progress after every step, honours cancel at each step and writes a small report file.",
    steps=payloads.field("integer", "Steps", minimum=1, maximum=10_000, default=20),
    step_s=payloads.field("number", "Step length", unit="s", minimum=0, maximum=60, default=0.25),
    label=payloads.field("string", "Label", max_length=200, default="work"),
)
FAIL = payloads.schema(
    "Always fail",
    "Fails on its single attempt with the given message.",
    message=payloads.field("string", "Message", max_length=500, default="the disk is full"),
)
ECHO = payloads.schema(
    "Echo text",
    "Returns the text repeated; runs on its own queue (the pause test pauses it).",
    text=payloads.field("string", "Text", required=True, max_length=2000),
    times=payloads.field("integer", "Times", minimum=1, maximum=100, default=1),
    shout=payloads.field("boolean", "Shout", default=False),
)


@jobs.registry.kind("e2e_progress", queue=QUEUE, payload=PROGRESS, summary=lambda p: p.get("label"))
def progress(ctx: JobContext, *, steps: int = 20, step_s: float = 0.25, label: str = "work") -> dict[str, object]:
    """Count through steps.

    Reports progress after every step, honours cancel at each step and writes a small report file.
    """
    for i in range(steps):
        ctx.check_cancelled()
        ctx.progress(i / steps, f"{label}: step {i + 1} of {steps}")
        time.sleep(step_s)
    path = ctx.output_path("report.txt")
    path.write_text(f"{label}: {steps} steps\n")
    return {"steps": steps, "label": label}


@jobs.registry.kind("e2e_fail", queue=QUEUE, max_attempts=1, payload=FAIL)
def fail(ctx: JobContext, *, message: str = "the disk is full") -> None:
    """Always fail.

    Fails on its single attempt with the given message.
    """
    ctx.progress(0.5, "about to fail")
    raise RuntimeError(message)


@jobs.registry.kind("e2e_echo", queue=SLOW_QUEUE, payload=ECHO, summary=lambda p: p["text"])
def echo(ctx: JobContext, *, text: str, times: int = 1, shout: bool = False) -> dict[str, object]:
    """Echo text.

    Returns the text repeated; runs on its own queue (the pause test pauses it).
    """
    out = " ".join([text.upper() if shout else text] * times)
    return {"echo": out}


def e2e_flaky(flag_path: str) -> None:
    """A plain Dramatiq actor: dead-lettered until *flag_path* exists, then writes ``<flag>.done``."""
    flag = Path(flag_path)
    if not flag.exists():
        raise RuntimeError("flag missing")
    flag.with_suffix(".done").write_text("ok")


def compose(settings: object = None) -> None:
    composition = tasks.compose(settings)  # type: ignore[arg-type]
    broker = composition.broker
    if not any(isinstance(m, FastStop) for m in broker.middleware):
        broker.add_middleware(FastStop())  # a SIGTERM'd test worker exits in ~0.4 s instead of ~2.5 s
    if "e2e_flaky" not in broker.actors:
        dramatiq.actor(e2e_flaky, queue_name=QUEUE, max_retries=0, broker=broker)
        # A nightly schedule that submits an echo job (the UI's schedules page shows it; "Run now" fires it).
        schedule_job("e2e_echo", cron("0 3 * * *", name="nightly_echo"), payload={"text": "nightly"}, broker=broker)
        declare_hourly_tick(broker)
