"""What can be done to a consumer, shared by the JSON API and the dashboard."""

from __future__ import annotations

from flask import current_app
from sqlalchemy import func, select, update

from dashboard import audit
from dashboard.consumers import portal
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError, compact_json, refuse_nul
from dashboard.ingest import quotas
from dashboard.models import (
    Consumer,
    ConsumerState,
    Delivery,
    DeliveryState,
    Subscription,
    SubscriptionState,
    Team,
    deliveries_locked,
)
from dashboard.queue.handoff import enqueue_after_commit
from dashboard.queue.work import work_item
from dashboard.schemas import MAX_CONSUMER_METADATA_BYTES, ConsumerInput

# Above every character a uid may hold ('z' is the highest): uid >= p AND uid < p + this is "starts with p",
# an index range in byte order (the column is "C" on PostgreSQL, BINARY on SQLite).
_PAST_UID_CHARACTERS = "\x7f"


def team_consumer(team: Team, uid: str) -> Consumer:
    """The team's live consumer with this uid; 404 naming it otherwise (another team's is not found either)."""
    consumer = db.session.scalar(select(Consumer).where(Consumer.team_id == team.id, Consumer.uid == uid,
                                                        Consumer.deleted_at.is_(None)))
    if consumer is None:
        raise ApiError(404, f"no consumer {uid!r} in your team")
    return consumer


def addressed(team_id: int, uid: str | None, what: str = "consumer") -> Consumer | None:
    """The consumer a request names by uid, for a subscription or a replay: 422 naming an unknown uid."""
    if uid is None:
        return None
    consumer = db.session.scalar(select(Consumer).where(Consumer.team_id == team_id, Consumer.uid == uid,
                                                        Consumer.deleted_at.is_(None)))
    if consumer is None:
        raise ApiError(422, f"{what}: your team has no consumer {uid!r} (create it with PUT /api/v1/consumers/{uid})")
    return consumer


def _checked_metadata(metadata: dict | None) -> dict | None:
    if metadata is None:
        return None
    text = compact_json(metadata, "metadata")
    if "\\u0000" in text:
        refuse_nul(metadata, "metadata")
    size = len(text.encode("utf-8"))
    if size > MAX_CONSUMER_METADATA_BYTES:
        raise ApiError(413, f"metadata is {size} bytes; the cap is {MAX_CONSUMER_METADATA_BYTES} bytes")
    return metadata


def upsert(team: Team, uid: str, body: ConsumerInput) -> tuple[Consumer, bool]:
    """Create the consumer, or change the fields given: idempotent. Returns it and whether it was created."""
    metadata = _checked_metadata(body.metadata) if "metadata" in body.model_fields_set else None
    if body.name is not None and "\x00" in body.name:
        raise ApiError(422, "name must not contain NUL characters")
    now = current_app.config["CLOCK"].now()
    consumer = db.session.scalar(select(Consumer).where(Consumer.team_id == team.id, Consumer.uid == uid,
                                                        Consumer.deleted_at.is_(None)))
    if consumer is None:
        quotas.check_consumer_room(team)  # holds the team's row: two PUTs of one uid count one after another
        consumer = db.session.scalar(select(Consumer).where(Consumer.team_id == team.id, Consumer.uid == uid,
                                                            Consumer.deleted_at.is_(None)))
    if consumer is None:
        consumer = Consumer(team_id=team.id, uid=uid, name=body.name or "", meta=metadata,
                            state=body.state or ConsumerState.ACTIVE, created_at=now, updated_at=now)
        db.session.add(consumer)
        db.session.flush()
        audit.record("consumer.created", team_id=team.id, target=f"consumer:{uid}",
                     detail={"name": consumer.name} if consumer.name else None)
        db.session.commit()
        return consumer, True
    changed = {}
    if body.name is not None and body.name != consumer.name:
        changed["name"] = (consumer.name, body.name)
        consumer.name = body.name
    if "metadata" in body.model_fields_set and metadata != consumer.meta:
        changed["metadata"] = (None, None)  # the producer's own data: not copied into the log
        consumer.meta = metadata
    if changed:
        consumer.updated_at = now
        audit.record("consumer.edited", team_id=team.id, target=f"consumer:{uid}",
                     detail={"changed": sorted(changed), **({"name": changed["name"][1]} if "name" in changed else {})})
    if body.state is not None and body.state != consumer.state:
        set_state(consumer, body.state)  # commits the edit with it
    db.session.commit()
    return consumer, False


def set_state(consumer: Consumer, state: str, reason: str | None = None) -> int:
    """Disable (its waiting deliveries held, new ones held) or enable (held ones released, unless their own
    subscription is paused or disabled). Returns how many deliveries were held or released."""
    now = current_app.config["CLOCK"].now()
    subs = select(Subscription.id).where(Subscription.consumer_id == consumer.id).scalar_subquery()
    consumer.state, consumer.updated_at = state, now
    released = []
    if state == ConsumerState.DISABLED:
        consumer.state_reason = reason or None
        portal.revoke(consumer, "disabled")
        # As pausing a subscription holds: one in flight finishes, and is held if it fails (engine).
        count = db.session.execute(
            update(Delivery).where(Delivery.id.in_(deliveries_locked(
                Delivery.subscription_id.in_(subs), Delivery.state.in_(DeliveryState.DUE),
                (Delivery.lease_expires_at.is_(None)) | (Delivery.lease_expires_at < now))))
            .values(state=DeliveryState.HELD, updated_at=now).execution_options(synchronize_session=False)).rowcount
    else:
        consumer.state_reason = None
        released = _release_held(consumer, now)
        count = len(released)
    audit.record("consumer.disabled" if state == ConsumerState.DISABLED else "consumer.enabled",
                 team_id=consumer.team_id, target=f"consumer:{consumer.uid}", deliveries=count,
                 detail={"reason": reason} if reason else None)
    enqueue_after_commit([work_item(sub_id, delivery_id) for sub_id, delivery_id in released])
    db.session.commit()
    return count


