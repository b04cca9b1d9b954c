"""The consumers quota, the subscriptions-per-consumer quota and PUT's idempotency under concurrency: requests
fired at once at a real server, on both databases."""

from __future__ import annotations

from sqlalchemy import func, select

from dashboard.app import create_app
from dashboard.core.extensions import db
from dashboard.ingest import quotas
from dashboard.models import AuditEntry, Consumer, Subscription

from tests.support.served import at_once, send, served

SYSTEM = ("system", "test")


def count(model, *where) -> int:
    db.session.expire_all()
    return db.session.scalar(select(func.count()).select_from(model).where(*where))


def test_concurrent_puts_of_one_uid_make_one_consumer(config, producer):
    with served(create_app(config)) as url:
        answers = at_once([lambda: send("PUT", url + "/api/v1/consumers/cus_1", producer.token, {"name": "One"})
                           for _ in range(10)])
    assert sorted(answers) == [200] * 9 + [201]
    assert count(Consumer, Consumer.deleted_at.is_(None)) == 1
    assert count(AuditEntry, AuditEntry.action == "consumer.created") == 1


def test_concurrent_creations_take_the_last_consumer_slot_and_the_last_endpoint_slot_once(config, producer,
                                                                                          receiver):
    quotas.set_override(producer.team, "consumers", 3, actor=SYSTEM)
    quotas.set_override(producer.team, "subscriptions_per_consumer", 2, actor=SYSTEM)
    producer.put_consumer("cus_a")
    producer.put_consumer("cus_b")
    producer.subscribe(receiver.url + "/a/0", consumer="cus_a")
    with served(create_app(config)) as url:
        consumers = at_once([lambda n=n: send("PUT", f"{url}/api/v1/consumers/race_{n}", producer.token)
                             for n in range(10)])
        endpoints = at_once([lambda n=n: send("POST", url + "/api/v1/subscriptions", producer.token,
                                               {"url": f"{receiver.url}/a/{n + 1}", "consumer": "cus_a"})
                             for n in range(10)])
    assert sorted(consumers) == [201] + [409] * 9
    assert sorted(endpoints) == [201] + [409] * 9
    assert count(Consumer, Consumer.team_id == producer.team.id, Consumer.deleted_at.is_(None)) == 3
    assert count(Subscription, Subscription.deleted_at.is_(None)) == 2
