"""Continuing a job's trace on the worker: :class:`TracingMiddleware`, one ``tenure.job.process`` span per delivery.

For a job message whose options carry a trace context (:data:`jobs.tracing.TRACE_OPTION`), the span
starts, as a child of the span that wrote the message, before the job middleware claims the job, and
is current in the worker thread until the message was processed or skipped. The claim
(:mod:`~jobs.execution.claimer`), the run (:mod:`~jobs.execution.runner`) and the recording of the outcome
(:mod:`~jobs.execution.completer`) are its children. A message without a context (written while tracing
was off) starts a trace of its own.

Worker processes end with ``os._exit`` (multiprocessing's fork), which skips ``atexit``: so the provider's
pending spans are flushed at worker shutdown here.
"""

from __future__ import annotations

import threading
from typing import Any

from dramatiq.broker import Broker
from dramatiq.middleware import Middleware
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from .. import tracing
from ..publish import JOB_ID_OPTION

#: How long the flush at worker shutdown may take, in milliseconds.
FLUSH_TIMEOUT_MS = 5_000


class TracingMiddleware(Middleware):
    """A span per job message delivery (see the module docstring); add it in front of the job middleware."""

    def __init__(self) -> None:
        self._local = threading.local()

    def before_process_message(self, broker: Broker, message: Any) -> None:
        t = tracing.tracer()
        job_id = message.options.get(JOB_ID_OPTION)
        if t is None or job_id is None:
            return
        attributes = {
            **tracing.job_attributes(job_id, message.actor_name, queue=message.queue_name),
            "messaging.system": "dramatiq",
            "messaging.message.id": message.message_id,
        }
        span = t.start_span(
            "tenure.job.process",
            context=tracing.context_of(message.options),
            kind=SpanKind.CONSUMER,
            attributes=attributes,
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        self._local.delivery = (span, token)

    def after_process_message(self, broker: Broker, message: Any, *, result: Any = None, exception: Any = None) -> None:
        self._end(problem=None if exception is None else type(exception).__name__)

    def after_skip_message(self, broker: Broker, message: Any) -> None:
        self._end(skipped=True)

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        tracing.flush(FLUSH_TIMEOUT_MS)

    def _end(self, *, problem: str | None = None, skipped: bool = False) -> None:
        delivery: tuple[Span, object] | None = getattr(self._local, "delivery", None)
        if delivery is None:
            return
        self._local.delivery = None
        span, token = delivery
        if skipped:  # a duplicate delivery, a cancelled or finished job: nothing ran
            span.set_attribute("tenure.job.skipped", True)
        tracing.failed(span, problem)
        otel_context.detach(token)  # type: ignore[arg-type]
        span.end()
