"""OAuth2 client credentials on the wire (issue 39), with a token server and a receiver that checks its tokens, both
real servers on 127.0.0.1: one worker asks for a token once however many deliveries wait, again once it expires
(by the injected clock) or once the receiver refuses it, and a token endpoint that fails is an `auth_failed` attempt
with its diagnosis, retried on the schedule, never a crash nor a secret in an attempt or a log line."""

from __future__ import annotations

import logging
import socket

import pytest
from sqlalchemy import func, select

from dashboard.core.clock import unix
from dashboard.core.extensions import db
from dashboard.delivery import oauth
from dashboard.delivery.engine import DeliveryEngine
from dashboard.models import Attempt, Delivery
from dashboard.delivery.failures import words
from dashboard.queue.work import WorkQueue
from tests.support.token_server import BearerReceiver, TokenServer

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def deliver(engine: DeliveryEngine, clock) -> None:
    """Drain what is due with this one engine (one worker: its tokens are kept between drains)."""
    for _ in range(20):
        engine.work.promote_due(unix(clock.now()))
        if not engine.work.ready_count():
            return
        engine.drain(None, 20)


def states(subscription_id: str) -> dict[str, int]:
    db.session.expire_all()
    return dict(db.session.execute(select(Delivery.state, func.count()).where(
        Delivery.subscription_id == subscription_id).group_by(Delivery.state)).all())


def publish_many(producer, n: int) -> None:
    events = [{"type": "file.updated", "data": {"resource_id": f"f_{i}"}} for i in range(n)]
    assert producer.post("/api/v1/events/batch", {"events": events}).status_code == 202


def test_one_worker_asks_once_for_200_deliveries_and_again_once_the_token_expires(app, producer, clock):
    with TokenServer(expires_in=3600) as tokens, BearerReceiver(tokens) as receiver:
        sub = producer.subscribe(receiver.url + "/ok", auth=tokens.auth(scope="webhooks:write", audience="hooks"))
        engine = DeliveryEngine(app, WorkQueue.for_app(app), clock)
        publish_many(producer, 200)
        deliver(engine, clock)
        assert states(sub["id"]) == {"succeeded": 200}
        assert tokens.asked() == 1 and receiver.count() == 200
        [first] = tokens.issued
        assert {r.headers["Authorization"] for r in receiver.requests} == {f"Bearer {first}"}
        [asked] = tokens.requests
        assert asked["client"] == (tokens.client_id, tokens.client_secret)  # HTTP Basic, RFC 6749 2.3.1
        assert asked["form"] == {"grant_type": "client_credentials", "scope": "webhooks:write", "audience": "hooks"}
        assert asked["content_type"] == "application/x-www-form-urlencoded"

        assert producer.post(f"/api/v1/subscriptions/{sub['id']}/test").status_code == 202  # the test event too
        clock.advance(seconds=3600 - oauth.EXPIRY_MARGIN_SECONDS - 1)  # shortly before it expires: still kept
        deliver(engine, clock)
        assert tokens.asked() == 1 and receiver.requests[-1].headers["Authorization"] == f"Bearer {first}"
        assert receiver.requests[-1].headers["X-Event-Type"] == "promesa.test"

        clock.advance(seconds=2)
        producer.publish()
        deliver(engine, clock)
        assert tokens.asked() == 2 and receiver.requests[-1].headers["Authorization"] == f"Bearer {tokens.issued[1]}"
        assert states(sub["id"]) == {"succeeded": 202}


@sqlite_only
def test_a_401_gets_a_fresh_token_once_and_the_attempt_succeeds(app, producer, clock):
    with TokenServer() as tokens, BearerReceiver(tokens) as receiver:
        sub = producer.subscribe(receiver.url + "/ok", auth=tokens.auth())
        engine = DeliveryEngine(app, WorkQueue.for_app(app), clock)
        producer.publish()
        deliver(engine, clock)
        tokens.revoke_all()  # the receiver's gateway forgets the token before it expires
        publish_many(producer, 20)
        deliver(engine, clock)
        assert states(sub["id"]) == {"succeeded": 21}
        assert tokens.asked() == 2  # one refresh for all twenty refusals
        refused = [r.headers["X-Delivery-Id"] for r in receiver.requests[1:]
                   if r.headers["Authorization"] == f"Bearer {tokens.issued[0]}"]
        assert refused and len(refused) == len(set(refused))  # those sent before the refresh, each once
        attempts = db.session.execute(select(Attempt.number, Attempt.status_code)).all()
        assert sorted(set(attempts)) == [(1, 200)]  # one attempt each: the retry is within it

        receiver.behaviour = lambda path, n: (401, {})  # a receiver that takes no token of that server at all
        before = receiver.count()
        producer.publish()
        deliver(engine, clock)
        assert tokens.asked() == 3 and receiver.count() == before + 2  # refreshed once, not in a loop
        last = db.session.scalar(select(Attempt).order_by(Attempt.id.desc()).limit(1))
        assert last.status_code == 401 and last.error is None
        groups = producer.get(f"/api/v1/subscriptions/{sub['id']}/diagnosis").get_json()["groups"]
        assert [g["cause"] for g in groups] == ["unauthorized"] and "OAuth2 bearer token" in groups[0]["advice"]


