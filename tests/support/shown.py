"""Everything a subscription's owner, its producer or an operator can read about it (API answers, pages, the audit
log, /metrics, log lines), gathered as text: a credential given once must appear in none of it."""

from __future__ import annotations

import json

from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import AuditEntry


def api_reads(producer, sub_id: str, check_id: str | None = None) -> list[str]:
    """The producer's reads of the subscription, each answered 200."""
    paths = [f"/api/v1/subscriptions/{sub_id}", "/api/v1/subscriptions", f"/api/v1/subscriptions/{sub_id}/deliveries",
             f"/api/v1/subscriptions/{sub_id}/contract", f"/api/v1/subscriptions/{sub_id}/diagnosis"]
    if check_id:
        paths.append(f"/api/v1/checks/{check_id}")
    answers = []
    for path in paths:
        resp = producer.get(path)
        assert resp.status_code == 200, (path, resp.get_json())
        answers.append(resp.get_data(as_text=True))
    return answers


def pages(client, sub_id: str, delivery_id: str) -> dict[str, str]:
    """The dashboard's pages about it, for a signed-in user, each answered 200."""
    got = {path: client.get(path) for path in (
        f"/subscriptions/{sub_id}", f"/deliveries/{delivery_id}", f"/subscriptions/{sub_id}/contract",
        f"/subscriptions/{sub_id}/edit", "/audit", f"/audit?subscription={sub_id}")}
    assert all(resp.status_code == 200 for resp in got.values()), {p: r.status_code for p, r in got.items()}
    return {path: resp.get_data(as_text=True) for path, resp in got.items()}


def audit_entries() -> list[str]:
    return [json.dumps(e.detail) + " " + str(e.target) for e in db.session.scalars(select(AuditEntry))]


def logged(caplog) -> str:
    return caplog.text + " ".join(r.getMessage() for r in caplog.records)


def assert_nowhere(values: dict[str, str], **texts: list[str]) -> None:
    """No value (by what it is) in any of the texts (by where they were read)."""
    found = [(what, where) for what, value in values.items() for where, read in texts.items()
             if any(value in text for text in read)]
    assert not found, found
