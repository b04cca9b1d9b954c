"""A subscription's published contract, generated from its live configuration: what it is
promised, and exactly how to check each promise on the receiving side."""

from __future__ import annotations

from flask import current_app
from promesa_receiver import check as check_rules
from promesa_receiver.signing import CONSUMER_HEADER

from dashboard.delivery.policies import (
    CLIENT_ERROR_MAX_ATTEMPTS,
    ExponentialPolicy,
    QuickThenSweepPolicy,
    policy_for,
)
from dashboard.ingest import catalog
from dashboard.ingest.accept import wants
from dashboard.models import Subscription, SubscriptionMode
from dashboard.schemas import LEASE_SECONDS, MAX_PULL_WAIT
from dashboard.subscriptions import client_auth, client_tls, own_headers, rotation, snippets

TOLERANCE_SECONDS = 300


def human(seconds: float) -> str:
    """30 s, 2 min, 8.5 h, 1.5 d: short and exact enough for a schedule table."""
    if seconds < 60:
        return f"{seconds:g} s"
    if seconds < 3600:
        return f"{seconds / 60:.3g} min"
    if seconds < 86400 * 2:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 86400:.3g} d"


def schedule(sub: Subscription) -> dict:
    policy = policy_for(sub.retry_policy, sub.max_age_seconds)
    if isinstance(policy, ExponentialPolicy):
        rows, earliest, latest = [], 0.0, 0.0
        for number, low, high in policy.schedule():
            earliest, latest = earliest + low, latest + high
            rows.append({"attempt": number, "delay": "immediately" if number == 1 else
                         f"{human(low)} to {human(high)}", "after_first": "—" if number == 1 else
                         f"{human(earliest)} to {human(latest)}"})
        return {"name": policy.name, "rows": rows, "attempts": policy.max_attempts,
                "summary": f"{policy.max_attempts} attempts over {human(earliest)} to {human(latest)}: "
                           f"exponential backoff (x{policy.factor:g} from {human(policy.base_seconds)}, "
                           f"capped at {human(policy.cap_seconds)}) with equal jitter, "
                           "each delay uniform between half and all of its nominal value"}
    assert isinstance(policy, QuickThenSweepPolicy)
    return {"name": policy.name, "attempts": None, "rows": [
        {"attempt": 1, "delay": "immediately", "after_first": "—"},
        {"attempt": 2, "delay": human(policy.quick_interval_seconds), "after_first": "0.5 s"},
        {"attempt": 3, "delay": human(policy.quick_interval_seconds), "after_first": "1 s"},
        {"attempt": "4, 5, …", "delay": f"about {human(policy.sweep_interval_seconds)} (one per sweep)",
         "after_first": f"until the event is {human(sub.max_age_seconds)} old"}],
        "summary": f"three quick attempts {human(policy.quick_interval_seconds)} apart, then one about every "
                   f"{human(policy.sweep_interval_seconds)} until the event is {human(sub.max_age_seconds)} old "
                   "(a replay starts the count again)"}


def policy_in_words(name: str, max_age_seconds: float) -> str:
    """What a retry policy does, in one sentence for the form that chooses it: how many attempts, over how
    long, before the delivery is dead-lettered."""
    policy = policy_for(name, max_age_seconds)
    if isinstance(policy, ExponentialPolicy):
        rows = policy.schedule()
        return (f"{policy.max_attempts} attempts, each wait {policy.factor:g} times the last, from "
                f"{human(policy.base_seconds)} up to {human(policy.cap_seconds)} (with jitter): the last comes "
                f"{human(sum(low for _, low, _ in rows))} to {human(sum(high for _, _, high in rows))} after "
                "the first, then the delivery is dead-lettered.")
    return (f"{policy.quick_attempts} quick attempts {human(policy.quick_interval_seconds)} apart, then one about "
            f"every {human(policy.sweep_interval_seconds)} until the event is {human(max_age_seconds)} old (the "
            "maximum event age below), then the delivery is dead-lettered.")


