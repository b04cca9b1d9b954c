"""The receiver check: the one definition of the rules a receiving endpoint must keep.

Promesa's service (the check job) and the SDK's command (``promesa-receiver check``) both use
this module, so the two can never disagree. Standard library only.

Three layers, each usable alone:

- ``build(step, ...)`` / ``plan(...)``: the requests, as bytes and headers (pure: no I/O). Every
  request is a real signed delivery of the reserved event type ``promesa.check`` whose
  ``data.resource_id`` is the check id, and carries ``X-Promesa-Check: <check id>``.
- ``judge(url, scheme, answers, ...)``: the observed answers (``Answer``: status, elapsed seconds,
  Location, an excerpt of the body) turned into results ``{"rule", "passed": True | False | None,
  "detail", "advice", "status", "excerpt"}``, one per name in ``RULES``, in that order (pure);
  ``status`` and ``excerpt`` are the answer the rule was judged on (None for a rule judged on none).
- ``run_check(url, secrets, scheme, *, send=None, ...)``: builds each request just before sending
  it, sends it with ``send`` (default: ``urllib_send``, which never follows a redirect), judges.
  The service passes its own ``send`` (private targets refused, rate limits honoured).

An endpoint with headers of its own (``headers={"X-Api-Key": ...}``: what its gateway demands) gets them
on every request, and one more: the correctly signed event without them (``CREDENTIALS_STEP``), which
rule ``credentials_required`` expects refused. An ``Authorization: Bearer`` header among them (the OAuth2
token Promesa gets for a subscription with client credentials) is left out of that request too, and the rule's
words speak of the token. Without such headers that step is not sent and that rule
is left out of the results (``RULES`` are the rules of every check; ``ALL_RULES`` adds it).
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import secrets as _secrets
import socket
import time
import unicodedata
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urljoin, urlsplit

from .signing import PROMESA_HEADER, new_secret, sign_headers, standard_key

__all__ = [
    "CHECK_HEADER",
    "EVENT_TYPE",
    "FAST_SECONDS",
    "NOT_JUDGED_DEPENDENT",
    "ALL_RULES",
    "CREDENTIALS_RULE",
    "CREDENTIALS_STEP",
    "RULES",
    "STALE_SECONDS",
    "STEPS",
    "TIMEOUT_SECONDS",
    "Answer",
    "CheckRequest",
    "Send",
    "build",
    "carries_bearer",
    "failed",
    "judge",
    "new_check_id",
    "normalise_scheme",
    "plan",
    "report",
    "run_check",
    "steps",
    "urllib_send",
]

RULES = ("signed_accepted", "fast_answer", "duplicate_accepted", "forged_rejected", "stale_rejected",
         "tampered_rejected", "no_redirect", "https")
# Judged only for an endpoint with headers of its own, after tampered_rejected.
CREDENTIALS_RULE = "credentials_required"
ALL_RULES = RULES[:6] + (CREDENTIALS_RULE,) + RULES[6:]
# The requests, in the order they are sent: the duplicate repeats the signed event's id and body.
STEPS = ("signed", "duplicate", "forged", "stale", "tampered")
# Then, only for an endpoint with headers of its own: the signed event again, without them.
CREDENTIALS_STEP = "uncredentialed"
EVENT_TYPE = "promesa.check"
CHECK_HEADER = "X-Promesa-Check"
USER_AGENT = "Promesa-Webhooks/1"
FAST_SECONDS = 5.0
STALE_SECONDS = 600  # twice the receivers' 300 s window: stale whatever tolerance rounding they use
TIMEOUT_SECONDS = 10.0  # the contract's whole-attempt limit
REJECTING = (400, 401, 403)
SCHEMES = {"promesa": "promesa", "standard": "standard-webhooks", "standard-webhooks": "standard-webhooks"}
NOT_JUDGED_DEPENDENT = "could not be judged: the correctly signed event was not accepted (see signed_accepted)"
_EXCERPT_BYTES = 64 * 1024
_SHOWN_CHARS = 200


@dataclass(frozen=True)
class CheckRequest:
    step: str  # one of STEPS
    event_id: str
    body: bytes
    headers: dict[str, str]


@dataclass(frozen=True)
class Answer:
    """What one request got. ``status`` is None when no HTTP answer came (``error`` says why)."""

    status: int | None
    elapsed: float  # seconds, the whole answer
    location: str | None = None
    error: str | None = None
    timed_out: bool = False
    excerpt: str | None = None  # the start of the answer's body, as received



# send(url, body, headers, timeout) -> Answer; it must never follow a redirect, nor raise for a failed request.
Send = Callable[[str, bytes, dict, float], Answer]


def normalise_scheme(scheme: str) -> str:
    """``promesa`` or ``standard-webhooks`` (``standard`` is accepted for the latter)."""
    try:
        return SCHEMES[scheme]
    except (KeyError, TypeError):
        raise ValueError(f"unknown signature scheme {scheme!r}: use promesa or standard") from None


def new_check_id() -> str:
    return "chk_" + _secrets.token_hex(10)


def _event_id(check_id: str, step: str) -> str:
    # The duplicate is the signed event again; every other step is an event of its own.
    return f"evt_{check_id}_{'signed' if step == 'duplicate' else step}"


def _body(event_id: str, check_id: str, occurred_at: int) -> bytes:
    when = datetime.fromtimestamp(occurred_at, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    event = {"id": event_id, "type": EVENT_TYPE, "version": 1, "timestamp": when,
             "data": {"resource_id": check_id, "resource_version": 1}}
    return json.dumps(event, separators=(",", ":")).encode("utf-8")


def _tamper(body: bytes) -> bytes:
    # One byte changed, and the body still parses: a receiver must not reject it only for bad JSON.
    tampered = body.replace(b'"resource_version":1', b'"resource_version":2', 1)
    assert len(tampered) == len(body) and tampered != body
    return tampered


def build(step: str, check_id: str, secrets: Sequence[str] | str, scheme: str = "promesa", *,
          now: float, occurred_at: float | None = None, headers: Mapping[str, str] | None = None) -> CheckRequest:
    """One request of the check, signed at ``now`` (unix seconds) with every current secret
    (several while a secret rotates, as deliveries are). ``occurred_at``: the body's ``timestamp``
    (default ``now``); give every step the same one, or the duplicate's body is not the same.
    ``headers``: the endpoint's own, sent with every step but ``uncredentialed``."""
    if step not in steps(True):
        raise ValueError(f"unknown step {step!r}: one of {', '.join(steps(True))}")
    scheme = normalise_scheme(scheme)
    secrets = [secrets] if isinstance(secrets, str) else list(secrets)
    if not secrets or not all(isinstance(s, str) and s for s in secrets):
        raise ValueError("pass the endpoint's current signing secret(s)")
    if scheme == "standard-webhooks":
        for n, secret in enumerate(secrets, start=1):
            try:
                standard_key(secret)
            except ValueError:  # binascii.Error included
                raise ValueError(f"secret #{n} is not a whsec_<base64> secret, which the standard scheme needs") from None
    signed_at = int(now) - STALE_SECONDS if step == "stale" else int(now)
    event_id = _event_id(check_id, step)
    occurred = int(now if occurred_at is None else occurred_at)
    body = _body(event_id, check_id, min(occurred, signed_at))  # a replayed capture is as old as its signature
    signing_secrets = [new_secret()] if step == "forged" else secrets
    own = dict(headers or {}) if step != CREDENTIALS_STEP else {}
    headers = own | {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Event-Id": event_id,
        "X-Event-Type": EVENT_TYPE,
        CHECK_HEADER: check_id,
        "Accept-Encoding": "identity",
    }
    headers.update(sign_headers(scheme, signing_secrets, event_id, signed_at, body))
    if step == "tampered":
        body = _tamper(body)
    return CheckRequest(step, event_id, body, headers)


