"""What the job layer tells OpenTelemetry: its spans, their attributes, and the trace context a message carries.

The job layer speaks only the OpenTelemetry *API*. Until the process's tracing is turned on
(:func:`enable`, called by :mod:`monitoring.tracing` when ``TENURE_TRACING`` is on) every helper here
returns at once: no span, no context, no message option. Once on:

- a submit is a ``tenure.job.submit`` span (:func:`jobs.submit`), and every message the job layer writes
  while a span is current carries that span's W3C context in its :data:`TRACE_OPTION` option (through the
  outbox too: the option is part of the encoded message); the submit's context is also kept on the job's
  row (``jobs.trace_context``), for a message written outside any span (recovery of a lost worker's job);
- a worker continues the trace of each job message it takes (:mod:`jobs.execution.tracing`), so the claim,
  the actor's run and the transaction recording the outcome are spans of the submit's trace; a retry's or a
  workflow step's message is written inside such a span, so later attempts and steps join the same trace.

Attributes name the job (:func:`job_attributes`) — never its payload, result, error text or credentials.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

#: The message option holding the W3C trace context (``traceparent``/``tracestate``) of the span that wrote it.
TRACE_OPTION = "tenure_trace"
#: The instrumentation scope of the job layer's spans.
SCOPE = "tenure.jobs"

# W3C trace context only: baggage would copy whatever a caller put in it into every message.
_propagator = TraceContextTextMapPropagator()
#: The job layer's tracer once :func:`enable` was called; None while tracing is off. Every helper reads
#: this first, so tracing off costs a global read per helper (the API's no-op spans cost microseconds).
_tracer: Tracer | None = None
_provider: TracerProvider | None = None
#: What :func:`span` returns while tracing is off (reusable: it holds no state).
_OFF = nullcontext()


def enable(provider: TracerProvider) -> None:
    """Record the job layer's spans with *provider* (``monitoring.tracing`` calls it when tracing is on)."""
    global _tracer, _provider
    _provider, _tracer = provider, provider.get_tracer(SCOPE)


def flush(timeout_ms: int) -> None:
    """Export the spans the provider still holds (a process about to end without ``atexit``)."""
    force_flush = getattr(_provider, "force_flush", None)  # the SDK's; the API's providers hold nothing
    if force_flush is not None:
        force_flush(timeout_ms)


def tracer() -> Tracer | None:
    """The job layer's tracer, or None while tracing is off."""
    return _tracer


def current_context() -> Context | None:
    """The caller's trace context, to carry a piece of its work to another thread (None while tracing is off)."""
    return None if _tracer is None else otel_context.get_current()


def within(carried: Context | None) -> AbstractContextManager[object]:
    """Run a block in a context :func:`current_context` carried from another thread (its spans' parent)."""
    return _OFF if carried is None else _attached(carried)


@contextmanager
def _attached(carried: Context) -> Iterator[None]:
    token = otel_context.attach(carried)
    try:
        yield
    finally:
        otel_context.detach(token)


def job_attributes(
    job_id: str | None = None,
    kind: str | None = None,
    *,
    queue: str | None = None,
    attempt: int | None = None,
    owner_id: str | None = None,
) -> dict[str, Any]:
    """The attributes naming a job on a span (the ones given)."""
    attributes = {
        "tenure.job.id": job_id,
        "tenure.job.kind": kind,
        "tenure.job.queue": queue,
        "tenure.job.attempt": attempt,
        "tenure.job.owner_id": owner_id,
    }
    return {k: v for k, v in attributes.items() if v is not None}


def span(
    name: str,
    job_id: str | None = None,
    kind: str | None = None,
    *,
    queue: str | None = None,
    attempt: int | None = None,
    owner_id: str | None = None,
    span_kind: SpanKind = SpanKind.INTERNAL,
) -> AbstractContextManager[Span | None]:
    """A current span around a block, named *name* and naming the job (yields None when tracing is off).

    An exception leaving the block marks the span failed with the exception's type only: its message
    may quote a payload.
    """
    t = _tracer
    if t is None:
        return _OFF
    attributes = job_attributes(job_id, kind, queue=queue, attempt=attempt, owner_id=owner_id)
    return _span(t, name, span_kind, attributes)


@contextmanager
def _span(t: Tracer, name: str, span_kind: SpanKind, attributes: dict[str, Any]) -> Iterator[Span]:
    with t.start_as_current_span(
        name, kind=span_kind, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as s:
        try:
            yield s
        except BaseException as e:
            failed(s, type(e).__name__)
            raise


def start(name: str, job_id: str, kind: str, attempt: int) -> Span | None:
    """A child of the current span that another thread (or a later callback) ends: not made current (None
    when tracing is off)."""
    t = _tracer
    return None if t is None else t.start_span(name, attributes=job_attributes(job_id, kind, attempt=attempt))


def failed(s: Span | None, reason: str | None) -> None:
    """Mark *s* failed, with a short *reason* (an outcome or an exception type, never an error's text; None:
    not failed)."""
    if s is not None and reason is not None:
        s.set_status(Status(StatusCode.ERROR, reason))


def _current() -> dict[str, str]:
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier


def carrier(stored: str | None = None) -> dict[str, str] | None:
    """The W3C headers for a message's :data:`TRACE_OPTION`: the current span's context, else the job's
    *stored* one (:func:`stored_context`); None when tracing is off or there is neither."""
    if _tracer is None:
        return None
    current = _current()
    if current:
        return current
    if stored:
        parsed = json.loads(stored)
        return parsed if isinstance(parsed, dict) else None
    return None


def stored_context() -> str | None:
    """The current span's context as JSON, for a new job's row (``jobs.trace_context``; None: no span)."""
    if _tracer is None:
        return None
    current = _current()
    return json.dumps(current, separators=(",", ":")) if current else None


def context_of(options: Mapping[str, Any]) -> Context | None:
    """The trace context a message's options carry (None: none, or not a W3C context)."""
    carrier = options.get(TRACE_OPTION)
    if not isinstance(carrier, Mapping):
        return None
    context = _propagator.extract(carrier={str(k): str(v) for k, v in carrier.items()})
    return context if trace.get_current_span(context).get_span_context().is_valid else None
