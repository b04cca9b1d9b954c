"""What can be done to a subscription, shared by the JSON API and the dashboard."""

from __future__ import annotations

from flask import current_app
from promesa_receiver import signing
from sqlalchemy import case, func, or_, select, update
from sqlalchemy.orm import selectinload

from dashboard import audit
from dashboard.consumers import service as consumers
from dashboard.core import crypto, filters, paging
from dashboard.core.extensions import db
from dashboard.core.ids import new_ids
from dashboard.core.validation import ApiError
from dashboard.delivery import pull
from dashboard.delivery.targets import url_problem
from dashboard.ingest import quotas
from dashboard.ingest.accept import ingest_many
from dashboard.models import (
    TEST_EVENT_TYPE,
    Consumer,
    Delivery,
    DeliveryState,
    Event,
    Subscription,
    SubscriptionMode,
    SubscriptionState,
    Team,
    deliveries_locked,
    delivering_state,
    held_values,
)
from dashboard.queue.handoff import enqueue_after_commit
from dashboard.queue.work import work_item
from dashboard.schemas import EventInput, SubscriptionEdit, SubscriptionInput
from dashboard.stats import outcomes
from dashboard.subscriptions import checks, client_auth, client_tls, own_headers, pull_keys


def create(team: Team, body: SubscriptionInput) -> tuple[Subscription, str]:
    """Validated by the model, checked for a deliverable URL, stored once: nothing half-way.
    Returns the subscription and its secret."""
    if body.listen and body.mode != SubscriptionMode.PULL:
        raise ApiError(422, 'listen: only a pull subscription ("mode": "pull") can be a listen session: '
                            "`promesa-receiver listen` pulls its deliveries")
    pull.check_mode(body)
    problem = body.url and url_problem(body.url, current_app.config["PROMESA_ALLOW_PRIVATE_TARGETS"])
    if problem:
        raise ApiError(422, problem)
    consumer = consumers.addressed(team.id, body.consumer)
    quotas.check_subscription_room(team, consumer)
    headers = own_headers.checked(dict(body.headers))
    tls = client_tls.checked(body.tls.model_dump(), current_app.config["CLOCK"].now()) if body.tls else None
    auth = client_auth.checked(body.auth.model_dump() if body.auth else None, headers)
    secret = signing.new_secret()
    sub = Subscription(team_id=team.id, consumer_id=consumer.id if consumer else None, url=body.url, event_types=list(body.event_types),
                       event_versions=dict(body.event_versions), retry_policy=body.retry_policy,
                       signature_scheme=body.signature_scheme, description=body.description,
                       connect_timeout=body.connect_timeout, attempt_timeout=body.attempt_timeout,
                       max_age_seconds=body.max_age_seconds, rate_limit_per_s=body.rate_limit_per_s,
                       max_in_flight=body.max_in_flight, secret_ciphertext=crypto.encrypt(secret),
                       filter=filters.checked(body.filter), headers_ciphertext=own_headers.ciphertext(headers),
                       auth_ciphertext=client_auth.ciphertext(auth), state=SubscriptionState.ACTIVE,
                       mode=body.mode, listen_seen_at=current_app.config["CLOCK"].now() if body.listen else None)
    client_tls.apply(sub, tls)
    # A pull subscription's own key, shown once with its secret.
    sub.new_pull_key = pull_keys.issue(sub) if sub.mode == SubscriptionMode.PULL else None
    db.session.add(sub)
    db.session.flush()  # its id, for the audit entry
    audit.record("subscription.created", subscription=sub,
                 detail=({"url": sub.url} if sub.url else {"mode": sub.mode})
                 | ({"listen": True} if sub.listen else {})
                 | ({"consumer": consumer.uid} if consumer else {})
                 | ({"filter": sub.filter} if sub.filter is not None else {})
                 | ({"headers": own_headers.masked(headers)} if headers else {})
                 | ({"auth": client_auth.masked(auth)} if auth else {})
                 | ({"tls": tls.view()} if tls else {}))
    db.session.commit()
    return sub, secret