def plan(check_id: str, secrets: Sequence[str] | str, scheme: str = "promesa", *, now: float,
         headers: Mapping[str, str] | None = None) -> list[CheckRequest]:
    """Every request of the check, in ``STEPS`` order, all signed at ``now`` (``uncredentialed`` only with
    ``headers``)."""
    return [build(step, check_id, secrets, scheme, now=now, occurred_at=now, headers=headers)
            for step in steps(bool(headers))]


def steps(credentials: bool) -> tuple[str, ...]:
    """The steps a check sends: ``uncredentialed`` only for an endpoint with headers of its own."""
    return STEPS + (CREDENTIALS_STEP,) if credentials else STEPS


# -- judging -------------------------------------------------------------------------------------
def _shown(text: str | None) -> str:
    """Receiver-supplied text made safe to print: control characters escaped, length capped."""
    text = "" if text is None else str(text)
    safe = "".join(c if unicodedata.category(c)[0] != "C" else f"\\x{ord(c):02x}" for c in text)
    return safe if len(safe) <= _SHOWN_CHARS else safe[:_SHOWN_CHARS] + "…"


def _result(rule: str, passed: bool | None, detail: str, advice: str = "") -> dict:
    return {"rule": rule, "passed": passed, "detail": detail, "advice": "" if passed else advice}


