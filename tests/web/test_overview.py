"""The overview: worst subscription first, with its health figures, a sparkline and the queue above."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import text

from dashboard.stats import overview as overview_figures
from dashboard.core.extensions import db
from dashboard.ingest.accept import ingest_many
from dashboard.models import DeliveryState
from dashboard.schemas import EventInput

from tests.support import pipeline


def _rows(html: str) -> list[str]:
    return re.findall(r'<tr class="severity-\d">.*?</tr>', html, re.S)


def test_it_puts_the_failing_subscription_first_with_its_figures(app, client, auth, producer, receiver, users, clock):
    healthy = producer.subscribe(receiver.url + "/status/200", description="healthy")
    failing = producer.subscribe(receiver.url + "/status/500", description="failing")
    producer.publish()
    pipeline.deliver_due(app, clock)  # one success, one failure (scheduled again)
    clock.advance(minutes=5)
    auth.login("oncall")

    html = client.get("/").get_data(as_text=True)
    rows = _rows(html)
    assert [("failing" in r, "healthy" in r) for r in rows] == [(True, False), (False, True)]
    first, second = rows
    assert "0 %" in first and "100 %" in second  # success over the last 24 h
    assert '<span class="bad">5 min</span>' in first  # failing since the failure five minutes ago
    assert "5 min ago" in second and "never" in first  # last success
    assert first.count('<path class="fail" d="M') == 1 and second.count('<path class="ok" d="M') == 1  # the sparklines' bars
    assert 'aria-label="Attempts per hour, last 24 h: 0 succeeded, 1 failed"' in first
    assert "Queue depth" in html and "Live workers" in html
    assert failing["id"] in first and healthy["id"] in second


def test_the_oldest_due_delivery_shows_how_long_it_has_waited(app, client, auth, producer, receiver, users, clock):
    producer.subscribe(receiver.url + "/status/200")
    producer.publish()  # due now; no worker takes it
    clock.advance(minutes=3)
    auth.login("member")
    html = client.get("/", headers={"HX-Request": "true"}).get_data(as_text=True)
    assert re.search(r"Oldest due delivery waited</dt><dd>3 min</dd>", html)
    assert "1 pending" in _rows(html)[0]
    assert "Queue depth" not in html  # every team's queue together is not one team's to read


@pytest.mark.postgres
def test_each_backlog_figure_is_read_from_an_index_alone(app, producer, receiver, clock, database_url):
    """Counted over the index of every delivery ever made, the backlog was most of the overview at 500,000
    deliveries and the oldest due one took a filter over every due row. ix_deliveries_owed holds the owed rows
    alone, with (subscription, state, next attempt): each figure is one range or one entry of it (at this
    size the planner may take the bigger index for a count; at the bench's, it takes this one)."""
    if not database_url.startswith("postgresql"):
        pytest.skip("a PostgreSQL planner question")
    sub = producer.subscribe(receiver.url + "/status/200")
    for _ in range(4):
        ingest_many(producer.team, [EventInput(type="file.updated", data={"n": n}) for n in range(500)])
    # The bench's shape: most delivered, a fifth dead, a twentieth waiting for a retry.
    db.session.execute(text(
        "UPDATE deliveries SET state = CASE WHEN n % 5 = 0 THEN 'dead' WHEN n % 20 = 1 THEN 'scheduled' "
        "ELSE 'succeeded' END, next_attempt_at = CASE WHEN n % 20 = 1 THEN next_attempt_at END "
        "FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM deliveries) AS numbered "
        "WHERE deliveries.id = numbered.id"))
    db.session.commit()
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql("VACUUM (ANALYZE) deliveries")  # as autovacuum keeps a table
    query = overview_figures._backlog([sub["id"]], clock.now()).compile(
        dialect=db.engine.dialect).construct_expanded_state({})
    plan = "\n".join(db.session.connection().exec_driver_sql("EXPLAIN " + query.statement, query.parameters).scalars())
    db.session.rollback()
    scans = [line.strip() for line in plan.splitlines() if " on deliveries" in line]
    assert len(scans) == len(DeliveryState.OWED) + len(DeliveryState.DUE), plan
    # Every figure is read from an index alone: no table rows, no rows read and then filtered out.
    assert all(scan.startswith("->  Index Only Scan") for scan in scans) and "Filter:" not in plan, plan
