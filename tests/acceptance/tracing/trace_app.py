"""Job kinds of the tracing acceptance test (``TENURE_WEB_TASKS_APP`` and the worker's app).

:func:`compose` is ``tasks.compose`` (which turns tracing on from ``TENURE_TRACING``) plus these kinds:
an echo, a kind whose first attempt fails (its retry must join the trace), one that completes in its
own ``result_transaction``, one that makes an HTTP request with httpx, one on a queue of its own, one whose
first attempt runs until its worker is killed, and a two-step workflow.
"""

from __future__ import annotations

import os
import time

import httpx

import jobs
import tasks
from jobs import JobContext, Step, WorkflowRequest, payloads
from tests.fast_stop import FastStop

QUEUE = "traced"
#: The queue of the kind a second worker runs (the test of the flush at worker shutdown).
FLUSH_QUEUE = "traced_flush"
#: The queue of the kind whose first worker is killed (the test of a recovered attempt).
LOST_QUEUE = "traced_lost"

TEXT = payloads.schema("Echo text", text=payloads.field("string", "Text", required=True))


@jobs.registry.kind("trace_echo", queue=QUEUE, payload=TEXT)
def echo(ctx: JobContext, *, text: str) -> dict[str, object]:
    """Echo text."""
    return {"length": len(text)}


@jobs.registry.kind("trace_flaky", queue=QUEUE, payload=TEXT, max_attempts=2, backoff=lambda attempt: 0.05)
def flaky(ctx: JobContext, *, text: str) -> dict[str, object]:
    """Fail the first attempt, succeed the second."""
    if ctx.attempt == 1:
        raise RuntimeError(f"first attempt of {text} fails")
    return {"attempt": ctx.attempt}


@jobs.registry.kind("trace_own_commit", queue=QUEUE, payload=TEXT)
def own_commit(ctx: JobContext, *, text: str) -> None:
    """Complete in the actor's own result transaction."""
    with ctx.result_transaction() as tx:
        tx.complete({"length": len(text)})


@jobs.registry.kind("trace_fetch", queue=QUEUE, payload=TEXT)
def fetch(ctx: JobContext, *, text: str) -> dict[str, object]:
    """GET the URL in ``TRACE_FETCH_URL`` (the test's receiver) with httpx, as the notification actor posts."""
    return {"status": httpx.get(os.environ["TRACE_FETCH_URL"], timeout=10).status_code}


@jobs.registry.kind("trace_flush", queue=FLUSH_QUEUE, payload=TEXT)
def flush(ctx: JobContext, *, text: str) -> None:
    """Nothing: run by a worker whose spans leave it only when it stops."""


@jobs.registry.kind("trace_lost", queue=LOST_QUEUE, payload=TEXT)
def lost(ctx: JobContext, *, text: str) -> dict[str, object]:
    """Run the first attempt until its worker is killed; complete the next one."""
    while ctx.attempt == 1:
        ctx.check_cancelled()
        time.sleep(0.05)
    return {"attempt": ctx.attempt}


@jobs.registry.workflow("trace_flow", payload=TEXT)
def flow(request: WorkflowRequest, *, text: str) -> list[Step]:
    """Two echo steps, the second after the first."""
    return [Step("first", "trace_echo", {"text": text}), Step("second", "trace_echo", {"text": text}, ["first"])]


def compose(settings: object = None) -> None:
    broker = tasks.compose(settings).broker  # type: ignore[arg-type]
    if not any(isinstance(m, FastStop) for m in broker.middleware):
        broker.add_middleware(FastStop())
