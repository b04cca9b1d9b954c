"""An endpoint behind a gateway that demands all three of issue 39's credentials at once: an API key header, an
OAuth2 bearer token and a client certificate. Every delivery, the test event and the receiver check carry all three
(the token over the subscription's own TLS context), and no value of any of them (the header's, the client
secret, a token, the key) appears in a page, an API answer, a log line, an audit entry or /metrics."""

from __future__ import annotations

import json
import logging

import pytest
from promesa_receiver.check import CREDENTIALS_RULE
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import Delivery
from tests.subscriptions.test_own_headers import by_rule, run_check
from tests.support import shown
from tests.support.client_tls import CertificateAuthority, MtlsReceiver
from tests.support.pipeline import deliver_due
from tests.support.token_server import TokenServer

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
API_KEY = "key-5b2e8d41c7"


class Gateway(MtlsReceiver):
    """MtlsReceiver (a client certificate from `ca` or no handshake) that also answers 401 without the API key or
    without a bearer token `tokens` issued."""

    def __init__(self, tmp_path, ca, server, tokens: TokenServer):
        super().__init__(tmp_path, ca, server)
        self.tokens = tokens

    def behaviour(self, path: str, n: int) -> tuple[int, dict]:
        given = self.asking.headers.get("Authorization", "")
        with self.tokens.lock:
            bearer = given.startswith("Bearer ") and given[7:] in self.tokens.valid
        if self.asking.headers.get("X-Api-Key") != API_KEY or not bearer:
            with self.lock:
                self.subjects.append((path, self.asking.peer))
            return 401, {}
        return super().behaviour(path, n)


@sqlite_only
def test_all_three_are_presented_everywhere_and_shown_nowhere(app, client, auth, producer, clock, users, caplog,
                                                              tmp_path):
    caplog.set_level(logging.DEBUG)
    ca = CertificateAuthority()
    mine = ca.issue("subscriber-7")
    with TokenServer() as tokens, Gateway(tmp_path, ca, ca.issue("receiver", server=True), tokens) as gateway:
        answers = []
        created = producer.post("/api/v1/subscriptions", {
            "url": gateway.url + "/ok", "headers": {"X-Api-Key": API_KEY}, "auth": tokens.auth(),
            "tls": mine.tls(ca)})
        assert created.status_code == 201, created.get_json()
        answers.append(created.get_data(as_text=True))
        sub_id = created.get_json()["id"]
        for n in range(3):
            producer.publish(data={"resource_id": f"f_{n}"})
        answers.append(producer.post(f"/api/v1/subscriptions/{sub_id}/test").get_data(as_text=True))
        deliver_due(app, clock)
        states = db.session.scalars(select(Delivery.state).where(Delivery.subscription_id == sub_id)).all()
        assert states == ["succeeded"] * 4, states  # three events and the test event
        assert tokens.asked() == 1  # one token for all four, fetched once
        report = run_check(app, producer, sub_id)
        rules = by_rule(report)
        assert rules["signed_accepted"]["passed"] is True and rules[CREDENTIALS_RULE]["passed"] is True
        assert {peer for _, peer in gateway.subjects} == {"subscriber-7"}  # every request, over its certificate

        delivery_id = db.session.scalar(select(Delivery.id).where(Delivery.subscription_id == sub_id))
        answers += shown.api_reads(producer, sub_id, report["id"])
        read = json.loads(answers[2])
        assert read["headers"] == {"X-Api-Key": "••••"} and read["auth"]["client_secret"] == "••••"
        assert "CN=subscriber-7" in read["tls"]["subject"]
        auth.login("owner")
        html = shown.pages(client, sub_id, delivery_id)
        assert "subscriber-7" in html[f"/subscriptions/{sub_id}"] and tokens.url in html[f"/subscriptions/{sub_id}"]
        secrets = {"header": API_KEY, "client secret": tokens.client_secret,
                   **{f"token {n}": token for n, token in enumerate(tokens.issued)},
                   "key": mine.key.splitlines()[1]}
        assert len(secrets) >= 4
        shown.assert_nowhere(secrets, API=answers, pages=list(html.values()), audit=shown.audit_entries(),
                             metrics=[client.get("/metrics").get_data(as_text=True)], logs=[shown.logged(caplog)])
