"""The receiver check's credentials_required rule, judged from answers (pure): only for an endpoint with headers
of its own, on the signed request sent without them."""

from __future__ import annotations

import pytest
from promesa_receiver.check import (
    ALL_RULES,
    CREDENTIALS_RULE,
    CREDENTIALS_STEP,
    NOT_JUDGED_DEPENDENT,
    RULES,
    STEPS,
    Answer,
    build,
    judge,
    plan,
)
from promesa_receiver.signing import new_secret

URL = "https://example.com/hook"


def answers(signed: int, uncredentialed: int | None) -> dict[str, Answer]:
    got = {step: Answer(400, 0.01) for step in STEPS} | {"signed": Answer(signed, 0.01), "duplicate": Answer(200, 0.01)}
    return got | ({CREDENTIALS_STEP: Answer(uncredentialed, 0.01)} if uncredentialed is not None else {})


@pytest.mark.parametrize("status, passed, advice", [
    (401, True, ""), (403, True, ""), (400, True, ""),
    (200, False, "accepted a request without the headers set on this subscription"),
    (302, False, "see no_redirect"),
    (500, False, "answer 401 or 403 to a request without the subscription's headers"),
])
def test_it_passes_on_a_refusal_and_says_what_to_change_otherwise(status, passed, advice):
    results = judge(URL, "promesa", answers(200, status), credentials=True)
    assert [r["rule"] for r in results] == list(ALL_RULES)
    rule = next(r for r in results if r["rule"] == CREDENTIALS_RULE)
    assert (rule["passed"], rule["status"]) == (passed, status) and advice in rule["advice"]


def test_it_is_not_judged_when_the_signed_event_was_refused_and_left_out_without_headers():
    [rule] = [r for r in judge(URL, "promesa", answers(401, 401), credentials=True) if r["rule"] == CREDENTIALS_RULE]
    assert rule["passed"] is None and rule["detail"] == NOT_JUDGED_DEPENDENT
    assert [r["rule"] for r in judge(URL, "promesa", answers(200, None))] == list(RULES)


def test_every_request_carries_the_headers_but_the_one_sent_without_them():
    secret = new_secret()
    requests = plan("chk_1", secret, now=1_700_000_000, headers={"X-Api-Key": "k"})
    assert [r.step for r in requests] == [*STEPS, CREDENTIALS_STEP]
    assert [r.headers.get("X-Api-Key") for r in requests] == ["k"] * len(STEPS) + [None]
    signed, bare = requests[0], requests[-1]
    assert bare.headers["X-Signature"] and bare.headers["X-Promesa-Check"] == "chk_1" and bare.event_id != signed.event_id
    assert [r.step for r in plan("chk_1", secret, now=1_700_000_000)] == list(STEPS)
    assert "X-Api-Key" not in build("signed", "chk_1", secret, now=1_700_000_000).headers
