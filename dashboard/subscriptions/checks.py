"""The receiver check of a subscription: Promesa sends its endpoint the requests of
`promesa_receiver.check` (the one definition of the rules, shared with the SDK's command) and
stores what each rule found.

`start()` stores a running `Check` (refused with 429 if one of the same team started in the last
minute, whatever its subscription, 409 while one of the team runs), audits it, and after the commit
enqueues `run(check_id, contract_url)` on the checks lane (dashboard.queue.lanes), never on the
delivery workers' queue. The job has DEADLINE_SECONDS in all and stops before its next request once
they are spent, once its subscription is deleted or disabled (`stop_running` ends it at once), or
once its worker is asked to stop; what was answered until then is judged and kept, with the reason.
It sends through `Sender`: the delivery client's rules (no redirect followed,
private targets refused unless PROMESA_ALLOW_PRIVATE_TARGETS, the subscription's timeouts and rate
limit), signed with every secret that signs the subscription's deliveries now, with the receiver's own
headers where it has some and the OAuth2 bearer token where it has client credentials (and one request without
them, for rule credentials_required; no request at all when the token cannot be had), and each request
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
from dashboard.core.links import absolute_for
from dashboard.core.validation import ApiError
from dashboard.delivery import failures, http, oauth, tls
from dashboard.delivery.ratelimit import MAX_WAIT_SECONDS, RateLimiter
from dashboard.models import Check, CheckState, Subscription, SubscriptionState, Team, previous_signs
from dashboard.queue import lanes
from dashboard.queue.work import WorkQueue

log = logging.getLogger(__name__)

# A check may start at most once a minute per team, whichever subscription (deleted ones too): a receiver's
# monitoring may page on forged requests, and creating and deleting subscriptions must not multiply that.
MIN_INTERVAL_SECONDS = 60
# A check's whole time in its lane (PROMESA_CHECK_DEADLINE_SECONDS overrides it): a receiver that answers
# within the fast_answer rule's FAST_SECONDS gets all five requests within it.
DEADLINE_SECONDS = 30.0
# RQ ends a job this much past the check's own deadline (a request in flight, the final write).
JOB_TIMEOUT_SECONDS = int(DEADLINE_SECONDS) + 60
# A check still running after this was lost (its worker died while it waited or ran), and no longer
# blocks its team's next one.
STALE_SECONDS = 15 * 60


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


def contract_url(sub: Subscription) -> str:
    """The subscription's contract page, linked from the check's advice."""
    return absolute_for("pages.contract", subscription_id=sub.id)


def latest_of_team(team_id: int) -> Check | None:
    return db.session.scalar(select(Check).join(Subscription, Subscription.id == Check.subscription_id)
                             .where(Subscription.team_id == team_id)
                             .order_by(Check.started_at.desc(), Check.id.desc()).limit(1))


def refuse_if_busy(team_id: int) -> None:
    """429 if a check of this team started less than a minute ago, 409 while one of the team runs (one
    lost longer than STALE_SECONDS ends abandoned). Creating a subscription with "check": true asks first,
    so that a refusal stores nothing."""
    now = current_app.config["CLOCK"].now()
    last = latest_of_team(team_id)
    if last is None:
        return
    since = (now - last.started_at).total_seconds()
    if since < MIN_INTERVAL_SECONDS:
        wait = max(1, int(MIN_INTERVAL_SECONDS - since + 0.999))
        raise TooSoon(f"a check of this team started {int(since)} s ago: at most one a minute per team, "
                      f"whichever subscription (try again in {wait} s)", wait)
    if last.state == CheckState.RUNNING:
        if since < STALE_SECONDS:
            raise ApiError(409, f"check {last.id} of this team is still running: one at a time per team")
        _finish(last.id, None, error="abandoned: its job did not finish in time")


def start(sub: Subscription) -> Check:
    """Store a running check of `sub` and enqueue its job on the checks lane. 409 for a deleted or disabled
    subscription or while a check of its team runs; 429 if one of its team started less than a minute ago."""
    if sub.deleted_at is not None:
        raise ApiError(409, "this subscription is deleted: its history stays readable, nothing else changes")
    if sub.state == SubscriptionState.DISABLED:
        raise ApiError(409, "this subscription is disabled: enable it (or pause it) to check its receiver")
    if sub.url is None:
        raise ApiError(409, "this is a pull subscription: there is no URL to check, its receiver fetches deliveries")
    # Concurrent starts of one team wait for each other here (PostgreSQL), so the team's limit holds.
    db.session.execute(select(Team.id).where(Team.id == sub.team_id).with_for_update())
    refuse_if_busy(sub.team_id)
    now = current_app.config["CLOCK"].now()
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
    link = contract_url(sub)
    db.session.commit()
    try:  # after the commit: the job must find its row
        lanes.enqueue("checks", "dashboard.jobs.receiver_check", check.id, link,
                      job_id=f"check-{check.id}", job_timeout=JOB_TIMEOUT_SECONDS,
                      result_ttl=3600, failure_ttl=7 * 86400)
    except (redis.RedisError, OSError) as exc:  # finished, and saying why: never running forever
        log.warning("could not enqueue check %s", check.id, exc_info=True)
        _finish(check.id, None, error=f"could not reach the workers' queue: {exc}"[:500])
        db.session.refresh(check)
    return check


def stop_running(sub: Subscription, why: str) -> None:
    """End the subscription's running check, if any (the caller commits): its job sends nothing more, and a
    queued one never starts. Called when the subscription is deleted or disabled."""
    for check_id in db.session.scalars(select(Check.id).where(Check.subscription_id == sub.id,
                                                              Check.state == CheckState.RUNNING)).all():
        _end(check_id, None, error=f"stopped: {why}")


class Stopped(Exception):
    """The check ends before its next request; the message says why, for its report."""


def run(check_id: str, contract_url: str | None = None) -> dict:
    """The RQ job (checks lane): send the check's requests and store the results. A check whose subscription
    was deleted or disabled meanwhile sends nothing; one stopped partway keeps what was answered. A failure
    inside Promesa ends the check (its error says so), then propagates to RQ."""
    try:
        check = db.session.get(Check, check_id)
        if check is None or check.state != CheckState.RUNNING:
            return {"check": check_id, "ran": False}
        sub = db.session.get(Subscription, check.subscription_id)
        gone = _gone(sub.deleted_at, sub.state)
        if gone:
            _finish(check_id, None, error=f"stopped before its first request: {gone}")
            return {"check": check_id, "ran": False}
        app = current_app._get_current_object()
        clock = app.config["CLOCK"]
        allow_private = app.config["PROMESA_ALLOW_PRIVATE_TARGETS"]
        seconds = app.config.get("PROMESA_CHECK_DEADLINE_SECONDS", DEADLINE_SECONDS)
        secrets = signing_secrets(sub, clock.now())
        headers = http.own_headers(sub.headers_ciphertext)  # sent as deliveries send them; one step goes without
        url, scheme, timeout, auth = sub.url, sub.signature_scheme, sub.attempt_timeout, sub.auth_ciphertext
        sender = Sender(sub, app, check_id, time.monotonic() + seconds, seconds)
        db.session.commit()  # no transaction held open while the receiver answers
        error = None
        with sender as send:
            try:
                headers |= sender.bearer(auth)
            except oauth.AuthFailed as failed:  # nothing is sent: every request would be refused for want of it
                _finish(check_id, without_token(rules.judge(url, scheme, {}, allow_private=allow_private,
                                                            credentials=True, bearer=True)),
                        error=(f"{failed}. Nothing was sent to the endpoint, and its rules are not judged: fix the "
                              "subscription's OAuth2 client credentials (or the token endpoint), then run the "
                              "check again")[:500])
                return {"check": check_id, "ran": False, "error": str(failed)}
            steps = rules.steps(bool(headers))
            try:
                _, results = rules.run_check(url, secrets, scheme, send=send, check_id=check_id,
                                             clock=lambda: unix(clock.now()), timeout=timeout,
                                             allow_private=allow_private, contract_url=contract_url, headers=headers)
            except Stopped as stop:  # judge what was answered; the steps not sent are not judged
                results = rules.judge(url, scheme, dict(zip(steps, sender.answers)), allow_private=allow_private,
                                      contract_url=contract_url, credentials=bool(headers),
                                      bearer=rules.carries_bearer(headers))
                error = f"stopped after {len(sender.answers)} of {len(steps)} requests: {stop}"
        _finish(check_id, results, error=error)
        return {"check": check_id, "ran": True, "failed": rules.failed(results), "error": error}
    except Exception as exc:
        db.session.rollback()
        _finish(check_id, None, error=f"the check could not run: {type(exc).__name__}: {exc}"[:500])
        raise
    finally:
        db.session.remove()


def without_token(results: list[dict]) -> list[dict]:
    """The results of a check that got no OAuth2 token: not judged, saying so (https is judged on the URL)."""
    for result in results:
        if result["passed"] is None:
            result["detail"] = "not judged: Promesa got no OAuth2 token for the endpoint (auth failed, see above)"
    return results


def _gone(deleted_at, state) -> str | None:
    """Why a check of a subscription in this state must not send (None: it may)."""
    if deleted_at is not None:
        return "its subscription was deleted"
    if state == SubscriptionState.DISABLED:
        return "its subscription was disabled"
    return None


def signing_secrets(sub: Subscription, now: dt.datetime) -> list[str]:
    """Every secret that signs the subscription's deliveries at `now`, as the delivery engine signs them."""
    secrets = [crypto.decrypt(sub.secret_ciphertext)]
    if sub.previous_secret_ciphertext and previous_signs(sub.previous_secret_expires_at, now):
        secrets.append(crypto.decrypt(sub.previous_secret_ciphertext))
    return secrets


