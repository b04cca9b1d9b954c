"""The overview: worst subscription first, with its health figures, a sparkline and the queue above."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import select, text

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
@pytest.mark.planner
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


def outage_with_an_incident(app, client, auth, producer, receiver, clock, deliver=pipeline.deliver_due):
    """Two endpoints during an outage: one failing for minutes with 10 attempts and nothing given up yet;
    one whose 20 deliveries an operator gave up on (20 dead letters, an open incident), answering again now.
    `deliver`: the browser tests' own, which runs the engine beside Playwright's event loop."""
    from dashboard.operations import incidents

    failing = producer.subscribe(receiver.url + "/status/500", event_types=["a.happened"], description="failing")
    given_up = producer.subscribe(receiver.url + "/flaky/20", event_types=["b.happened"], description="given-up")
    for _ in range(10):
        producer.publish("a.happened")
    for _ in range(20):
        producer.publish("b.happened")
    deliver(app, clock)
    auth.login("operator")
    assert client.post(f"/subscriptions/{given_up['id']}/give-up",
                       data={"csrf_token": auth.csrf()}).status_code == 302
    incidents.check_rules(clock.now())
    producer.publish("b.happened")  # the 21st request: the receiver answers again
    deliver(app, clock)
    clock.advance(minutes=2)
    return failing, given_up


def test_an_endpoint_with_dead_letters_and_an_open_incident_ranks_above_one_only_failing(
        app, client, auth, producer, receiver, users, clock):
    failing, given_up = outage_with_an_incident(app, client, auth, producer, receiver, clock)
    rows = _rows(client.get("/").get_data(as_text=True))
    assert [given_up["id"] in rows[0], failing["id"] in rows[1]] == [True, True]


def test_a_row_links_to_its_open_incident(app, client, auth, producer, receiver, users, clock):
    from dashboard.models import Incident

    failing, given_up = outage_with_an_incident(app, client, auth, producer, receiver, clock)
    incident = db.session.scalar(select(Incident).where(Incident.subscription_id == given_up["id"]))
    rows = _rows(client.get("/").get_data(as_text=True))
    row = next(r for r in rows if given_up["id"] in r)
    assert f'href="/incidents/{incident.id}"' in row and "open incident" in row
    assert "incident" not in next(r for r in rows if failing["id"] in r)


def test_a_recovered_endpoint_whose_every_event_was_delivered_is_not_red(
        app, client, auth, producer, receiver, users, clock):
    sub = producer.subscribe(receiver.url + "/flaky/16")
    for _ in range(5):
        producer.publish()
    for _ in range(6):  # 5 failures, 5, 5, then 1 and 4 successes, then the last success: 5 of 21 attempts
        pipeline.deliver_due(app, clock)
        clock.advance(hours=1)
    assert receiver.count() == 21
    auth.login("oncall")
    [row] = _rows(client.get("/").get_data(as_text=True))
    assert sub["id"] in row
    assert "100 % of events delivered" in row and "23.8 % of attempts succeeded" in row
    assert 'class="bad"' not in row


def test_a_failed_test_event_leaves_the_health_figures_alone(app, client, auth, producer, receiver, users, clock):
    sub = producer.subscribe(receiver.url + "/flaky/1")  # the test event's request fails, later ones succeed
    auth.login("owner")
    assert client.post(f"/subscriptions/{sub['id']}/test", data={"csrf_token": auth.csrf()}).status_code in (200, 302)
    pipeline.deliver_due(app, clock)
    for _ in range(3):
        producer.publish()
    pipeline.deliver_due(app, clock)
    assert receiver.count() == 4
    [row] = _rows(client.get("/").get_data(as_text=True))
    assert "100 % of attempts succeeded" in row and "3 attempts" in row and "100 % of events delivered" in row
    assert 'class="bad"' not in row and 'data-label="Failing since">—</td>' in row
    chart = client.get(f"/subscriptions/{sub['id']}").get_data(as_text=True)
    assert "<title>Succeeded: 3</title>" in chart and "<title>Failed:" not in chart  # the subscription's chart too
