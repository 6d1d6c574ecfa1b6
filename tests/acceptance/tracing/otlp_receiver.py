"""A tiny OTLP/HTTP trace receiver for the tests: ``POST /v1/traces`` with an ``ExportTraceServiceRequest``
(protobuf, as the SDK's OTLP/HTTP exporter sends it), kept as plain :class:`ReceivedSpan` records; and
``GET /fetched`` for a job's outgoing request, whose ``traceparent`` header it keeps."""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

#: OTLP's span kinds (``Span.SpanKind``), by number.
KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    error: bool


def _value(v: AnyValue) -> Any:
    field = v.WhichOneof("value")
    if field == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, field) if field else None


def _attributes(kvs: list[KeyValue]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class Receiver:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.requests = 0
        #: The ``traceparent`` header of each ``GET /fetched`` (None: the request had none).
        self.fetched: list[str | None] = []

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        spans = []
        for rs in request.resource_spans:
            service = str(_attributes(rs.resource.attributes).get("service.name"))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(
                        ReceivedSpan(
                            service=service,
                            name=s.name,
                            kind=KINDS[s.kind],
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            attributes=_attributes(s.attributes),
                            error=s.status.code == 2,
                        )
                    )
        with self._lock:
            self._spans.extend(spans)
            self.requests += 1

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path != "/fetched":
                self.send_error(404)
                return
            receiver.fetched.append(self.headers.get("traceparent"))
            self.send_response(204)
            self.end_headers()

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            encoding = self.headers.get("Content-Encoding")
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            receiver.add(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
            pass

    return Handler


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Receiver]]:
    """A receiver on 127.0.0.1 (a free port): its base URL (``OTEL_EXPORTER_OTLP_ENDPOINT``) and its spans."""
    receiver = Receiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