def _finish(check_id: str, results: list[dict] | None, error: str | None = None) -> None:
    _end(check_id, results, error)
    db.session.commit()


def _end(check_id: str, results: list[dict] | None, error: str | None = None) -> None:
    """Move a running check to finished, once, with its results (or why there are none), and audit it;
    the caller commits."""
    now = current_app.config["CLOCK"].now()
    ended = db.session.execute(
        update(Check).where(Check.id == check_id, Check.state == CheckState.RUNNING)
        .values(state=CheckState.FINISHED, finished_at=now, results=results, error=error)).rowcount
    if ended:
        check = db.session.get(Check, check_id)
        db.session.refresh(check)
        sub = db.session.get(Subscription, check.subscription_id)
        detail = {"failed": rules.failed(results)} if results is not None else {}
        detail |= {"error": error} if error else {}
        audit.record("check.finished", subscription=sub, target=f"check:{check_id}", detail=detail,
                     actor=audit.SYSTEM)


class Sender:
    """The check's `send`: one request at a time through the delivery client (`delivery.http.post`),
    at the subscription's rate-limit turns, on an event loop and HTTP session of its own. Before each
    request it asks whether the check may go on (`Stopped` if not), and it keeps every answer in order."""

    def __init__(self, sub: Subscription, app, check_id: str, deadline: float, seconds: float):
        self.subscription_id = sub.id
        self.check_id = check_id
        self.deadline = deadline  # time.monotonic() by which the check ends
        self.seconds = seconds
        self.answers: list[rules.Answer] = []
        self.rate = sub.rate_limit_per_s
        self.connect_timeout, self.attempt_timeout = sub.connect_timeout, sub.attempt_timeout
        self.allow_private = app.config["PROMESA_ALLOW_PRIVATE_TARGETS"]
        self.excerpt_bytes = app.config["PROMESA_RESPONSE_EXCERPT_BYTES"]
        self.clock = app.config["CLOCK"]
        self.ssl_context = tls.context_of(sub.tls_ciphertext)  # its client certificate, as deliveries present it
        work = WorkQueue.for_app(app)
        # Turns within the lookahead are booked in one call and waited for here.
        self.limiter = RateLimiter(work.conn, app.config["PROMESA_REDIS_PREFIX"], lookahead=MAX_WAIT_SECONDS)
        self.runner = asyncio.Runner()
        self.session = None
        self.tokens = oauth.Tokens(self.clock, crypto.decrypt, self.allow_private)

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

    def bearer(self, auth_ciphertext: str | None) -> dict[str, str]:
        """The Authorization header of a subscription with OAuth2 client credentials (none without), its token
        asked for as a delivery's is; oauth.AuthFailed when the token endpoint fails."""
        if not auth_ciphertext:
            return {}
        return oauth.bearer(self.runner.run(self.tokens.token(
            self.session, self.subscription_id, auth_ciphertext, connect_timeout=self.connect_timeout,
            attempt_timeout=self.attempt_timeout)))

    def out_of_time(self) -> Stopped:
        return Stopped(f"the check's {self.seconds:g} s ran out (the endpoint answers too slowly for all of it)")

    def may_go_on(self) -> float:
        """The seconds left, or `Stopped`: the worker is stopping, the time is spent, or the check was ended
        (its subscription deleted or disabled) since the last request."""
        if lanes.stopping.is_set():
            raise Stopped("its worker was asked to stop")
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self.out_of_time()
        now = db.session.execute(
            select(Check.state.label("check"), Subscription.deleted_at, Subscription.state.label("subscription"))
            .join(Subscription, Subscription.id == Check.subscription_id).where(Check.id == self.check_id)).one()
        db.session.commit()  # no transaction held open while the receiver answers
        gone = _gone(now.deleted_at, now.subscription)
        if gone or now.check != CheckState.RUNNING:
            raise Stopped(gone or "it was ended meanwhile")
        return left

    def wait_turn(self) -> None:
        """Take a turn of the subscription's rate limit (shared with its deliveries) and wait for it, within
        the check's time."""
        if not self.rate:
            return
        while True:
            now = unix(self.clock.now())
            got, first, next_at = self.limiter.admit({self.subscription_id: (self.rate, 1)}, now)[
                self.subscription_id]
            wait = max(0.0, first - now) if got else min(max(next_at - now, 0.05), MAX_WAIT_SECONDS)
            if time.monotonic() + wait >= self.deadline:
                raise self.out_of_time()
            time.sleep(wait)  # the turn the limiter booked for this request, or until one may be booked
            if got:
                return

    def __call__(self, url: str, body: bytes, headers: dict, timeout: float) -> rules.Answer:
        self.may_go_on()
        self.wait_turn()
        left = self.may_go_on()
        cut = left < timeout  # the request may not outlast the check
        result = self.runner.run(http.post(
            self.session, url, body, headers, connect_timeout=min(self.connect_timeout, timeout, left),
            attempt_timeout=min(timeout, left), excerpt_bytes=self.excerpt_bytes, allow_private=self.allow_private,
            ssl_context=self.ssl_context))
        outcome = result.outcome
        timed_out = outcome.status_code is None and (outcome.error or "").startswith(failures.TIMEOUT)
        if cut and timed_out:  # the check's time ran out, not the receiver's: this answer is not judged
            raise self.out_of_time()
        answer = rules.Answer(status=outcome.status_code, elapsed=result.duration_ms / 1000,
                              location=result.location, error=None if outcome.status_code else outcome.error,
                              timed_out=timed_out, excerpt=result.response_excerpt)
        self.answers.append(answer)
        return answer


def summary(check: Check | None) -> dict | None:
    """What the report card counts: passed, failed, not judged."""
    if check is None or check.results is None:
        return None
    marks = [r["passed"] for r in check.results]
    return {"passed": marks.count(True), "failed": marks.count(False), "not_judged": marks.count(None)}

