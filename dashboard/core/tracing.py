"""Traces: the producer's W3C `traceparent` carried from ingest to every delivery attempt, and OpenTelemetry spans
(the `otel` extra), configured by the standard OTEL_* variables.

A valid traceparent on `POST /api/v1/events` is stored with the event and sent on each attempt; an invalid one is
ignored, never refused (W3C Trace Context). With OpenTelemetry off (no OTEL_* variable names an exporter, or the
extra is not installed) nothing of it is imported, every helper here does nothing, and the stored traceparent is
sent as it came.

On, each process calls `configure` once (gunicorn's workers after their fork, the CLI's worker and sweeper at their
start) and exports over OTLP/HTTP: a span for the ingest request, the hand-off to Redis, each drain, each delivery
attempt (an HTTP client span: a child of the producer's traceparent when one was stored, and what the receiver gets
as its traceparent) and each sweeper pass. Spans carry ids and counts, never secrets, headers or bodies.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re

log = logging.getLogger(__name__)

HEADER = "traceparent"
# version-trace id-parent id-flags, in lower-case hex (W3C Trace Context, level 1).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE, _ZERO_PARENT = "0" * 32, "0" * 16


def traceparent(value: str | None) -> str | None:
    """A traceparent header's value as stored and sent (version 00), or None for a missing or invalid one.
    A later version is read as version 00 is, as W3C asks: its first four fields, followed by "-" or nothing."""
    if not value:
        return None
    value = value.strip()
    found = _TRACEPARENT.match(value)
    if found is None:
        return None
    version, trace_id, parent_id, flags = found.groups()
    rest = value[found.end():]
    if version == "ff" or trace_id == _ZERO_TRACE or parent_id == _ZERO_PARENT:
        return None
    if version == "00":
        return value if not rest else None
    return f"00-{trace_id}-{parent_id}-{flags}" if rest[:1] in ("", "-") else None


# -- OpenTelemetry ----------------------------------------------------------------------------------------------
# Any of these set (and OTEL_SDK_DISABLED not true) turns spans on; OTEL_TRACES_EXPORTER=none keeps them off.
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
EXPORTERS = ("otlp", "console")

_tracer = None  # this process's tracer while spans are on
_provider = None
_otel = None  # the OpenTelemetry API pieces the helpers use, imported by `configure`
_OFF = contextlib.nullcontext()


def wanted(env=None) -> str | None:
    """The exporter the environment asks for (otlp, console), or None: spans off."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none" or not (exporter or any(env.get(name) for name in ENDPOINT_VARIABLES)):
        return None
    if exporter and exporter not in EXPORTERS:
        log.warning("OTEL_TRACES_EXPORTER=%s: Promesa exports with %s; no spans are made", exporter,
                    " or ".join(EXPORTERS))
        return None
    return exporter or "otlp"


def on() -> bool:
    return _tracer is not None


def configure(process: str, env=None) -> bool:
    """Turn spans on in this process if the environment asks for them (once; later calls keep the first setup).
    `process`: what it is (web, worker, sweeper), a resource attribute beside OTEL_SERVICE_NAME's name (default
    "promesa"). Returns whether spans are on. The extra missing is a warning, never an error."""
    global _tracer, _provider, _otel
    if _tracer is not None:
        return True
    exporter = wanted(env)
    if exporter is None:
        return False
    try:
        from opentelemetry import context, trace
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        if exporter == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        log.warning("OTEL_* asks for traces but the otel extra is not installed (pip install 'promesa[otel]'): "
                    "no spans are made (%s)", exc)
        return False
    resource = Resource.create({"promesa.process": process})
    if resource.attributes.get(SERVICE_NAME, "").startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "promesa"}))
    # The exporter and the batch processor read their own OTEL_* settings (endpoint, headers, delays).
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter() if exporter == "otlp" else ConsoleSpanExporter()))
    _otel = _Otel(context, trace, TraceContextTextMapPropagator())
    _provider, _tracer = provider, provider.get_tracer("promesa")
    log.info("OpenTelemetry: exporting spans (%s) as %s", exporter, process)
    return True


def shutdown() -> None:
    """Export what is still buffered and turn spans off (a process's end; a test's)."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


class _Otel:
    def __init__(self, context, trace, propagator):
        self.context, self.trace, self.propagator = context, trace, propagator
        self.kinds = {"internal": trace.SpanKind.INTERNAL, "server": trace.SpanKind.SERVER,
                      "client": trace.SpanKind.CLIENT, "producer": trace.SpanKind.PRODUCER}

    def parent(self, traceparent: str | None):
        """The context a span starts in: the traceparent's span as its remote parent, else the current one."""
        return self.propagator.extract({HEADER: traceparent}) if traceparent else None


def span(name: str, kind: str = "internal", parent: str | None = None, **attributes):
    """A context manager: a span around the block, current inside it (it yields the span; None when off).
    `parent`: a traceparent to start under instead of the current span."""
    if _tracer is None:
        return _OFF
    return _tracer.start_as_current_span(name, context=_otel.parent(parent), kind=_otel.kinds[kind],
                                         attributes=attributes)


def annotate(current, **attributes) -> None:
    """Attributes learnt inside a span's block (counts); `current`: what `span` yielded."""
    if current is not None:
        current.set_attributes({name: value for name, value in attributes.items() if value is not None})


def attempt(stored: str | None, **attributes) -> tuple[object | None, str | None]:
    """One delivery attempt's client span, started now (a child of `stored`, the producer's traceparent, or of the
    current span), and the traceparent to send with it: the span's own. Off: (None, `stored` as it came)."""
    if _tracer is None:
        return None, stored
    started = _tracer.start_span("POST", context=_otel.parent(stored), kind=_otel.kinds["client"],
                                 attributes={"http.request.method": "POST", **{
                                     name: value for name, value in attributes.items() if value is not None}})
    own = started.get_span_context()
    return started, f"00-{own.trace_id:032x}-{own.span_id:016x}-{int(own.trace_flags):02x}"


def end_attempt(started, status_code: int | None, error: str | None) -> None:
    """End an attempt's span with the receiver's status code, or the error that stood for one."""
    if status_code is not None:
        started.set_attribute("http.response.status_code", status_code)
    if error is not None or (status_code is not None and status_code >= 400):
        started.set_attribute("error.type", (error or str(status_code)).split(":", 1)[0])
        started.set_status(_otel.trace.Status(_otel.trace.StatusCode.ERROR, error))
    started.end()