def not_deleted(sub: Subscription) -> Subscription:
    if sub.deleted_at is not None:
        raise ApiError(409, "this subscription is deleted: its history stays readable, nothing else changes")
    return sub


def edit(sub: Subscription, body: SubscriptionEdit) -> dict:
    """Change what the owner may change (the fields given); the audit log keeps before and after of each
    changed field (secrets are not fields here: they change by rotation only). Returns {field: (before, after)}."""
    not_deleted(sub)
    values = {name: getattr(body, name) for name in body.model_fields_set}
    if sub.mode == SubscriptionMode.PULL:
        pull.refuse_push_settings(values)
    if "url" in values and values["url"] != sub.url:  # checked as at creation
        problem = url_problem(values["url"], current_app.config["PROMESA_ALLOW_PRIVATE_TARGETS"])
        if problem:
            raise ApiError(422, problem)
    for name in ("event_types", "event_versions"):
        if name in values:
            values[name] = (list if name == "event_types" else dict)(values[name])
    if "filter" in values:  # null clears it
        values["filter"] = filters.checked(values["filter"])
    # Own headers merge into the stored ones, and stay encrypted: the audit log sees names only.
    before = own_headers.stored(sub) if "headers" in values else None
    after = own_headers.merged(sub, values.pop("headers")) if "headers" in values else None
    # A client certificate is replaced whole (or removed), and stays encrypted: the audit log sees what reads show.
    tls_given, tls = "tls" in values, values.pop("tls", None)
    tls_changed = client_tls.edited(sub, tls and tls.model_dump(), current_app.config["CLOCK"].now()) \
        if tls_given else None
    # OAuth2 client credentials are replaced whole (a missing secret kept), encrypted, audited masked.
    auth = client_auth.edited(sub, values.pop("auth", client_auth.UNCHANGED), after)
    changed = {name: (getattr(sub, name), value) for name, value in values.items() if getattr(sub, name) != value}
    for name, (_, value) in changed.items():
        setattr(sub, name, value)
    if after is not None and after != before:
        sub.headers_ciphertext = own_headers.ciphertext(after)
        changed["headers"] = own_headers.audit_view(before, after)
    if tls_changed is not None:
        changed["tls"] = tls_changed
    if auth is not None:
        sub.auth_ciphertext = client_auth.ciphertext(auth[1])
        changed["auth"] = client_auth.audit_view(*auth)
    if changed:
        sub.updated_at = current_app.config["CLOCK"].now()
        audit.record("subscription.edited", subscription=sub, detail={
            "before": {k: before for k, (before, _) in changed.items()},
            "after": {k: after for k, (_, after) in changed.items()}})
        db.session.commit()
    return changed


def delete(sub: Subscription, *, actor: tuple[str, str] | None = None, reason: str | None = None) -> int:
    """Soft delete: out of routing and the API's list, nothing more attempted, history kept.
    Waiting deliveries (in flight ones too: their lease is taken back) end cancelled. Returns how many.
    `actor` and `reason`: who deletes it, and why, when it is not the caller of a request (the sweeper)."""
    not_deleted(sub)
    now = current_app.config["CLOCK"].now()
    sub.deleted_at = now
    # Disabled too: anything that still reaches a worker (an ingest racing this) is held, never sent.
    sub.state = SubscriptionState.DISABLED
    sub.state_reason = "deleted"
    sub.previous_secret_ciphertext = sub.previous_secret_expires_at = None
    cancelled = cancel_waiting([sub.id], now)
    checks.stop_running(sub, "its subscription was deleted")
    audit.record("subscription.deleted", subscription=sub, deliveries=cancelled, actor=actor,
                 detail={"url": sub.url} | ({"reason": reason} if reason else {}))
    db.session.commit()
    return cancelled