def _seen(answer: Answer | None) -> str:
    if answer is None:
        return "not sent"
    if answer.status is None:
        return f"no answer after {answer.elapsed:.2f} s ({_shown(answer.error) or 'no reason given'})"
    return f"answered {answer.status} in {answer.elapsed:.2f} s"


@dataclass(frozen=True)
class _Words:
    """The scheme-specific words of the advice."""

    header: str
    python: str
    typescript: str
    timestamp: str
    contract: str


def _words(scheme: str, contract_url: str | None) -> _Words:
    contract = f" The contract: {contract_url}" if contract_url else ""
    if scheme == "standard-webhooks":
        return _Words("webhook-signature (with webhook-id and webhook-timestamp)",
                      "promesa_receiver.verify_standard(raw_body, request.headers, secrets)",
                      "verifyStandardWebhook(rawBody, headers, secret)", "webhook-timestamp", contract)
    return _Words(PROMESA_HEADER, f'promesa_receiver.verify(raw_body, request.headers["{PROMESA_HEADER}"], secrets)',
                  "verifyPromesaSignature(rawBody, header, secret)", f"t= in {PROMESA_HEADER}", contract)


def _verify_with(w: _Words) -> str:
    return (f" In Python use {w.python}; in TypeScript {w.typescript} (the snippet on the subscription's "
            f"contract page).{w.contract}")


def _signed(answer: Answer | None, w: _Words) -> dict:
    rule = "signed_accepted"
    if answer is None:
        return _result(rule, None, "not sent")
    detail = f"a correctly signed event: {_seen(answer)}"
    status = answer.status
    if status is not None and 200 <= status < 300:
        return _result(rule, True, detail)
    if status is None:
        advice = ("no answer came: check that the URL is right, that the server is running and reachable "
                  f"(Promesa sends from the internet), and that it answers within {TIMEOUT_SECONDS:.0f} s.")
    elif 300 <= status < 400:
        advice = "your endpoint redirected a delivery, and Promesa never follows redirects: see no_redirect."
    elif status in (401, 403, 400):
        advice = (f"your endpoint rejected a correctly signed event ({status}): most likely the signature check. "
                  f"Verify {w.header} with the subscription's current secret(s), over the raw body bytes exactly "
                  "as received (parsing and re-serialising JSON changes them)." + _verify_with(w))
    elif status == 404:
        advice = "your endpoint answered 404: the path is wrong; register the URL your route listens on."
    elif status == 410:
        advice = "your endpoint answered 410 Gone: Promesa disables a subscription whose receiver says Gone."
    elif status == 413:
        advice = "your endpoint refused the body as too large (413): accept bodies of at least 256 KiB."
    elif status == 429:
        advice = "your endpoint is rate limiting Promesa (429): raise its limit, or set a rate limit on the subscription."
    elif status >= 500:
        advice = (f"your endpoint failed ({status}) on a correctly signed event: look at its logs. Store the "
                  "event, answer 2xx, and do the work later in a job.")
    else:
        advice = f"your endpoint answered {status} to a correctly signed event: answer 2xx (200 or 204)."
    return _result(rule, False, detail, advice)