def signature(sub: Subscription) -> dict:
    if sub.signature_scheme == "standard-webhooks":
        return {"scheme": "Standard Webhooks", "headers": "webhook-id, webhook-timestamp, webhook-signature",
                "format": "webhook-signature: v1,<base64 HMAC-SHA256> (space-separated list during a rotation)",
                "signed": "\"<webhook-id>.<webhook-timestamp>.<raw body>\", keyed with the base64-decoded "
                          "part of the secret after whsec_",
                "id_note": "webhook-id is the event id: identical on every retry and replay"}
    return {"scheme": "Promesa (Stripe-compatible)", "headers": "X-Signature",
            "format": "X-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256> (one v1 per secret during a rotation)",
            "signed": "\"<t>.<raw body>\", keyed with the UTF-8 bytes of the whole secret string (whsec_…)",
            "id_note": "X-Event-Id is the event id: identical on every retry and replay"}


def rotation_text(sub: Subscription) -> str:
    """How a secret rotation looks from the receiving side, and what signs right now (never values)."""
    several = ("X-Signature carries one v1 per secret (t=…,v1=<new>,v1=<old>)" if sub.signature_scheme != "standard-webhooks"
               else "webhook-signature carries one entry per secret, space-separated (v1,<new> v1,<old>)")
    now = current_app.config["CLOCK"].now()
    signing = rotation.signing_secrets(sub, now)
    current = (f"Right now two secrets sign: the newest, and the previous one until "
               f"{signing[1].until:%Y-%m-%d %H:%M:%S} UTC." if len(signing) > 1 else "Right now one secret signs.")
    return (f"The endpoint's owners can rotate its secret. For a grace period they choose (24 h by default, "
            f"up to 7 days) the old and the new secret both sign every delivery: {several}. Accept a "
            f"delivery when any signature matches a secret you hold, so you can switch to the new secret "
            f"whenever you like and no delivery fails. After the grace only the new secret signs, and the old "
            f"one is deleted. {current}")


def consumer_text(sub: Subscription) -> str:
    """Which customer a delivery is for, said by a header outside the signed body (never a body field)."""
    general = (f"Deliveries to a consumer's endpoint carry {CONSUMER_HEADER}: <its uid>, the consumer the "
               "event is for. It is not part of the signed content: after verifying, use it to check that the "
               "endpoint it arrived at belongs to that customer.")
    if sub.consumer_id is None:
        return general + f" This endpoint is the team's own: its deliveries carry no {CONSUMER_HEADER}."
    return general + f" This endpoint is consumer {sub.consumer.uid}'s: every delivery carries " \
                     f"{CONSUMER_HEADER}: {sub.consumer.uid}."


def own_headers_text(sub: Subscription) -> dict:
    """Which of the receiver's own headers every request carries: names only, never a value."""
    names = own_headers.names(sub)
    if not names:
        return {"names": [], "text": "None: this endpoint has no headers of its own."}
    return {"names": names, "text": f"Every delivery, test event and receiver check carries {', '.join(names)}, with "
                                    "the value its owners gave (never shown again). Refuse a request without them: "
                                    "the receiver check sends one correctly signed request without them "
                                    "(credentials_required) and expects 400, 401 or 403. They prove nothing about the "
                                    "body: verify the signature as well."}


# A pull subscription's receiver fetches and answers: no connection is made to it, so no timeout and no check.
PULL_TERMS = {
    "fetching": f"You fetch deliveries: GET /api/v1/subscriptions/<id>/pull leases up to 100 due ones for the "
                f"lease you ask for ({LEASE_SECONDS[0]} to {LEASE_SECONDS[1]} s); each carries its exact body and "
                "the signature headers a push would. Answer each with POST .../pull/ack and the status your code "
                "would have answered: 2xx settles it, anything else is a failed attempt. A lease that runs out "
                "without an ack is a failed attempt too, and the delivery is handed out again on the schedule. "
                f"With wait (up to {MAX_PULL_WAIT} s) a pull that finds nothing answers as soon as a delivery is "
                "due. Fetch with the subscription's own pull key, which opens nothing else.",
    "status": "The status codes below are the ones you acknowledge with.",
    "checks": "Not run for a pull subscription: Promesa makes no request to your receiver.",
}


