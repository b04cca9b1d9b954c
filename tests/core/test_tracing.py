"""OpenTelemetry (issue 41): with OTEL_* set, `promesa web`, `promesa worker` and `promesa sweep` export their spans to
a real OTLP/HTTP endpoint, and the delivery joins the producer's trace: the attempt's span is a child of the
producer's traceparent, and the receiver gets that span's context. Unset, or without the extra, nothing is done."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from dashboard.core import tracing

from tests.support.otlp_collector import OtlpCollector
from tests.support.receiver import Receiver
from tests.support.waiting import wait_until
from tests.support.web_server import installation_env, promesa_web

TRACE_ID, PRODUCER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PRODUCER_SPAN}-01"
SERVER, CLIENT, PRODUCER = 2, 3, 4  # opentelemetry.proto.trace.v1.Span.SpanKind
CLEAN = {name: value for name, value in os.environ.items() if not name.startswith("OTEL_")}


def publish(web: str, token: str, headers: dict) -> dict:
    request = urllib.request.Request(f"{web}/api/v1/events", method="POST", data=json.dumps(
        {"type": "file.updated", "data": {"resource_id": "f_secretive"}}).encode(), headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json", **headers})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 202
        return json.loads(resp.read())


def promesa(app, collector, *args) -> None:
    done = subprocess.run([sys.executable, "-m", "dashboard.cli", *args], capture_output=True, text=True, timeout=120,
                          env=installation_env(app, CLEAN, PROMESA_ALLOW_PRIVATE_TARGETS="1",  # the receiver's 127.0.0.1
                                               **collector.environment()))
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_the_spans_arrive_and_the_delivery_joins_the_producers_trace(app, producer, tmp_path):
    with OtlpCollector() as collector, Receiver() as receiver:
        sub = producer.subscribe(receiver.url + "/ok")
        with promesa_web(app, tmp_path / "web.log", **collector.environment()) as (web, _):
            accepted = publish(web, producer.token, {"traceparent": TRACEPARENT})
            untraced = publish(web, producer.token, {})
            assert wait_until(lambda: len(collector.named("POST /api/v1/events")) == 2 and sum(
                span.attributes["promesa.deliveries"] for span in collector.named("promesa.handoff")) == 2, timeout=30)
        promesa(app, collector, "worker", "--burst")
        promesa(app, collector, "sweep", "--once")

    ingest = {span.attributes["promesa.event_id"]: span for span in collector.named("POST /api/v1/events")}
    traced = ingest[accepted["id"]]
    assert (traced.kind, traced.trace_id, traced.parent_span_id) == (SERVER, TRACE_ID, PRODUCER_SPAN)
    assert ingest[untraced["id"]].trace_id != TRACE_ID and ingest[untraced["id"]].parent_span_id == ""
    assert traced.resource["service.name"] == "promesa-under-test" and traced.resource["promesa.process"] == "web"
    assert collector.named("promesa.handoff")[0].kind == PRODUCER

    [drain] = [span for span in collector.named("promesa.drain") if span.attributes["promesa.attempted"]]
    assert drain.attributes["promesa.succeeded"] == 2 and drain.resource["promesa.process"] == "worker"
    attempts = {span.attributes["promesa.delivery_id"]: span for span in collector.named("POST")}
    assert len(attempts) == 2 and all(span.kind == CLIENT for span in attempts.values())
    sent = {got.headers["X-Delivery-Id"]: (got.headers["X-Event-Id"], got.headers.get("traceparent"))
            for got in receiver.requests}
    for delivery_id, (event_id, traceparent) in sent.items():
        span = attempts[delivery_id]
        assert span.attributes["http.response.status_code"] == 200
        assert (span.attributes["promesa.subscription_id"], span.attributes["promesa.attempt"]) == (sub["id"], 1)
        assert "promesa.consumer" not in span.attributes  # the team's own endpoint: no consumer
        # The receiver's trace continues from the attempt: its traceparent is the attempt span's context.
        version_trace_span, flags = traceparent.rsplit("-", 1)
        assert version_trace_span == f"00-{span.trace_id}-{span.span_id}" and int(flags, 16) & 1  # sampled
        if event_id == accepted["id"]:  # a child of the producer's span, in the producer's trace
            assert (span.trace_id, span.parent_span_id) == (TRACE_ID, PRODUCER_SPAN)
        else:  # no trace of its own: a child of the drain that sent it
            assert (span.trace_id, span.parent_span_id) == (drain.trace_id, drain.span_id)

    [sweep] = collector.named("promesa.sweep")
    assert sweep.attributes["promesa.enqueued"] == 0 and sweep.resource["promesa.process"] == "sweeper"
    exported = b"".join(collector.bodies)  # never a secret, a body or a header's value
    assert sub["secret"].encode() not in exported and b"f_secretive" not in exported
    assert producer.token.encode() not in exported


PROBE = """
import logging, sys
logging.basicConfig(level=logging.WARNING)
from dashboard.core import tracing
on = tracing.configure("worker")
with tracing.span("promesa.drain") as span:
    tracing.annotate(span, attempted=1)
    started, sent = tracing.attempt("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
print(on, started, sent, sorted({m for m in sys.modules if m.startswith(("opentelemetry.sdk.trace",
                                                                          "opentelemetry.exporter"))}))
"""


def probe(env: dict, first: str = "") -> tuple[str, str]:
    done = subprocess.run([sys.executable, "-c", first + PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), done.stderr


def test_unset_it_is_off_and_the_stored_traceparent_goes_as_it_came():
    printed, _ = probe(CLEAN)
    assert printed == f"False None {TRACEPARENT} []"
    printed, _ = probe(dict(CLEAN, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_SDK_DISABLED="true"))
    assert printed == f"False None {TRACEPARENT} []"
    printed, _ = probe(dict(CLEAN, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_TRACES_EXPORTER="none"))
    assert printed == f"False None {TRACEPARENT} []"


def test_without_the_extra_it_is_off_with_a_warning_and_no_error():
    not_installed = "import sys\nsys.modules['opentelemetry'] = None\n"  # as if the otel extra were not installed
    printed, logged = probe(dict(CLEAN, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9"), not_installed)
    assert printed == f"False None {TRACEPARENT} []"
    assert "the otel extra is not installed (pip install 'promesa[otel]')" in logged


@pytest.mark.parametrize("variables, exporter", [
    ({}, None), ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "otlp"),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, "otlp"),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, "otlp"), ({"OTEL_TRACES_EXPORTER": "console"}, "console"),
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, None), ({"OTEL_TRACES_EXPORTER": "none"}, None),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}, None),
])
def test_the_standard_variables_choose_the_exporter(variables, exporter):
    assert tracing.wanted(variables) == exporter