def _fast(answer: Answer | None) -> dict:
    rule = "fast_answer"
    advice = (f"answer 2xx fast and do the work later: store the event, enqueue a job, answer. Promesa waits "
              f"{TIMEOUT_SECONDS:.0f} s at most and counts a slow answer as a failure.")
    if answer is None or (answer.status is None and not answer.timed_out):
        return _result(rule, None, f"could not be judged: {_seen(answer)}")
    if answer.status is None:
        return _result(rule, False, f"no answer within {answer.elapsed:.2f} s", advice)
    detail = f"answered in {answer.elapsed:.2f} s (at most {FAST_SECONDS:.0f} s)"
    if answer.elapsed <= FAST_SECONDS:
        return _result(rule, True, detail)
    return _result(rule, False, detail, advice)


def _duplicate(answer: Answer | None, signed_ok: bool) -> dict:
    rule = "duplicate_accepted"
    if not signed_ok:  # a duplicate of an event that was refused tells nothing about deduplication
        return _result(rule, None, NOT_JUDGED_DEPENDENT)
    detail = f"the same event again (same id, same body, newly signed): {_seen(answer)}"
    if answer is None or answer.status is None:
        return _result(rule, None, f"could not be judged: {detail}")
    if 200 <= answer.status < 300:
        return _result(rule, True, detail)
    if 300 <= answer.status < 400:
        return _result(rule, False, detail, "your endpoint redirected the duplicate: see no_redirect.")
    return _result(rule, False, detail,
                   f"a duplicate is not an error: answer 2xx (200 or 204) to an event id you already have "
                   f"(you answered {answer.status}), or Promesa retries it and finally dead-letters it. "
                   "Dedupe by the event id in the body.")


_REJECTED_WHAT = {
    "forged_rejected": "a request signed with the wrong secret",
    "stale_rejected": f"a correctly signed request whose timestamp is {STALE_SECONDS // 60} minutes old",
    "tampered_rejected": "a correctly signed request whose body was changed by one byte after signing",
}


def _accepted_advice(rule: str, w: _Words) -> str:
    if rule == "forged_rejected":
        return (f"your endpoint accepted a request signed with the wrong secret: verify {w.header} over the raw "
                "body before parsing JSON, and answer 400, 401 or 403 when it does not match." + _verify_with(w))
    if rule == "stale_rejected":
        return (f"your endpoint accepted a request whose signed timestamp ({w.timestamp}) is "
                f"{STALE_SECONDS // 60} minutes old: a replayed capture looks exactly like this. Reject a "
                "timestamp more than 300 s from now, and answer 400." + _verify_with(w))
    return (f"your endpoint accepted a body changed after signing: compute {w.header} over the raw body bytes "
            "exactly as received, compare in constant time, and answer 400 when it does not match."
            + _verify_with(w))


