"""The subscriptions quota and the test-event window under concurrency: requests fired at once at a real
server, on both databases, get exactly the limit through."""

from __future__ import annotations

from sqlalchemy import func, select

from dashboard.app import create_app
from dashboard.core.extensions import db
from dashboard.ingest import quotas
from dashboard.models import AuditEntry, Delivery, Subscription

from tests.support.served import at_once, send, served


def test_concurrent_requests_take_the_last_subscription_slot_and_the_test_event_window_once(
        config, producer, receiver):
    quotas.set_override(producer.team, "subscriptions", 3, actor=("system", "test"))
    tested = producer.subscribe(receiver.url + "/a")
    producer.subscribe(receiver.url + "/b")
    with served(create_app(config)) as url:
        created = at_once([lambda n=n: send("POST", url + "/api/v1/subscriptions", producer.token,
                                             {"url": f"{receiver.url}/race/{n}"}) for n in range(10)])
        test_events = at_once([lambda: send("POST", f"{url}/api/v1/subscriptions/{tested['id']}/test", producer.token)
                               for _ in range(10)])

    assert sorted(created) == [201] + [409] * 9  # one slot was left
    assert sorted(test_events) == [202] + [429] * 9  # one test event per test_event_seconds
    db.session.expire_all()
    assert db.session.scalar(select(func.count()).select_from(Subscription).where(
        Subscription.team_id == producer.team.id, Subscription.deleted_at.is_(None))) == 3
    assert db.session.scalar(select(func.count()).select_from(AuditEntry).where(
        AuditEntry.action == "subscription.test_sent")) == 1
    assert db.session.scalar(select(func.count()).select_from(Delivery)) == 1
