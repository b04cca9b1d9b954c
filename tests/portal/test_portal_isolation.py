"""A portal session sees one consumer of one team: another consumer's (of its team or another team) subscription,
delivery, event, check and replay are a 404 under every portal route that names them, and a POST changes nothing;
no dashboard route and no /api/v1 route answers a portal session; a change without the portal's CSRF token is a 400."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from dashboard.core.extensions import db
from dashboard.models import AuditEntry, Check, Delivery, Event, Replay, Subscription

from tests.portal.test_portal_pages import csrf, portal, world  # noqa: F401  (fixtures)
from tests.support.portal import link_path

# Scoping by consumer: plain SQL, which the core tests run on both databases.
pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

# Another consumer's things: cus_nbr is the same team's, cus_far another team's (tests/portal/test_portal_pages.py).
FOREIGN = ("nbr", "far")
# Each path argument of a portal route, as the Party attribute that fills it.
ARGUMENTS = {"subscription_id": "sub", "delivery_id": "delivery", "check_id": "check", "replay_id": "replay",
             "event_id": "event"}
# Portal routes whose argument names nothing of a consumer: the link's token (tests/portal/test_portal_links.py).
NOT_AN_OBJECT = {"portal.open_link"}
# A form with every field a portal button sends, naming the other consumer's delivery where one is named.
FIELDS = {"reason": "not mine", "since": "2020-01-01T00:00", "confirm": "yes", "grace_seconds": "0",
          "url": "https://example.org/hook", "event_types": "file.updated"}


def fingerprint() -> tuple:
    """Everything a portal button could change (the audit log but its refused sign-ins, which the dashboard's
    sign-in form records)."""
    db.session.expire_all()
    rows = [
        select(Subscription.id, Subscription.state, Subscription.state_reason, Subscription.url,
               Subscription.description, Subscription.secret_ciphertext, Subscription.previous_secret_ciphertext,
               Subscription.deleted_at).order_by(Subscription.id),
        select(Delivery.id, Delivery.state, Delivery.next_attempt_at, Delivery.attempt_count).order_by(Delivery.id),
        select(Replay.id, Replay.state).order_by(Replay.id),
        select(Check.id, Check.state).order_by(Check.id),
    ]
    counts = [select(func.count()).select_from(AuditEntry).where(AuditEntry.actor_kind != "anonymous"),
              select(func.count()).select_from(Event)]
    return tuple(tuple(db.session.execute(q).all()) for q in rows) + tuple(db.session.scalar(q) for q in counts)


def portal_routes(app):
    for rule in app.url_map.iter_rules():
        if not rule.endpoint.startswith("portal.") or not rule.arguments or rule.endpoint in NOT_AN_OBJECT:
            continue
        unknown = rule.arguments - ARGUMENTS.keys()
        assert not unknown, f"{rule.rule}: say in ARGUMENTS which of another consumer's ids fills {unknown}"
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            yield rule, method


def foreign_paths(app, rule, world):
    """The route with another consumer's ids; with several, also our own subscription and the other's other ids."""
    urls = app.url_map.bind("localhost")
    for name in FOREIGN:
        theirs = world[name]
        yield urls.build(rule.endpoint, {a: getattr(theirs, ARGUMENTS[a]) for a in rule.arguments})
        if "subscription_id" in rule.arguments and len(rule.arguments) > 1:
            yield urls.build(rule.endpoint, {a: getattr(world["own"] if a == "subscription_id" else theirs,
                                                         ARGUMENTS[a]) for a in rule.arguments})


def test_another_consumers_ids_are_a_404_under_every_portal_route_and_change_nothing(app, portal, world):
    token = csrf(portal)
    before = fingerprint()
    tried, wrong = 0, []
    for rule, method in portal_routes(app):
        for path in foreign_paths(app, rule, world):
            for name in FOREIGN:
                form = {"csrf_token": token, "delivery_id": world[name].delivery, **FIELDS}
                resp = portal.get(path) if method == "GET" else portal.open(path, method=method, data=form)
                tried += 1
                if resp.status_code != 404:
                    wrong.append(f"{method} {path} ({name}'s delivery_id): {resp.status_code}")
    # Our own subscription, and another consumer's delivery in the form: that delivery is not there to re-send.
    for name in FOREIGN:
        resp = portal.post(f"/portal/subscriptions/{world['own'].sub}/replay",
                           data={"csrf_token": token, "delivery_id": world[name].delivery})
        if resp.status_code != 404:
            wrong.append(f"replay of {name}'s delivery through our own subscription: {resp.status_code}")
    # Events are shown on their deliveries' pages: the portal has no page of an event, ours or another's.
    for name in ("own", *FOREIGN):
        assert portal.get(f"/portal/events/{world[name].event}").status_code == 404
    assert not wrong, "; ".join(wrong)
    assert tried >= 40
    assert fingerprint() == before

    # The same routes answer for our own ids (the paths above were built right).
    own = world["own"]
    for path in (f"/portal/subscriptions/{own.sub}", f"/portal/subscriptions/{own.sub}/contract",
                 f"/portal/deliveries/{own.delivery}", f"/portal/subscriptions/{own.sub}/checks/{own.check}",
                 f"/portal/replays/{own.replay}"):
        assert portal.get(path).status_code == 200, path


def _refused_for_want_of_a_sign_in(resp) -> bool:
    return resp.status_code == 401 or (resp.status_code == 302 and "/login" in resp.headers["Location"])


def test_no_dashboard_route_answers_a_portal_session(app, portal, world):
    """The portal's cookie is sent only to /portal; even sent everywhere, the dashboard does not read it."""
    own = world["own"]
    cookie = portal.get_cookie("promesa_portal", path="/portal")
    assert cookie is not None
    everywhere = app.test_client()
    everywhere.set_cookie("promesa_portal", cookie.value, path="/")
    values = {"subscription_id": own.sub, "delivery_id": own.delivery, "check_id": own.check,
              "replay_id": own.replay, "event_id": own.event, "team_id": own.team_id, "uid": own.uid,
              "incident_id": 1, "rule": "dead_letters", "sink_id": 1, "user_id": 1, "token_id": 1}
    urls = app.url_map.bind("localhost")
    before = fingerprint()
    wrong, tried = [], 0
    for client in (portal, everywhere):
        for rule in app.url_map.iter_rules():
            if not rule.endpoint.startswith(("pages.", "auth.")) or rule.endpoint == "pages.favicon":
                continue
            path = urls.build(rule.endpoint, {a: values[a] for a in rule.arguments})
            for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
                tried += 1
                if (rule.endpoint, method) == ("auth.login", "GET"):  # the sign-in form: nobody is signed in
                    html = client.get(path).get_data(as_text=True)
                    if 'name="password"' not in html:
                        wrong.append(f"GET {path}: not the sign-in form")
                    continue
                if method == "GET":
                    resp = client.get(path)
                else:  # a dashboard CSRF token, so that the refusal is the missing sign-in, not the token
                    token = _dashboard_csrf(client)
                    resp = client.open(path, method=method, data={"csrf_token": token, **FIELDS})
                if not _refused_for_want_of_a_sign_in(resp):
                    wrong.append(f"{method} {path}: {resp.status_code}")
    assert not wrong, "; ".join(wrong)
    assert tried > 100
    assert fingerprint() == before
    assert portal.get("/portal/").status_code == 200  # the portal session was there all along