def _rejected(rule: str, answer: Answer | None, signed_ok: bool, w: _Words) -> dict:
    if not signed_ok:
        return _result(rule, None, NOT_JUDGED_DEPENDENT)
    detail = f"{_REJECTED_WHAT[rule]}: {_seen(answer)}"
    if answer is None or answer.status is None:
        return _result(rule, None, f"could not be judged: {detail}")
    status = answer.status
    if status in REJECTING:
        return _result(rule, True, detail)
    if 200 <= status < 300:
        return _result(rule, False, detail, _accepted_advice(rule, w))
    if 300 <= status < 400:
        return _result(rule, False, detail, "your endpoint redirected instead of rejecting: see no_redirect.")
    if status >= 500:
        return _result(rule, False, detail,
                       f"your endpoint failed ({status}) instead of rejecting: verify {w.header} first, before "
                       "anything that can fail, and answer 400, 401 or 403 when it does not match; a 5xx says "
                       "\"try again later\", and hides the rejection in your error logs." + _verify_with(w))
    return _result(rule, False, detail,
                   f"answer 400, 401 or 403 when {w.header} does not verify; {status} says something else "
                   "(a wrong path, a missing resource, a limit), and misleads whoever reads the attempt log.")


@dataclass(frozen=True)
class _Lacking:
    """What the request sent for credentials_required goes without, in the words of its detail and advice."""

    what: str  # "the endpoint's own headers"
    accepted: str  # the advice when the endpoint accepted it anyway
    refuse_with: str  # "401 or 403"


_HEADERS_LACKING = _Lacking(
    "the endpoint's own headers",
    "your endpoint accepted a request without the headers set on this subscription: anyone who knows the URL gets "
    "that far. Make your gateway or handler require them (compare the value in constant time) and answer 401 or "
    "403 without them; or remove them from the subscription if you do not mean to check them.",
    "401 or 403 to a request without the subscription's headers")
_BEARER_LACKING = _Lacking(
    "the bearer token (nor any header of the endpoint's own)",
    "your endpoint accepted a request without the bearer token: anyone who knows the URL gets that far. Make your "
    "gateway or handler require a valid token from your authorization server (Authorization: Bearer) and answer "
    "401 without one; or remove the OAuth2 client credentials from the subscription if you do not mean to check "
    "them.",
    "401 to a request without the bearer token")


def _credentials(answer: Answer | None, signed_ok: bool, bearer: bool = False) -> dict:
    rule = CREDENTIALS_RULE
    if not signed_ok:  # a refusal tells nothing when the credentialed event was refused too
        return _result(rule, None, NOT_JUDGED_DEPENDENT)
    lacking = _BEARER_LACKING if bearer else _HEADERS_LACKING
    detail = f"a correctly signed event without {lacking.what}: {_seen(answer)}"
    if answer is None or answer.status is None:
        return _result(rule, None, f"could not be judged: {detail}")
    status = answer.status
    if status in REJECTING:
        return _result(rule, True, detail)
    if 200 <= status < 300:
        return _result(rule, False, detail, lacking.accepted)
    if 300 <= status < 400:
        return _result(rule, False, detail, "your endpoint redirected instead of refusing: see no_redirect.")
    return _result(rule, False, detail,
                   f"answer {lacking.refuse_with}; {status} says something else (a failure, a wrong path, a "
                   "limit), and hides the refusal.")


def _no_redirect(url: str, answers: Mapping[str, Answer]) -> dict:
    rule = "no_redirect"
    redirected = [(step, a) for step, a in answers.items() if a.status is not None and 300 <= a.status < 400]
    if redirected:
        step, answer = redirected[0]
        location = urljoin(url, answer.location) if answer.location else None
        detail = f"the {step} request was answered {answer.status}, Location: {_shown(location) or '(none)'}"
        if location:
            advice = (f"Promesa never follows redirects: register {_shown(location)} (the final URL) "
                      f"instead of {_shown(url)}.")
        else:
            advice = "Promesa never follows redirects: register the final URL, and answer 2xx there."
        return _result(rule, False, detail, advice)
    if not any(a.status is not None for a in answers.values()):
        return _result(rule, None, "could not be judged: no request was answered")
    return _result(rule, True, "no request was redirected")