def build(sub: Subscription) -> dict:
    declared = [t for t in catalog.team_event_types(sub.team) if wants(sub, t.name, t.version)]
    cap = current_app.config["PROMESA_MAX_DATA_BYTES"]
    return {
        "subscription": sub,
        "delivery": "At least once. Duplicates happen (a retry after a lost answer, a replay): deduplicate on "
                    "the event id, which never changes.",
        "ordering": "Not guaranteed. Every body carries the time the event happened (timestamp) and the "
                    "resource's version: apply an event only if it is newer than what you hold.",
        "signature": signature(sub),
        "tolerance_seconds": TOLERANCE_SECONDS,
        "rotation": rotation_text(sub),
        "schedule": schedule(sub),
        "timeouts": {"connect": sub.connect_timeout, "attempt": sub.attempt_timeout},
        "pull": PULL_TERMS if sub.mode == SubscriptionMode.PULL else None,
        "status": [
            ("2xx", "success; nothing more is sent"),
            ("3xx", "failure: redirects are never followed (point the subscription at the final URL); "
                    "retried on the full schedule"),
            ("408, 5xx, timeouts, connection errors", "retried on the full schedule"),
            ("429", "retried, no sooner than Retry-After (capped by the schedule)"),
            ("410 Gone", "the subscription is disabled; its deliveries are held, not dropped, until it is resumed"),
            ("other 4xx", f"retried, {CLIENT_ERROR_MAX_ATTEMPTS} attempts at most"),
        ],
        "payload": f"Thin events: ids, types, versions and times only — no content, no personal data. "
                   f"data is at most {cap} bytes; fetch the resource from our API when you need its content. "
                   + consumer_text(sub),
        "dead_letters": "After the last attempt the delivery is dead-lettered: kept, listed on this "
                        "subscription's page, and replayable (one, or all) with a fresh schedule. Paused or "
                        "disabled subscriptions keep accumulating held deliveries; resume delivers them.",
        "versioning": "An incompatible change ships as a new version of the event type; a subscription pins "
                      "the version it wants per type (event_versions) and types it does not pin arrive in "
                      "every version.",
        "checks": PULL_TERMS["checks"] if sub.mode == SubscriptionMode.PULL else f"When this subscription's owners run the receiver check, Promesa sends five requests of the "
                  f"reserved event type {check_rules.EVENT_TYPE}, some signed correctly and some forged, stale "
                  f"or tampered, to see that you reject what you must. Each carries {check_rules.CHECK_HEADER}: "
                  "<check id>, so your logs can tell a check from an attack. A receiver must not skip "
                  "verification because of that header: anyone can send it. Verify, and answer, exactly as "
                  "for any other delivery." + (" With headers of your own, a sixth request is the correctly "
                                               "signed event without them, which you must refuse."
                                               if sub.headers_ciphertext else "")
                  + (" With a bearer token, a request without it is among them, and must be refused too."
                     if sub.auth_ciphertext else ""),
        "own_headers": own_headers_text(sub),
        "client_certificate": client_tls.contract_terms(sub),
        "auth": client_auth.contract_text(sub),
        "filter": sub.filter,
        "event_types": sub.event_types,
        "event_versions": sub.event_versions or {},
        "declared": declared,
        "snippets": {language: snippets.source(sub.signature_scheme, language)
                     for language in ("python", "typescript")},
        "generated_at": current_app.config["CLOCK"].now().replace(microsecond=0),
    }
