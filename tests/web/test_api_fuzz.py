"""The producer API under schemathesis, driven from its own OpenAPI document.

Every operation, in every phase (the document's examples, boundary coverage, random fuzzing and
the stateful phase that chains a created subscription or event into the operations on it), with a
fixed seed. It must hold that:
- nothing answers 5xx;
- every status answered is documented for that operation;
- a request the document calls valid is accepted: 2xx, or a refusal the document cannot foresee
  (401 no token, 404 unknown id, 409 conflict, 413 size, 422 semantically refused, 429 a receiver
  check asked for again within the minute, or past a quota: the fuzzer sends test events faster than one
  per test_event_seconds), never 400.

The app is the real one through its WSGI interface, on SQLite and PostgreSQL. No worker runs, so
no subscription's URL is ever contacted.
"""

from __future__ import annotations

import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, events

SEED = 14
CHECKS = ("not_a_server_error", "status_code_conformance", "positive_data_acceptance")
ACCEPTED = ["2XX", "401", "404", "409", "413", "422", "429"]
CONSUMER_ROUTES = {"PUT /consumers/{uid}", "GET /consumers/{uid}", "DELETE /consumers/{uid}", "GET /consumers",
                   "POST /consumers/{uid}/portal-links", "DELETE /consumers/{uid}/portal-sessions",
                   "GET /portal-settings", "PUT /portal-settings"}


def fuzz_config(token: str) -> SchemathesisConfig:
    return SchemathesisConfig.from_dict({
        "seed": SEED,
        "headers": {"Authorization": f"Bearer {token}"},
        "generation": {"mode": "all", "max-examples": 12, "deterministic": True, "database": "none"},
        "phases": {"examples": {"enabled": True}, "coverage": {"enabled": True}, "fuzzing": {"enabled": True},
                   "stateful": {"enabled": True, "max-steps": 12}},
        "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS},
                   "positive_data_acceptance": {"enabled": True, "expected-statuses": ACCEPTED}},
    })


def test_the_api_holds_under_a_fuzzer(app, producer):
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", app, config=fuzz_config(producer.token))
    tested, problems = set(), []
    for event in schemathesis.engine.from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            tested.add(event.label)
            if event.status in (Status.FAILURE, Status.ERROR):
                problems.append(_describe(event))
        elif isinstance(event, (events.NonFatalError, events.FatalError)):
            problems.append(f"{type(event).__name__}: {getattr(event, 'info', event)}")
    assert not problems, "\n\n".join(problems)
    # The document itself is not fuzzed (schemathesis leaves it out); loading it above fetched it.
    documented = {f"{method.upper()} {path}" for path, operations in schema.raw_schema["paths"].items()
                  for method in operations} - {"GET /openapi.json"}
    assert len(documented) >= 13 and documented <= tested, documented - tested
    assert CONSUMER_ROUTES <= documented  # every method of the consumers and portal API, so every one is fuzzed


def _describe(event: events.ScenarioFinished) -> str:
    """The failed checks of a scenario, each with the request that broke it and what came back."""
    lines = [f"[{event.phase.value}] {event.label}: {event.status.value}"]
    recorder = event.recorder
    for case_id, checks in recorder.checks.items():
        for check in checks:
            if check.status != Status.FAILURE or check.failure_info is None:
                continue
            case = recorder.cases[case_id].value
            interaction = recorder.interactions.get(case_id)
            response = interaction.response if interaction else None
            answer = f"{response.status_code} {response.content[:300]!r}" if response is not None else "no response"
            lines.append(f"  {check.name}: {case.method} {case.formatted_path} query={case.query} "
                         f"body={str(case.body)[:300]} -> {answer}\n    {check.failure_info.failure.title}: "
                         f"{check.failure_info.failure.message[:300]}")
    return "\n".join(lines)