def _is_loopback(host: str) -> bool:
    if host.lower().rstrip(".") == "localhost" or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _https(url: str, allow_private: bool) -> dict:
    rule = "https"
    parts = urlsplit(url)
    if parts.scheme == "https":
        return _result(rule, True, "the URL is https")
    if allow_private and _is_loopback(parts.hostname or ""):
        return _result(rule, None, "not judged: a loopback address, with private targets allowed (development)")
    return _result(rule, False, f"the URL is {_shown(parts.scheme) or 'not'} http(s), not https",
                   "serve the endpoint over https and register the https URL: the signature proves who sent an "
                   "event, but without TLS anyone on the path reads it.")


def judge(url: str, scheme: str, answers: Mapping[str, Answer], *, allow_private: bool = False,
          contract_url: str | None = None, credentials: bool = False, bearer: bool = False) -> list[dict]:
    """The results, one per rule in ``RULES`` order, from the answers by step (a step missing
    from ``answers`` was not sent). ``allow_private``: a loopback URL leaves ``https`` not judged.
    ``contract_url``: the subscription's contract page, linked from the verification advice.
    ``credentials``: the endpoint has headers of its own, so ``credentials_required`` is judged too
    (in ``ALL_RULES`` order); ``bearer``: among them an ``Authorization`` header (an OAuth2 bearer token)."""
    w = _words(normalise_scheme(scheme), contract_url)
    unknown = set(answers) - set(steps(True))
    if unknown:
        raise ValueError(f"unknown step(s): {', '.join(sorted(unknown))}")
    signed = _signed(answers.get("signed"), w)
    signed_ok = signed["passed"] is True
    results = [signed, _fast(answers.get("signed")), _duplicate(answers.get("duplicate"), signed_ok)]
    results += [_rejected(rule, answers.get(step), signed_ok, w)
                for rule, step in (("forged_rejected", "forged"), ("stale_rejected", "stale"),
                                   ("tampered_rejected", "tampered"))]
    if credentials:
        results.append(_credentials(answers.get(CREDENTIALS_STEP), signed_ok, bearer))
    results += [_no_redirect(url, answers), _https(url, allow_private)]
    redirected = next((step for step, a in answers.items() if a.status is not None and 300 <= a.status < 400), None)
    for result in results:
        step = redirected if result["rule"] == "no_redirect" else _JUDGED_ON.get(result["rule"])
        _with_answer(result, answers.get(step) if step else None)
    return results


# The request whose answer each rule is judged on (no_redirect: the first redirected one; https: none).
_JUDGED_ON = {"signed_accepted": "signed", "fast_answer": "signed", "duplicate_accepted": "duplicate",
              "forged_rejected": "forged", "stale_rejected": "stale", "tampered_rejected": "tampered",
              CREDENTIALS_RULE: CREDENTIALS_STEP}


def _with_answer(result: dict, answer: Answer | None) -> None:
    """The answer's status and the start of its body beside the verdict, as the delivery page shows an attempt's."""
    result["status"] = answer.status if answer is not None else None
    result["excerpt"] = _shown(answer.excerpt) if answer is not None and answer.excerpt else None


def failed(results: Sequence[dict]) -> list[str]:
    """The names of the rules that failed (``passed`` is False; None is not a failure)."""
    return [r["rule"] for r in results if r["passed"] is False]


# -- sending ---------------------------------------------------------------------------------------
class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # a 3xx comes back as the answer: Promesa never follows one


_OPENER = urllib.request.build_opener(_NoRedirect, urllib.request.ProxyHandler({}))


