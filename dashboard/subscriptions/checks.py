"""The receiver check of a subscription: Promesa sends its endpoint the requests of
`promesa_receiver.check` (the one definition of the rules, shared with the SDK's command) and
stores what each rule found.

`start()` stores a running `Check` (refused with 429 if one started in the last minute, 409 while
one runs), audits it, and after the commit enqueues `run(check_id, contract_url)` on the workers' RQ
queue. The job sends through `send_for(sub)`: the delivery client's rules (no redirect followed,
private targets refused unless PROMESA_ALLOW_PRIVATE_TARGETS, the subscription's timeouts and rate
limit), signed with every secret that signs the subscription's deliveries now, and each request
carries X-Promesa-Check. Nothing is written as a Delivery or an Attempt: check requests never
show in a delivery count, a chart, an incident or the dead letters.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from typing import Self

import redis
from flask import current_app
from promesa_receiver import check as rules
from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import aliased

from dashboard import audit
from dashboard.core import crypto
from dashboard.core.clock import unix
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.delivery import http
from dashboard.delivery.ratelimit import MAX_WAIT_SECONDS, RateLimiter
from dashboard.models import Check, CheckState, Subscription, previous_signs
from dashboard.queue.work import WorkQueue

log = logging.getLogger(__name__)

# A check may start at most once a minute per subscription: a receiver's monitoring may page on forged requests.
MIN_INTERVAL_SECONDS = 60
# Five requests of at most 10 s each, and the rate limit's turns between them: a check still running after
# this was lost (its worker died), and no longer blocks the next one.
STALE_SECONDS = 15 * 60
JOB_TIMEOUT_SECONDS = STALE_SECONDS


class TooSoon(ApiError):
    """429, with the seconds until a check may start again (the API sends them as Retry-After)."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(429, message)
        self.retry_after = retry_after


def latest(subscription_id: str) -> Check | None:
    return db.session.scalar(select(Check).where(Check.subscription_id == subscription_id)
                             .order_by(Check.started_at.desc(), Check.id.desc()).limit(1))


def latest_failed(subscription_ids: list[str]) -> set[str]:
    """Of these subscriptions, those whose latest finished check failed a rule."""
    if not subscription_ids:
        return set()
    finished = aliased(Check)
    newest = (select(func.max(finished.started_at)).where(finished.subscription_id == Check.subscription_id,
                                                          finished.state == CheckState.FINISHED)
              .scalar_subquery())  # one row per subscription, read from ix_checks_subscription_started
    rows = db.session.execute(select(Check.subscription_id, Check.results).where(
        Check.subscription_id.in_(subscription_ids), Check.state == CheckState.FINISHED,
        Check.started_at == newest))
    return {subscription_id for subscription_id, results in rows if rules.failed(results or [])}


def start(sub: Subscription, contract_url: str | None = None) -> Check:
    """Store a running check of `sub` and enqueue its job. 409 for a deleted subscription or while a
    check runs; 429 if one started less than a minute ago."""
    if sub.deleted_at is not None:
        raise ApiError(409, "this subscription is deleted: its history stays readable, nothing else changes")
    now = current_app.config["CLOCK"].now()
    last = latest(sub.id)
    if last is not None:
        since = (now - last.started_at).total_seconds()
        if since < MIN_INTERVAL_SECONDS:
            wait = max(1, int(MIN_INTERVAL_SECONDS - since + 0.999))
            raise TooSoon(f"a check of this subscription started {int(since)} s ago: at most one a minute "
                          f"(try again in {wait} s)", wait)
        if last.state == CheckState.RUNNING:
            if since < STALE_SECONDS:
                raise ApiError(409, f"check {last.id} of this subscription is still running: one at a time")
            _finish(last.id, None, error="abandoned: its job did not finish in time")
    kind, name = audit.current_actor()
    check = Check(id=rules.new_check_id(), subscription_id=sub.id, state=CheckState.RUNNING, started_at=now,
                  requested_by=name)
    db.session.add(check)
    try:
        db.session.flush()
    except IntegrityError:  # a concurrent click started one first
        db.session.rollback()
        raise ApiError(409, "a check of this subscription is already running: one at a time") from None
    audit.record("check.started", subscription=sub, target=f"check:{check.id}", actor=(kind, name))
    db.session.commit()
    try:  # after the commit: the job must find its row
        WorkQueue.for_app().rq.enqueue("dashboard.subscriptions.checks.run", check.id, contract_url,
                                       job_id=f"check-{check.id}", job_timeout=JOB_TIMEOUT_SECONDS,
                                       result_ttl=3600, failure_ttl=7 * 86400)
    except (redis.RedisError, OSError) as exc:  # finished, and saying why: never running forever
        log.warning("could not enqueue check %s", check.id, exc_info=True)
        _finish(check.id, None, error=f"could not reach the workers' queue: {exc}"[:500])
        db.session.refresh(check)
    return check


