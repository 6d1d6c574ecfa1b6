"""Tracing's switch and its configuration: off by default (no provider, no span, no message option), and a
misconfigured exporter refused at start with the variable's name. (Traces across real processes:
``tests/acceptance/tracing``.)"""

from __future__ import annotations

import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from jobs import tracing
from jobs.publish import job_message
from monitoring.tracing import _InTraceOnly, configure_tracing, service_resource
from settings.environment import Settings, SettingsError


def _no_provider() -> bool:
    return isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def test_tracing_is_off_by_default_no_provider_no_span_no_message_option() -> None:
    settings = Settings.from_env({})
    assert settings.tracing is False
    assert configure_tracing(settings, env={"OTEL_TRACES_EXPORTER": "otlp"}) is False
    assert _no_provider() and tracing.tracer() is None
    # Even with a span current (from a provider of its own), a message carries no trace context.
    local = TracerProvider()
    with local.get_tracer("test").start_as_current_span("caller"), tracing.span("tenure.job.submit") as span:
        assert span is None
        options = job_message("job-1", "some_kind", "default", trace_context='{"traceparent": "00-x-y-01"}').options
        assert tracing.stored_context() is None  # a new job's row keeps no context either
    assert tracing.TRACE_OPTION not in options
    assert Settings.from_env({"TENURE_TRACING": "on"}).tracing is True


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER='zipkin': use one or more of otlp, console, none"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL='grpc': Tenure exports OTLP over"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json'"),
    ],
)
def test_a_misconfigured_exporter_is_refused_at_start(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as refused:
        configure_tracing(Settings(tracing=True), env=env)
    assert str(refused.value).startswith(message)
    assert _no_provider()  # nothing was installed


def test_without_the_otlp_package_otlp_is_refused_with_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(SettingsError, match=r"needs the opentelemetry-exporter-otlp-proto-http package"):
        configure_tracing(Settings(tracing=True), env={})
    assert _no_provider()


def test_the_service_is_named_tenure_unless_the_environment_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert service_resource().attributes["service.name"] == "tenure"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=billing,deployment.environment=prod")
    assert service_resource().attributes["service.name"] == "billing"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "tenure-worker")
    assert service_resource().attributes["service.name"] == "tenure-worker"


def test_library_spans_are_made_only_inside_a_trace() -> None:
    provider = TracerProvider()
    exported = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    sql = _InTraceOnly(provider).get_tracer("sql")
    sql.start_span("SELECT alone").end()  # e.g. a keeper's heartbeat: no trace to join
    with sql.start_as_current_span("BEGIN alone") as alone:
        assert not alone.is_recording()
    with provider.get_tracer("jobs").start_as_current_span("tenure.job.claim") as claim:
        sql.start_span("UPDATE jobs").end()
        with sql.start_as_current_span("COMMIT"):
            pass
    spans = {s.name: s for s in exported.get_finished_spans()}
    assert set(spans) == {"tenure.job.claim", "UPDATE jobs", "COMMIT"}
    claim_id = claim.get_span_context().span_id
    assert spans["UPDATE jobs"].parent.span_id == claim_id and spans["COMMIT"].parent.span_id == claim_id