def cancel_waiting(subscription_ids: list[str], now) -> int:
    """Waiting deliveries of these subscriptions end cancelled. Clearing the lease makes a worker's
    record of an attempt already in flight leave the state alone (it settles by lease token)."""
    return db.session.execute(
        update(Delivery).where(Delivery.id.in_(deliveries_locked(Delivery.subscription_id.in_(subscription_ids),
                                                                 Delivery.state.in_(DeliveryState.WAITING))))
        .values(state=DeliveryState.CANCELLED, next_attempt_at=None, updated_at=now,
                lease_token=None, lease_expires_at=None)
        .execution_options(synchronize_session=False)).rowcount


REASON_LENGTH = 500


def checked_reason(reason: str | None, required: bool, what: str) -> str:
    """A pause's or disable's reason, stripped; 400 when required and empty, or too long."""
    reason = (reason or "").strip()
    if required and not reason:
        raise ApiError(400, f"a reason is required to {what} a subscription")
    if len(reason) > REASON_LENGTH:
        raise ApiError(400, f"the reason must be at most {REASON_LENGTH} characters")
    return reason


def pause(sub: Subscription, reason: str | None = None) -> int:
    """Deliveries keep accumulating (held); nothing is dropped. The reason, if any, is shown on the
    subscription's page and kept in the audit log. Returns how many waiting ones were held."""
    not_deleted(sub)
    reason = checked_reason(reason, False, "pause") or None
    held = hold(sub, SubscriptionState.PAUSED, reason, "subscription.paused")
    db.session.commit()
    return held


def disable(sub: Subscription, reason: str) -> int:
    """A stronger pause: held the same way, but it takes a reason, shown to everyone on the subscription's
    page, and on the dashboard only `enable` (not resume) ends it. The engine disables on 410 Gone."""
    not_deleted(sub)
    held = hold(sub, SubscriptionState.DISABLED, checked_reason(reason, True, "disable"), "subscription.disabled")
    checks.stop_running(sub, "its subscription was disabled")
    db.session.commit()
    return held


def hold(sub: Subscription, state: str, reason: str, action: str, *, actor: tuple[str, str] | None = None,
         target: str | None = None, detail: dict | None = None) -> int:
    """Out of delivery (paused or disabled) for `reason`, its waiting deliveries held, audited as `action`
    (detail: the reason, unless given). Returns how many were held; the caller commits."""
    for name, value in held_values(state, reason).items():
        setattr(sub, name, value)
    held = hold_waiting(sub)
    audit.record(action, subscription=sub, target=target, deliveries=held, actor=actor,
                 detail=({"reason": reason} if reason else None) if detail is None else detail)
    return held


def hold_waiting(sub: Subscription) -> int:
    """Waiting deliveries show as held at once (pause, disable); one already in flight finishes, and
    is held if it fails. Returns how many were held; the caller commits."""
    now = current_app.config["CLOCK"].now()
    return db.session.execute(
        update(Delivery).where(Delivery.id.in_(deliveries_locked(
            Delivery.subscription_id == sub.id, Delivery.state.in_(DeliveryState.DUE),
            or_(Delivery.lease_expires_at.is_(None), Delivery.lease_expires_at < now))))
        .values(state=DeliveryState.HELD, updated_at=now).execution_options(synchronize_session=False)).rowcount


def resume(sub: Subscription) -> int:
    """Active again: every held delivery becomes due now. Returns how many were released."""
    return _release(sub, "subscription.resumed")


def enable(sub: Subscription) -> int:
    """End a disable (ours or the engine's on 410 Gone): the same as resume, recorded as an enable."""
    return _release(sub, "subscription.enabled", {"was": sub.state_reason} if sub.state_reason else None)