def run(check_id: str, contract_url: str | None = None) -> dict:
    """The RQ job: send the check's requests and store the results. A failure inside Promesa ends the
    check (its error says so), then propagates to RQ."""
    try:
        check = db.session.get(Check, check_id)
        if check is None or check.state != CheckState.RUNNING:
            return {"check": check_id, "ran": False}
        sub = db.session.get(Subscription, check.subscription_id)
        app = current_app._get_current_object()
        clock = app.config["CLOCK"]
        allow_private = app.config["PROMESA_ALLOW_PRIVATE_TARGETS"]
        secrets = signing_secrets(sub, clock.now())
        url, scheme, timeout, sender = sub.url, sub.signature_scheme, sub.attempt_timeout, Sender(sub, app)
        db.session.commit()  # no transaction held open while the receiver answers
        with sender as send:
            _, results = rules.run_check(url, secrets, scheme, send=send, check_id=check_id,
                                         clock=lambda: unix(clock.now()), timeout=timeout,
                                         allow_private=allow_private, contract_url=contract_url)
        _finish(check_id, results)
        return {"check": check_id, "ran": True, "failed": rules.failed(results)}
    except Exception as exc:
        db.session.rollback()
        _finish(check_id, None, error=f"the check could not run: {type(exc).__name__}: {exc}"[:500])
        raise
    finally:
        db.session.remove()


def signing_secrets(sub: Subscription, now: dt.datetime) -> list[str]:
    """Every secret that signs the subscription's deliveries at `now`, as the delivery engine signs them."""
    secrets = [crypto.decrypt(sub.secret_ciphertext)]
    if sub.previous_secret_ciphertext and previous_signs(sub.previous_secret_expires_at, now):
        secrets.append(crypto.decrypt(sub.previous_secret_ciphertext))
    return secrets


def _finish(check_id: str, results: list[dict] | None, error: str | None = None) -> None:
    """Move a running check to finished, once, with its results (or why there are none), and audit it."""
    now = current_app.config["CLOCK"].now()
    ended = db.session.execute(
        update(Check).where(Check.id == check_id, Check.state == CheckState.RUNNING)
        .values(state=CheckState.FINISHED, finished_at=now, results=results, error=error)).rowcount
    if ended:
        check = db.session.get(Check, check_id)
        db.session.refresh(check)
        sub = db.session.get(Subscription, check.subscription_id)
        detail = {"failed": rules.failed(results)} if results is not None else {"error": error}
        audit.record("check.finished", subscription=sub, target=f"check:{check_id}", detail=detail,
                     actor=audit.SYSTEM)
    db.session.commit()


class Sender:
    """The check's `send`: one request at a time through the delivery client (`delivery.http.post`),
    at the subscription's rate-limit turns, on an event loop and HTTP session of its own."""

    def __init__(self, sub: Subscription, app):
        self.subscription_id = sub.id
        self.rate = sub.rate_limit_per_s
        self.connect_timeout = sub.connect_timeout
        self.allow_private = app.config["PROMESA_ALLOW_PRIVATE_TARGETS"]
        self.excerpt_bytes = app.config["PROMESA_RESPONSE_EXCERPT_BYTES"]
        self.clock = app.config["CLOCK"]
        work = WorkQueue.for_app(app)
        # Turns within the lookahead are booked in one call and waited for here.
        self.limiter = RateLimiter(work.conn, app.config["PROMESA_REDIS_PREFIX"], lookahead=MAX_WAIT_SECONDS)
        self.runner = asyncio.Runner()
        self.session = None

    def __enter__(self) -> Self:
        async def open_session():
            return http.client_session(1, self.allow_private)

        self.session = self.runner.run(open_session())
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.runner.run(self.session.close())
        finally:
            self.runner.close()

    def wait_turn(self) -> None:
        """Take a turn of the subscription's rate limit (shared with its deliveries) and wait for it."""
        if not self.rate:
            return
        while True:
            now = unix(self.clock.now())
            got, first, next_at = self.limiter.admit({self.subscription_id: (self.rate, 1)}, now)[
                self.subscription_id]
            if got:
                time.sleep(max(0.0, first - now))  # the turn the limiter booked for this request
                return
            time.sleep(min(max(next_at - now, 0.05), MAX_WAIT_SECONDS))

    def __call__(self, url: str, body: bytes, headers: dict, timeout: float) -> rules.Answer:
        self.wait_turn()
        result = self.runner.run(http.post(
            self.session, url, body, headers, connect_timeout=min(self.connect_timeout, timeout),
            attempt_timeout=timeout, excerpt_bytes=self.excerpt_bytes, allow_private=self.allow_private))
        outcome = result.outcome
        return rules.Answer(status=outcome.status_code, elapsed=result.duration_ms / 1000,
                            location=result.location, error=None if outcome.status_code else outcome.error,
                            timed_out=outcome.status_code is None and (outcome.error or "").startswith("timeout"))


def summary(check: Check | None) -> dict | None:
    """What the report card counts: passed, failed, not judged."""
    if check is None or check.results is None:
        return None
    marks = [r["passed"] for r in check.results]
    return {"passed": marks.count(True), "failed": marks.count(False), "not_judged": marks.count(None)}

