"""Installing OpenTelemetry tracing in a Tenure process: the SDK tracer provider, its exporter, the instrumentations.

Off unless ``TENURE_TRACING`` is on (:attr:`settings.environment.Settings.tracing`): until then no provider
is installed, the job layer makes no spans (:mod:`jobs.tracing`) and nothing is exported or sent.
When on, :func:`configure_tracing` (called by every composition root: ``tasks.compose`` and the web app
factory, before they make an engine) installs an SDK provider once per process, configured by the
standard ``OTEL_*`` variables:

- ``OTEL_TRACES_EXPORTER``: ``otlp`` (the default, OTLP over HTTP/protobuf: the
  ``opentelemetry-exporter-otlp-proto-http`` package, which reads ``OTEL_EXPORTER_OTLP_ENDPOINT``,
  ``…_TRACES_ENDPOINT``, ``…_HEADERS``, ``…_TIMEOUT`` and ``…_COMPRESSION`` itself), ``console``, or ``none``
  (spans are made and propagated but exported nowhere), comma-separated for several;
- ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` (default service name ``tenure``),
  ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``: read by the SDK.

Instrumented besides the job layer's own spans: SQLAlchemy statements (only inside a trace: the
keeper's heartbeats and the resync would otherwise each start a trace of their own) and httpx
requests (the notification actor's webhooks). The web app adds Flask's (:mod:`webapp.tracing`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from jobs import tracing as jobs_tracing
from settings.environment import Settings, SettingsError

logger = logging.getLogger(__name__)

#: The service name of Tenure's spans unless ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` names one.
DEFAULT_SERVICE_NAME = "tenure"
#: The exporters ``OTEL_TRACES_EXPORTER`` may name.
EXPORTERS = ("otlp", "console", "none")
#: The one OTLP protocol shipped (the gRPC exporter is not a dependency).
OTLP_PROTOCOL = "http/protobuf"

_installed: TracerProvider | None = None


def configure_tracing(settings: Settings, env: Mapping[str, str] | None = None) -> bool:
    """Install tracing in this process if ``settings.tracing`` (once; later calls change nothing).

    Parameters:
      settings: The process's settings (``tracing``: on or off).
      env: The ``OTEL_*`` variables (default: ``os.environ``, read now).

    Raises:
      SettingsError: ``OTEL_TRACES_EXPORTER`` names an unknown exporter, the OTLP protocol is not
        HTTP/protobuf, or the OTLP exporter's package is not installed.

    Returns:
      Whether this process traces.
    """
    global _installed
    if not settings.tracing:
        return False
    if _installed is not None:
        return True
    env = os.environ if env is None else env
    exporters = [_exporter(name, env) for name in _exporter_names(env)]
    provider = TracerProvider(resource=service_resource())
    for exporter in exporters:
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    jobs_tracing.enable(provider)
    _instrument_libraries(provider)
    _installed = provider
    logger.info("Tracing on: exporting to %s.", ", ".join(_exporter_names(env)))
    return True


def service_resource() -> Resource:
    """The SDK's resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``); ``tenure`` unless they name one."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


def _exporter_names(env: Mapping[str, str]) -> list[str]:
    names = [n.strip().lower() for n in (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(",") if n.strip()]
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise SettingsError(f"OTEL_TRACES_EXPORTER={','.join(names)!r}: use one or more of {', '.join(EXPORTERS)}")
    return names or ["otlp"]


def _exporter(name: str, env: Mapping[str, str]) -> SpanExporter | None:
    if name == "none":
        return None
    if name == "console":
        return ConsoleSpanExporter()
    for var in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = (env.get(var) or "").strip()
        if protocol:
            if protocol != OTLP_PROTOCOL:
                raise SettingsError(f"{var}={protocol!r}: Tenure exports OTLP over {OTLP_PROTOCOL} only")
            break
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise SettingsError(
            "OTEL_TRACES_EXPORTER=otlp needs the opentelemetry-exporter-otlp-proto-http package "
            "(pip install 'tenure[otlp]')"
        ) from None
    return OTLPSpanExporter()


def _instrument_libraries(provider: TracerProvider) -> None:
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    # The instrumentation declares SQLAlchemy < 2.1; its event hooks work on 2.1 (the acceptance test checks).
    SQLAlchemyInstrumentor().instrument(tracer_provider=_InTraceOnly(provider), skip_dep_check=True)
    HTTPXClientInstrumentor().instrument(tracer_provider=provider)


class _InTraceOnly(trace.TracerProvider):
    """Tracers that make spans only inside a trace (a span with no parent would be a trace of its own)."""

    def __init__(self, provider: trace.TracerProvider) -> None:
        self._provider = provider

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _InTraceTracer(self._provider.get_tracer(*args, **kwargs))


class _InTraceTracer(trace.Tracer):
    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    def start_span(self, name: str, context: Any = None, *args: Any, **kwargs: Any) -> trace.Span:
        if not trace.get_current_span(context).get_span_context().is_valid:
            return trace.INVALID_SPAN
        return self._tracer.start_span(name, context, *args, **kwargs)

    @contextmanager
    def start_as_current_span(self, name: str, context: Any = None, *args: Any, **kwargs: Any) -> Iterator[trace.Span]:
        if not trace.get_current_span(context).get_span_context().is_valid:
            yield trace.INVALID_SPAN
            return
        with self._tracer.start_as_current_span(name, context, *args, **kwargs) as span:
            yield span