def _release(sub: Subscription, action: str, detail: dict | None = None) -> int:
    not_deleted(sub)
    now = current_app.config["CLOCK"].now()
    sub.state = SubscriptionState.ACTIVE
    sub.state_reason = None
    ids = db.session.scalars(
        update(Delivery).where(Delivery.id.in_(deliveries_locked(Delivery.subscription_id == sub.id,
                                                                 Delivery.state == DeliveryState.HELD)))
        .values(state=DeliveryState.PENDING, next_attempt_at=now, updated_at=now)
        .returning(Delivery.id).execution_options(synchronize_session=False)).all()
    audit.record(action, subscription=sub, deliveries=len(ids), detail=detail)
    enqueue_after_commit([work_item(sub.id, i) for i in ids])
    db.session.commit()
    return len(ids)


def send_test_event(sub: Subscription) -> tuple[str, str]:
    """A `promesa.test` event to this one endpoint through the real pipeline, whatever its type filter
    and the team's strict catalog say. Returns (event id, delivery id)."""
    not_deleted(sub)
    if sub.state != SubscriptionState.ACTIVE:
        raise ApiError(409, f"this subscription is {sub.state}: a test event would be held; resume it first")
    quotas.check_test_event(sub)  # holds the subscription's row until ingest's commit below
    event_id = new_ids("evt", 1)[0]
    # Recorded first: ingest's commit writes it with the event, and a refused event leaves no entry.
    audit.record("subscription.test_sent", subscription=sub, detail={"event_id": event_id})
    # Built, not validated: the type is one of Promesa's own, which producers' events may not use.
    ingest_many(sub.team, [EventInput.model_construct(id=event_id, type=TEST_EVENT_TYPE,
                                                      data={"subscription_id": sub.id, "test": True})],
                numbered=False, only=(sub.id, True))
    return event_id, db.session.scalar(select(Delivery.id).join(Event, Event.key == Delivery.event_key)
                                       .where(Event.team_id == sub.team_id, Event.id == event_id))


# Named deliveries may be re-sent whether they died or succeeded (a receiver that lost its data);
# "replay all" means the dead letters.
RESENDABLE = (DeliveryState.DEAD, DeliveryState.SUCCEEDED)


def restart(*where, replay_id: str | None = None) -> list[tuple[str, str, str]]:
    """The mechanics of every replay: send the deliveries matching `where` again with a fresh retry
    schedule (the event id and body stay the same). Each becomes pending, or held while its
    subscription (or its consumer) is paused or disabled. `replay_id` names the bulk replay doing it (None: a direct one).
    Returns (subscription id, delivery id, new state) of each; those now pending go to the workers when the
    caller commits."""
    now = current_app.config["CLOCK"].now()
    subscriptions, consumers = Subscription.__table__, Consumer.__table__
    subscription_state = select(delivering_state(subscriptions, consumers)) \
        .select_from(subscriptions.outerjoin(consumers, subscriptions.c.consumer_id == consumers.c.id)) \
        .where(subscriptions.c.id == Delivery.subscription_id).scalar_subquery()
    target = case((subscription_state == SubscriptionState.ACTIVE, DeliveryState.PENDING), else_=DeliveryState.HELD)
    # A deleted subscription's dead letters stay as they are: nothing more is sent to it, even by a bulk replay.
    not_deleted_subscription = select(Subscription.deleted_at).where(Subscription.id == Delivery.subscription_id) \
        .scalar_subquery().is_(None)
    rows = db.session.execute(
        update(Delivery).where(*where, not_deleted_subscription)
        .values(state=target, next_attempt_at=now, updated_at=now, retry_base=Delivery.attempt_count,
                schedule_started_at=now, replay_id=replay_id,
                dead_lettered_at=None, succeeded_at=None, lease_token=None, lease_expires_at=None)
        .returning(Delivery.subscription_id, Delivery.id, Delivery.state)
        .execution_options(synchronize_session=False)).all()
    enqueue_after_commit([work_item(sub_id, delivery_id) for sub_id, delivery_id, state in rows
                          if state == DeliveryState.PENDING])
    return [tuple(r) for r in rows]