def _dashboard_csrf(client) -> str:
    from tests.conftest import _csrf_from

    return _csrf_from(client.get("/login").get_data(as_text=True))


def test_no_api_route_answers_a_portal_session(app, portal, world):
    own = world["own"]
    cookie = portal.get_cookie("promesa_portal", path="/portal")
    everywhere = app.test_client()
    everywhere.set_cookie("promesa_portal", cookie.value, path="/")
    values = {"subscription_id": own.sub, "check_id": own.check, "replay_id": own.replay, "event_id": own.event,
              "uid": own.uid, "incident_id": 1}
    urls = app.url_map.bind("localhost")
    before = fingerprint()
    wrong = []
    for rule in app.url_map.iter_rules():
        if not rule.endpoint.startswith("api.") or rule.endpoint == "api.openapi":  # the API's public description
            continue
        path = urls.build(rule.endpoint, {a: values[a] for a in rule.arguments})
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            resp = everywhere.open(path, method=method, json={} if method != "GET" else None)
            if resp.status_code != 401:
                wrong.append(f"{method} {path}: {resp.status_code}")
    assert not wrong, "; ".join(wrong)
    assert fingerprint() == before


def test_a_change_without_the_portals_csrf_token_is_refused(app, portal, producer, world):
    own = world["own"]
    other = app.test_client()
    other.get(link_path(producer, "cus_own"))
    before = fingerprint()
    for path in (f"/portal/subscriptions/{own.sub}/resume", f"/portal/subscriptions/{own.sub}/replay",
                 f"/portal/subscriptions/{own.sub}/checks", f"/portal/replays/{own.replay}/cancel"):
        assert portal.post(path).status_code == 400, path
        assert portal.post(path, data={"csrf_token": "forged"}).status_code == 400, path
    # Another session's token (of the same consumer, from another link) is not this session's.
    theirs = csrf(other)
    assert portal.post(f"/portal/subscriptions/{own.sub}/resume", data={"csrf_token": theirs}).status_code == 400
    assert fingerprint() == before
    assert portal.post(f"/portal/subscriptions/{own.sub}/resume",
                       data={"csrf_token": csrf(portal)}).status_code == 302  # with its token, it works