def _release_held(consumer: Consumer, now) -> list[tuple[str, str]]:
    """Held deliveries of the consumer's active subscriptions become due now; (subscription id, delivery id) of
    each, to enqueue after the commit. A paused or disabled subscription keeps its own."""
    active = select(Subscription.id).where(Subscription.consumer_id == consumer.id,
                                           Subscription.state == SubscriptionState.ACTIVE).scalar_subquery()
    return [tuple(row) for row in db.session.execute(
        update(Delivery).where(Delivery.id.in_(deliveries_locked(Delivery.subscription_id.in_(active),
                                                                 Delivery.state == DeliveryState.HELD)))
        .values(state=DeliveryState.PENDING, next_attempt_at=now, updated_at=now)
        .returning(Delivery.subscription_id, Delivery.id).execution_options(synchronize_session=False)).all()]


def delete(consumer: Consumer) -> int:
    """Soft delete: out of routing (its uid then names no consumer, and may name a new one), its subscriptions
    deleted with it. Nothing already accepted is held back: waiting deliveries go on, and those held by the
    consumer or a pause are released (a subscription disabled for cause keeps its own). Returns how many."""
    now = current_app.config["CLOCK"].now()
    consumer.deleted_at, consumer.updated_at = now, now
    consumer.state, consumer.state_reason = ConsumerState.ACTIVE, None
    db.session.execute(update(Subscription).where(Subscription.consumer_id == consumer.id,
                                                  Subscription.state == SubscriptionState.PAUSED)
                       .values(state=SubscriptionState.ACTIVE, state_reason=None)
                       .execution_options(synchronize_session=False))
    released = _release_held(consumer, now)
    portal.revoke(consumer, "deleted")
    subscriptions = db.session.execute(
        update(Subscription).where(Subscription.consumer_id == consumer.id, Subscription.deleted_at.is_(None))
        .values(deleted_at=now).execution_options(synchronize_session=False)).rowcount
    audit.record("consumer.deleted", team_id=consumer.team_id, target=f"consumer:{consumer.uid}",
                 deliveries=len(released), detail={"subscriptions": subscriptions})
    enqueue_after_commit([work_item(sub_id, delivery_id) for sub_id, delivery_id in released])
    db.session.commit()
    db.session.expire_all()
    return len(released)


def page(team: Team, prefix: str | None, limit: int, after: str | None) -> tuple[list[Consumer], str | None]:
    """The team's live consumers by uid, those starting with `prefix` (an index range), after `after`."""
    query = select(Consumer).where(Consumer.team_id == team.id, Consumer.deleted_at.is_(None))
    if prefix:
        query = query.where(Consumer.uid >= prefix, Consumer.uid < prefix + _PAST_UID_CHARACTERS)
    return _uid_page(query, limit, after)


def _uid_page(query, limit: int, after: str | None) -> tuple[list[Consumer], str | None]:
    """A page of `query`'s consumers in uid order after `after`, and the next page's cursor (None on the last)."""
    if after:
        query = query.where(Consumer.uid > after)
    rows = db.session.scalars(query.order_by(Consumer.uid).limit(limit + 1)).all()
    shown = rows[:limit]
    return shown, shown[-1].uid if len(rows) > limit else None


def subscription_counts(consumer_ids: list[int]) -> dict[int, int]:
    """Live subscriptions per consumer, for a page of them, in one query."""
    if not consumer_ids:
        return {}
    return dict(db.session.execute(
        select(Subscription.consumer_id, func.count()).where(Subscription.consumer_id.in_(consumer_ids),
                                                             Subscription.deleted_at.is_(None))
        .group_by(Subscription.consumer_id)).all())


def ids_named(team_id: int, uid: str):
    """The ids of every consumer this team has given this uid, deleted ones too (a subquery): the filters of the
    dead-letter desk, the events page and the audit log follow the uid, as the log's "consumer:<uid>" does."""
    return select(Consumer.id).where(Consumer.team_id == team_id, Consumer.uid == uid).scalar_subquery()


def endpoints_of(team_id: int, consumer_ids: list[int]) -> list[Subscription]:
    """The live subscriptions of these consumers of the team (a page of them), by URL: a range of
    ix_subscriptions_team_consumer per consumer."""
    if not consumer_ids:
        return []
    return db.session.scalars(select(Subscription).where(Subscription.team_id == team_id,
                                                         Subscription.consumer_id.in_(consumer_ids),
                                                         Subscription.deleted_at.is_(None))
                              .order_by(Subscription.url, Subscription.id)).all()


def search_page(team: Team, search: str, limit: int, after: str | None) -> tuple[list[Consumer], str | None]:
    """The dashboard's search, in uid order after `after`: the team's live consumers whose uid starts with
    `search` (an index range), or, when no uid does, those whose name contains it (any case; names have no
    index, so that reads the team's consumers). Never both: "uid starts with OR name contains" would read every
    consumer of the team for a uid prefix too."""
    live = select(Consumer).where(Consumer.team_id == team.id, Consumer.deleted_at.is_(None))
    by_uid = live.where(Consumer.uid >= search, Consumer.uid < search + _PAST_UID_CHARACTERS)
    any_uid = db.session.scalar(by_uid.with_only_columns(Consumer.id).limit(1)) is not None
    query = by_uid if any_uid else live.where(func.lower(Consumer.name).contains(search.lower(), autoescape=True))
    return _uid_page(query, limit, after)