def replay(sub: Subscription, delivery_ids: list[str] | None = None) -> int:
    """Send again, with a fresh retry schedule: named deliveries (dead or succeeded), or every dead letter."""
    not_deleted(sub)
    states = RESENDABLE if delivery_ids is not None else (DeliveryState.DEAD,)
    where = [Delivery.subscription_id == sub.id, Delivery.state.in_(states)]
    if delivery_ids is not None:
        where.append(Delivery.id.in_(delivery_ids))
    restarted = restart(*where)
    audit.record("deliveries.replayed", subscription=sub, deliveries=len(restarted),
                 detail={"delivery_ids": delivery_ids[:20]} if delivery_ids else {"which": "all dead letters"})
    db.session.commit()
    return len(restarted)


def give_up(sub: Subscription, delivery_ids: list[str] | None = None) -> int:
    """"Give up now": scheduled deliveries (the named ones, or all of the subscription's) become dead
    letters at once instead of waiting out a hopeless retry schedule. One in flight is left to finish.
    Counted as dead letters of this minute, audited with the count; returns how many."""
    not_deleted(sub)
    now = current_app.config["CLOCK"].now()
    where = [Delivery.subscription_id == sub.id, Delivery.state == DeliveryState.SCHEDULED,
             or_(Delivery.lease_expires_at.is_(None), Delivery.lease_expires_at < now)]
    if delivery_ids is not None:
        where.append(Delivery.id.in_(delivery_ids))
    tests = db.session.scalar(select(func.count()).select_from(Delivery).join(Event, Event.key == Delivery.event_key)
                              .where(*where, Event.type == TEST_EVENT_TYPE))  # test events count in no figure
    given_up = db.session.execute(
        update(Delivery).where(*where)
        .values(state=DeliveryState.DEAD, next_attempt_at=None, dead_lettered_at=now, updated_at=now)
        .execution_options(synchronize_session=False)).rowcount
    if given_up > tests:  # dead letters on the charts, in /metrics and for the incident rules, as when a schedule ends
        outcomes.add(db.session.connection(), {(sub.id, outcomes.minute_of(now)): [0, 0, given_up - tests, 0]})
    audit.record("deliveries.given_up", subscription=sub, deliveries=given_up,
                 detail={"delivery_ids": delivery_ids[:20]} if delivery_ids else {"which": "all scheduled"})
    db.session.commit()
    return given_up


def deliveries_page(sub: Subscription, state: str | None, before: str | None, limit: int, *,
                    event_type: str | None = None, status_code: int | None = None, since=None,
                    until=None) -> tuple[list[Delivery], str | None]:
    """Newest first, optionally in one state, of one event type, with one last status code, or created in a time
    window (naive UTC: at or after `since`, before `until`); `before` is the previous page's next_before (ids are
    time-ordered)."""
    # Each delivery shows its event's id (API) and type (dashboard): loaded with the page in one more
    # query, not one per row, and without the bodies.
    query = select(Delivery).where(Delivery.subscription_id == sub.id) \
        .options(selectinload(Delivery.event).load_only(Event.id, Event.type))
    if state:
        query = query.where(Delivery.state == state)
    if event_type:
        query = query.join(Event, Event.key == Delivery.event_key).where(Event.type == event_type)
    if status_code is not None:
        query = query.where(Delivery.last_status_code == status_code)
    if since is not None:
        query = query.where(Delivery.created_at >= since)
    if until is not None:
        query = query.where(Delivery.created_at < until)
    return paging.by_id(query, Delivery.id, limit, before)


def team_subscription(team: Team, subscription_id: str) -> Subscription:
    """The team's subscription, deleted or not (a deleted one's history stays readable); 404 if the team
    has none with this id."""
    sub = db.session.scalar(select(Subscription).where(Subscription.id == subscription_id,
                                                       Subscription.team_id == team.id))
    if sub is None:
        raise ApiError(404, f"no subscription {subscription_id!r} in your team")
    return sub