@sqlite_only
@pytest.mark.parametrize("fault, error", [
    ("down", "auth failed: token endpoint: connection error"),
    ("private", "auth failed: token endpoint: private address refused"),  # the engine's SSRF rules hold for it
    (503, "auth failed: the token endpoint answered 503 (temporarily_unavailable)"),
    ("wrong secret", "auth failed: the token endpoint answered 401 (invalid_client)"),
])
def test_a_failing_token_endpoint_gives_auth_failed_attempts_and_their_diagnosis(app, producer, clock, caplog,
                                                                                 fault, error):
    caplog.set_level(logging.DEBUG)
    with TokenServer() as tokens, BearerReceiver(tokens) as receiver:
        auth = tokens.auth()
        if fault == "down":
            with socket.socket() as closed:  # a port nothing listens on
                closed.bind(("127.0.0.1", 0))
                auth["token_url"] = f"http://127.0.0.1:{closed.getsockname()[1]}/token"
        elif fault == "wrong secret":
            auth["client_secret"] = "cs-not-the-one-the-server-knows"
        else:
            tokens.status = fault
        sub = producer.subscribe(receiver.url + "/ok", auth=auth)
        app.config["PROMESA_ALLOW_PRIVATE_TARGETS"] = fault != "private"
        engine = DeliveryEngine(app, WorkQueue.for_app(app), clock)
        publish_many(producer, 3)
        deliver(engine, clock)
        assert receiver.count() == 0  # nothing is sent without a token
        assert tokens.asked() == (0 if fault in ("down", "private") else 1)  # once for the three
        assert states(sub["id"]) == {"scheduled": 3}  # a failed attempt: retried with backoff
        attempts = db.session.scalars(select(Attempt)).all()
        assert len(attempts) == 3 and all(a.error.startswith(error) and a.status_code is None for a in attempts)
        assert words(None, attempts[0].error) == "auth failed (no OAuth2 token)"

        diagnosis = producer.get(f"/api/v1/subscriptions/{sub['id']}/diagnosis").get_json()
        [group] = diagnosis["groups"]
        assert group["cause"] == "auth_failed" and group["count"] == 3
        assert "token URL" in group["advice"] and "client id and secret" in group["advice"]

        if fault in ("down", "private"):
            return
        tokens.status = None
        clock.advance(seconds=60)  # the second attempt's turn (30 s at most, after the first)
        auth["client_secret"] = tokens.client_secret  # mended: the next attempts get a token and go
        edited = producer.client.patch(f"/api/v1/subscriptions/{sub['id']}", json={"auth": auth},
                                       headers=producer.headers())
        assert edited.status_code == 200
        deliver(engine, clock)
        assert states(sub["id"]) == {"succeeded": 3}
        assert tokens.client_secret not in caplog.text and not any(t in caplog.text for t in tokens.issued)


def test_token_answers_that_give_no_usable_token_are_refused_in_words():
    def result(status, text):
        return oauth.http.AttemptResult(oauth.Outcome(status_code=status), 5, text)

    for status, text, words in [
        (200, "not json", "not a JSON object"), (200, '{"token_type": "Bearer"}', "no usable access_token"),
        (200, '{"access_token": "a\\r\\nX-Evil: 1"}', "no usable access_token"),
        (200, '{"access_token": "t", "token_type": "mac"}', "not Bearer"),
        (302, "", "answered 302: redirects are not followed"),
        (400, '{"error": "invalid_scope", "error_description": "the secret cs-123 is wrong"}', "400 (invalid_scope)"),
    ]:
        with pytest.raises(oauth.AuthFailed) as failed:
            oauth.token_from(result(status, text))
        assert str(failed.value).startswith("auth failed: ") and words in str(failed.value)
        assert "cs-123" not in str(failed.value)
    assert oauth.token_from(result(200, '{"access_token": "t", "expires_in": "600"}')) == ("t", 570)
    assert oauth.token_from(result(200, '{"access_token": "t"}'))[1] == \
        oauth.DEFAULT_LIFETIME_SECONDS - oauth.EXPIRY_MARGIN_SECONDS
    assert oauth.token_from(result(200, '{"access_token": "t", "expires_in": 20}'))[1] == 10
