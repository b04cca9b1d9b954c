"""The overview: worst subscription first, with its health figures, a sparkline and the queue above."""

from __future__ import annotations

import re

from .support import pipeline


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