def urllib_send(url: str, body: bytes, headers: dict, timeout: float = TIMEOUT_SECONDS) -> Answer:
    """POST with urllib: no redirect followed, no proxy, ``timeout`` for the whole answer. Never raises
    for a failed request: a refused connection, a TLS error or a timeout is an ``Answer`` without status."""
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    started = time.monotonic()
    try:
        response = _OPENER.open(request, timeout=timeout)
    except urllib.error.HTTPError as exc:  # 3xx (not followed), 4xx, 5xx: an answer all the same
        response = exc
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        timed_out = isinstance(reason, (socket.timeout, TimeoutError))
        return Answer(None, time.monotonic() - started, error=f"{type(reason).__name__}: {reason}",
                      timed_out=timed_out)
    try:
        with response:
            received = response.read(_EXCERPT_BYTES)
    except (OSError, http.client.HTTPException) as exc:
        timed_out = isinstance(exc, (socket.timeout, TimeoutError))
        return Answer(None, time.monotonic() - started, error=f"{type(exc).__name__}: {exc}", timed_out=timed_out)
    elapsed = time.monotonic() - started
    if elapsed > timeout:  # a trickled answer: each read was within the timeout, the whole was not
        return Answer(None, elapsed, error=f"the answer took longer than {timeout:.0f} s", timed_out=True)
    return Answer(response.status, elapsed, location=response.headers.get("Location"),
                  excerpt=received[:_SHOWN_CHARS * 4].decode("utf-8", errors="replace"))


def run_check(url: str, secrets: Sequence[str] | str, scheme: str = "promesa", *, send: Send | None = None,
              check_id: str | None = None, clock: Callable[[], float] = time.time,
              timeout: float = TIMEOUT_SECONDS, allow_private: bool = False,
              contract_url: str | None = None, headers: Mapping[str, str] | None = None) -> tuple[str, list[dict]]:
    """Send the check's requests in ``STEPS`` order, each signed just before it goes (a rate-limited
    ``send`` may wait between them), and judge the answers. Returns ``(check_id, results)``.
    ``headers``: the endpoint's own (see the module's docstring).

    When the signed event gets no answer at all, the rest is not sent: each would wait as long.
    ``allow_private``: as in ``judge`` (the command passes True: a developer checks a local endpoint)."""
    send = send or urllib_send
    check_id = check_id or new_check_id()
    answers: dict[str, Answer] = {}
    occurred_at = clock()
    for step in steps(bool(headers)):
        request = build(step, check_id, secrets, scheme, now=clock(), occurred_at=occurred_at, headers=headers)
        answers[step] = send(url, request.body, dict(request.headers), timeout)
        if step == "signed" and answers[step].status is None:
            break
    return check_id, judge(url, scheme, answers, allow_private=allow_private, contract_url=contract_url,
                           credentials=bool(headers), bearer=carries_bearer(headers))


def carries_bearer(headers: Mapping[str, str] | None) -> bool:
    """Do the endpoint's credentials include a bearer token (an ``Authorization: Bearer`` header)?"""
    return any(name.lower() == "authorization" and value.lower().startswith("bearer ")
               for name, value in (headers or {}).items())


# -- the report ------------------------------------------------------------------------------------
_MARKS = {True: "PASS", False: "FAIL", None: "N/A "}


def report(url: str, check_id: str, results: Sequence[dict]) -> str:
    """The readable report: one line a rule (PASS / FAIL / N/A and the detail), the advice under a failure."""
    width = max(len(r["rule"]) for r in results)
    lines = [f"Promesa receiver check {check_id} of {_shown(url)}"]
    for r in results:
        lines.append(f"{_MARKS[r['passed']]}  {r['rule']:<{width}}  {r['detail']}")
        if r.get("excerpt"):
            lines.append(f"      {'':<{width}}  body: {r['excerpt']}")
        if r["advice"]:
            lines.append(f"      {'':<{width}}  -> {r['advice']}")
    counts = {mark: sum(1 for r in results if r["passed"] is mark) for mark in (True, False, None)}
    lines.append(f"{counts[True]} passed, {counts[False]} failed, {counts[None]} not judged")
    return "\n".join(lines)
