"""Job kinds for the operator CLI's end-to-end test (``TENURE_WEB_TASKS_APP`` and the worker's app).

:func:`compose` is ``tasks.compose`` (settings, broker, job and schedule middleware) plus these kinds,
the plain actor and the schedule, on its broker. A held job runs until the test creates its release
files in ``CLI_FLAG_DIR`` (or it is cancelled), so the test decides when a running job moves on and ends.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import dramatiq

import jobs
import tasks
from jobs import JobContext, payloads
from tasks.scheduling import cron, schedule_job
from tests.fast_stop import FastStop

QUEUE = "cli"
SLOW_QUEUE = "cli_slow"
#: How often a held job looks for its release file (and checks for a cancel).
HOLD_POLL_S = 0.05


def release_path(label: str, step: int) -> Path:
    return Path(os.environ["CLI_FLAG_DIR"]) / f"release-{label}-{step}"


HOLD = payloads.schema(
    "Hold until released",
    label=payloads.field("string", "Label", required=True),
    steps=payloads.field("integer", "Steps", minimum=1, default=1),
)
STUCK = payloads.schema("Stuck in C code", label=payloads.field("string", "Label", required=True))
FAIL = payloads.schema("Always fail", message=payloads.field("string", "Message", default="the disk is full"))
ECHO = payloads.schema("Echo text", text=payloads.field("string", "Text", required=True))


@jobs.registry.kind("cli_hold", queue=QUEUE, payload=HOLD, summary=lambda p: p["label"])
def hold(ctx: JobContext, *, label: str, steps: int = 1) -> dict[str, object]:
    """Hold until released.

    Records a ``holding`` event, then waits for the release file of each step (honouring cancel
    meanwhile) and reports the progress of each step released.
    """
    ctx.event("holding", label=label)
    for step in range(steps):
        while not release_path(label, step).exists():
            ctx.check_cancelled()
            time.sleep(HOLD_POLL_S)
        ctx.progress((step + 1) / steps, f"{label}: step {step + 1} of {steps}")
    ctx.event("released", label=label)
    return {"label": label}


def stuck_path(label: str) -> Path:
    return Path(os.environ["CLI_FLAG_DIR"]) / f"stuck-{label}"


@jobs.registry.kind("cli_stuck", queue=QUEUE, max_attempts=1, timeout_s=1, payload=STUCK)
def stuck(ctx: JobContext, *, label: str) -> dict[str, object]:
    """Stuck in C code.

    When the test made the FIFO ``stuck-<label>``, blocks opening it until the test opens it for
    writing: ``open`` of a FIFO waits in the kernel, where the 1 s time limit's asynchronous exception
    cannot reach the thread (it fires only between bytecodes, once the call returns). Without the FIFO
    it returns at once.
    """
    fifo = stuck_path(label)
    if fifo.exists():
        with open(fifo, "rb") as f:
            f.read()
    return {"label": label}


@jobs.registry.kind("cli_fail", queue=QUEUE, max_attempts=1, payload=FAIL)
def fail(ctx: JobContext, *, message: str = "the disk is full") -> None:
    """Always fail.

    Fails on its single attempt with the given message.
    """
    raise RuntimeError(message)


@jobs.registry.kind("cli_echo", queue=SLOW_QUEUE, payload=ECHO, summary=lambda p: p["text"])
def echo(ctx: JobContext, *, text: str) -> dict[str, object]:
    """Echo text.

    Returns the text; runs on its own queue (the test pauses it).
    """
    return {"echo": text}


def cli_flaky(flag_path: str) -> None:
    """A plain Dramatiq actor: dead-lettered until *flag_path* exists, then writes ``<flag>.done``."""
    flag = Path(flag_path)
    if not flag.exists():
        raise RuntimeError("flag missing")
    flag.with_suffix(".done").write_text("ok")


def compose(settings: object = None) -> None:
    broker = tasks.compose(settings).broker  # type: ignore[arg-type]
    if "cli_flaky" in broker.actors:
        return
    broker.add_middleware(FastStop())
    dramatiq.actor(cli_flaky, queue_name=QUEUE, max_retries=0, broker=broker)
    # A nightly schedule that submits an echo job (the test runs it now, pauses and resumes it).
    schedule_job("cli_echo", cron("0 3 * * *", name="cli_nightly"), payload={"text": "nightly"}, broker=broker)
