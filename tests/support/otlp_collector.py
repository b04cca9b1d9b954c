"""A real OTLP/HTTP trace endpoint on 127.0.0.1 for the tests: it takes POST /v1/traces (protobuf, plain or gzip),
decodes each ExportTraceServiceRequest with opentelemetry-proto and keeps the spans, with the raw bodies."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from http.server import ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.support.receiver import QuietHandler, Serving


@dataclass
class ExportedSpan:
    name: str
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind
    trace_id: str  # hex, as a traceparent writes it
    span_id: str
    parent_span_id: str  # "" for a root span
    attributes: dict
    resource: dict
    status_code: int


def _values(key_values) -> dict:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in key_values
            if kv.value.WhichOneof("value") is not None}


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class OtlpCollector(Serving):
    def __init__(self):
        self.spans: list[ExportedSpan] = []
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(QuietHandler):
            def do_POST(self):
                body = self.read_body()
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.answer(404, b"")
                    return
                request = ExportTraceServiceRequest.FromString(body)
                with collector.lock:
                    collector.bodies.append(body)
                    for resource_spans in request.resource_spans:
                        resource = _values(resource_spans.resource.attributes)
                        for scope_spans in resource_spans.scope_spans:
                            collector.spans += [ExportedSpan(
                                s.name, s.kind, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                                _values(s.attributes), resource, s.status.code) for s in scope_spans.spans]
                self.answer(200, ExportTraceServiceResponse().SerializeToString())

            def answer(self, status: int, payload: bytes):
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def named(self, name: str) -> list[ExportedSpan]:
        with self.lock:
            return [span for span in self.spans if span.name == name]

    def environment(self) -> dict[str, str]:
        """The OTEL_* variables that make a Promesa process export here, at once rather than every 5 s."""
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": self.url, "OTEL_BSP_SCHEDULE_DELAY": "100",
                "OTEL_SERVICE_NAME": "promesa-under-test"}
