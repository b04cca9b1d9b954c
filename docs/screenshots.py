"""Regenerate the README's pictures: `make screenshots`.

Seeds a week of demo data into a throwaway SQLite database (with the embedded Redis), serves the
dashboard on 127.0.0.1, signs in as an admin with Debian's headless Chromium (Playwright) and saves
one PNG per page in PAGES under docs/. Then it opens a portal link of the consumer Acme Corp (the
payments team has an accent colour and a logo) and saves the portal's pages in PORTAL_PAGES beside them
(docs/portal.md). The data is made up and the clock frozen, so the pictures
only change when the pages do. A new page is one more line in PAGES.
"""

from __future__ import annotations

import datetime as dt
import random
import shutil
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dashboard import audit
from dashboard.app import create_app
from dashboard.consumers import portal
from promesa_receiver import check as check_rules
from promesa_receiver import signing
from dashboard.core import crypto
from dashboard.stats import outcomes  # noqa: E402
from dashboard.core.clock import FrozenClock  # noqa: E402
from dashboard.core.extensions import db  # noqa: E402
from dashboard.core.ids import new_id  # noqa: E402
from dashboard.ingest.accept import thin_body  # noqa: E402
from dashboard.models import (ApiToken, Attempt, AuditEntry, Check, Consumer, Delivery, Event, Incident,  # noqa: E402
                              OutcomeCount, Subscription, Team, User)

NOW = dt.datetime(2026, 11, 30, 14, 0)
# (file name, path: "{subscription}", "{event}" and "{delivery}" are the demo's worst ones)
PAGES = [
    ("overview", "/"),
    ("dead-letters", "/dead-letters"),
    ("incidents", "/incidents"),
    ("incident", "/incidents/{incident}"),
    ("subscription", "/subscriptions/{subscription}"),
    ("event", "/events/{event}"),
    ("delivery", "/deliveries/{delivery}"),
    ("audit", "/audit"),
    ("new-endpoint", "/subscriptions/new?team=payments"),
    ("consumers", "/consumers?team={team}"),
    ("consumer", "/consumers/{team}/cus_acme"),
    ("tokens", "/tokens"),
]
# The same pages on the on-call engineer's phone (400 px wide): file name, path as in PAGES.
PHONE_PAGES = [
    ("overview-phone", "/"),
    ("subscription-phone", "/subscriptions/{subscription}"),
    ("incident-phone", "/incidents/{incident}"),
    ("consumer-phone", "/consumers/{team}/cus_acme"),
]
# The consumer portal as Acme Corp sees it (a link of the payments team), at a desktop's width and a phone's:
# file name under docs/, path ("{acme_subscription}" is Acme's endpoint), viewport width. An endpoint's
# page is long: its picture is the first screen of it.
PORTAL_PAGES = [
    ("portal-home", "/portal/", 1360),
    ("portal-endpoint", "/portal/subscriptions/{acme_subscription}", 1360),
    ("portal-home-phone", "/portal/", 400),
    ("portal-endpoint-phone", "/portal/subscriptions/{acme_subscription}", 400),
]
# The payments team's portal settings: its product's origin may frame the portal, in its colour, with its logo
# (served to the browser by this script: the demo has no network).
PORTAL_LOGO = "https://payments.example.com/brand/logo.svg"
PORTAL_LOGO_SVG = ('<svg xmlns="http://www.w3.org/2000/svg" width="32" height="32" viewBox="0 0 32 32">'
                   '<circle cx="16" cy="16" r="14" fill="#fff"/><circle cx="16" cy="16" r="7" fill="#0f766e"/></svg>')
PORTAL_SETTINGS = {"frame_ancestors": ["https://app.payments.example.com"], "accent_color": "#0f766e",
                   "logo_url": PORTAL_LOGO}
# The payments team's customers (consumers): uid, name, state; "customer sync" (ENDPOINTS[1]) is Acme's endpoint.
CONSUMERS = [("cus_acme", "Acme Corp", "active"), ("cus_globex", "Globex", "active"),
             ("cus_initech", "Initech", "disabled")]
CONSUMER_OF_ENDPOINT = {1: "cus_acme"}
# (url, description, team, state, state reason, failure rate per hour: fn(hours ago) -> 0..1, attempts per hour)
ENDPOINTS = [
    ("https://billing.example.com/hooks", "invoices to billing", "payments", "active", None,
     lambda h: 1.0 if h < 3 else 0.02, 120),
    ("https://crm.example.net/promesa", "customer sync", "payments", "active", None,
     lambda h: 0.35 if 20 < h < 60 else 0.03, 25),
    ("https://search.example.org/reindex", "search indexer", "search", "paused", "paused by ana@example.com",
     lambda h: 0.0, 60),
    ("https://old-partner.example.com/webhooks", "legacy partner", "payments", "disabled",
     "the receiver answered 410 Gone: it no longer wants these events", lambda h: 1.0 if h < 36 else 0.0, 5),
    ("https://analytics.example.io/in", "analytics", "search", "active", None, lambda h: 0.0, 80),
]


def seed(app) -> dict:
    rng = random.Random(7)
    teams = {name: Team(name=name) for name in ("payments", "search")}
    admin = User(email="admin@example.com", role="admin")
    admin.set_password("demo-password")
    db.session.add_all([*teams.values(), admin])
    db.session.flush()
    for team in teams.values():
        token, _ = ApiToken.issue(team)
        token.name, token.created_by, token.created_at = f"{team.name} producer", "owner@example.com", \
            NOW - dt.timedelta(days=20)
        db.session.add(token)
    consumers = {uid: Consumer(team_id=teams["payments"].id, uid=uid, name=name, state=state,
                               state_reason="asked us to stop while they migrate" if state == "disabled" else None,
                               created_at=NOW - dt.timedelta(days=25), updated_at=NOW - dt.timedelta(days=1))
                 for uid, name, state in CONSUMERS}
    db.session.add_all(consumers.values())
    db.session.flush()
    worst = {}
    counts, entries = [], []
    for index, (url, description, team, state, reason, failing, per_hour) in enumerate(ENDPOINTS):
        consumer = consumers.get(CONSUMER_OF_ENDPOINT.get(index))
        sub = Subscription(id=new_id("sub"), team_id=teams[team].id, consumer_id=consumer.id if consumer else None,
                           url=url, description=description, state=state,
                           state_reason=reason, secret_ciphertext=crypto.encrypt(signing.new_secret()),
                           created_at=NOW - dt.timedelta(days=30), updated_at=NOW)
        db.session.add(sub)
        entries.append(audit.entry_values("subscription.created", at=sub.created_at, actor=("token", "pk_3Fh9aQx"),
                                          team_id=sub.team_id, subscription_id=sub.id, detail={"url": url}))
        for minutes_ago in range(7 * 24 * 60, 0, -10):  # a row every ten minutes for a week
            rate = failing(minutes_ago / 60)
            attempts = max(0, int(rng.gauss(per_hour / 6, per_hour / 30)))
            failed = sum(rng.random() < rate for _ in range(attempts))
            if (state == "paused" and minutes_ago < 2 * 60) or (state == "disabled" and minutes_ago < 30 * 60):
                attempts = failed = 0  # nothing is attempted while paused or disabled
            counts.append({"subscription_id": sub.id, "minute": NOW - dt.timedelta(minutes=minutes_ago),
                           "succeeded": attempts - failed, "failed": failed, "dead": failed // 4,
                           "duration_ms": attempts * rng.randint(40, 300)})
        deliveries = _deliveries(sub, rng, dead=12 if index == 0 else 3 if index == 1 else 0)
        if index == 0:
            worst = deliveries
    entries += [
        audit.entry_values("subscription.paused", at=NOW - dt.timedelta(hours=2), actor=("user", "ana@example.com"),
                           team_id=teams["search"].id, subscription_id=_sub_id(2), deliveries=14,
                           detail={"reason": "paused by ana@example.com"}),
        audit.entry_values("subscription.disabled", at=NOW - dt.timedelta(hours=30), team_id=teams["payments"].id,
                           subscription_id=_sub_id(3), detail={"reason": ENDPOINTS[3][4]}),
        audit.entry_values("deliveries.replayed", at=NOW - dt.timedelta(hours=26), actor=("user", "ops@example.com"),
                           team_id=teams["payments"].id, subscription_id=_sub_id(1), deliveries=42,
                           detail={"which": "all dead letters"}),
        audit.entry_values("token.created", at=NOW - dt.timedelta(days=3), actor=("user", "owner@example.com"),
                           team_id=teams["search"].id, target="token:pk_8kLm2Zq"),
        audit.entry_values("subscription.edited", at=NOW - dt.timedelta(days=2), actor=("user", "owner@example.com"),
                           team_id=teams["payments"].id, subscription_id=_sub_id(0),
                           detail={"before": {"url": "https://billing.example.com/webhooks", "retry_policy": "exponential"},
                                   "after": {"url": ENDPOINTS[0][0], "retry_policy": "quick-then-sweep"}}),
    ]
    # The failing billing endpoint has an open incident: the list, the badge and the on-call page show it.
    # Its figures are the demo's own dead letters in the 15 minutes before it opened, as the rule counts them.
    opened_at = NOW - dt.timedelta(hours=2, minutes=35)
    dead_before = sum(c["dead"] for c in counts if c["subscription_id"] == _sub_id(0)
                      and opened_at - dt.timedelta(minutes=15) <= c["minute"] < opened_at)
    incident = Incident(subscription_id=_sub_id(0), team_id=teams["payments"].id, rule="dead_letters", state="open",
                        opened_at=opened_at, first_seen_at=NOW - dt.timedelta(hours=3),
                        last_seen_at=NOW - dt.timedelta(minutes=1),
                        figures={"dead": dead_before, "threshold": 5, "window_minutes": 15})
    assert dead_before >= 5, "the demo's incident would not have fired: its endpoint needs more dead letters"
    db.session.add(incident)
    db.session.flush()
    worst = {**worst, "incident": incident.id, "team": teams["payments"].id}
    # Its last receiver check: the endpoint took a request signed with the wrong secret.
    answers = {step: check_rules.Answer(status, seconds) for step, status, seconds in [
        ("signed", 200, 0.21), ("duplicate", 200, 0.18), ("forged", 200, 0.2), ("stale", 401, 0.05),
        ("tampered", 401, 0.04)]}
    db.session.add(Check(id="chk_demo0000000000000001", subscription_id=_sub_id(0), state="finished",
                         started_at=NOW - dt.timedelta(minutes=20), finished_at=NOW - dt.timedelta(minutes=20),
                         requested_by="owner@example.com",
                         results=check_rules.judge(ENDPOINTS[0][0], "promesa", answers)))
    db.session.flush()
    db.session.execute(OutcomeCount.__table__.insert(), counts)
    db.session.execute(AuditEntry.__table__.insert(), entries)
    db.session.commit()
    portal.update_settings(teams["payments"], given=frozenset(PORTAL_SETTINGS), **PORTAL_SETTINGS)
    return {**worst, "acme_subscription": _sub_id(1)}


_created: list[str] = []


def _sub_id(index: int) -> str:
    return _created[index]


def _deliveries(sub: Subscription, rng: random.Random, dead: int) -> dict:
    """A few deliveries of the last hours: dead letters, retries waiting, successes, each with attempts."""
    _created.append(sub.id)
    first = {}
    for n in range(dead + 6):
        at = NOW - dt.timedelta(minutes=rng.randint(5, 600))
        event_id = new_id("evt")
        resource = f"inv_{rng.randint(1000, 9999)}"
        body = thin_body(event_id, "invoice.paid", 1, at.isoformat() + "Z", f'{{"resource_id":"{resource}"}}')
        db.session.add(Event(key=event_id, id=event_id, team_id=sub.team_id, consumer_id=sub.consumer_id,
                             type="invoice.paid", version=1,
                             data={"resource_id": resource}, resource_id=resource, body=body, occurred_at=at,
                             created_at=at))
        state = "dead" if n < dead else "scheduled" if n < dead + 2 else "succeeded"
        if state == "scheduled" and sub.state != "active":
            state = "held"  # a paused or disabled subscription holds its retries
        tries = 8 if state == "dead" else 1 if state == "succeeded" else 3
        d = Delivery(id=new_id("dlv"), event_key=event_id, subscription_id=sub.id, state=state, attempt_count=tries,
                     last_status_code=200 if state == "succeeded" else 503, created_at=at, updated_at=at,
                     # one retry is due (waiting for a worker), the other later
                     next_attempt_at=NOW + dt.timedelta(minutes=8 if n > dead else -4 - 3 * dead) if state in ("scheduled", "held") else None,
                     dead_lettered_at=at if state == "dead" else None, succeeded_at=at if state == "succeeded" else None)
        db.session.add(d)
        for number in range(1, tries + 1):
            ok = state == "succeeded"
            db.session.add(Attempt(delivery_id=d.id, number=number, attempted_at=at + dt.timedelta(minutes=number),
                                   duration_ms=rng.randint(40, 900), status_code=200 if ok else 503,
                                   response_excerpt='{"ok":true}' if ok else "<html><h1>503 Service Unavailable</h1></html>"))
        if not first:
            first = {"subscription": sub.id, "event": event_id, "delivery": d.id}
    return first


def shoot_portal(browser, app, base: str, ids: dict) -> None:
    """Open a portal link of Acme Corp in a browser of its own and save PORTAL_PAGES under docs/."""
    with app.app_context():
        acme = db.session.query(Consumer).filter_by(uid="cus_acme").one()
        url, _ = portal.create_link(acme, 3600)
    page = browser.new_page(viewport={"width": 1360, "height": 800})
    page.route(PORTAL_LOGO, lambda route: route.fulfill(body=PORTAL_LOGO_SVG, content_type="image/svg+xml"))
    page.goto(base + url.removeprefix(app.config["PROMESA_BASE_URL"]))
    page.wait_for_url(base + "/portal/")
    for name, path, width in PORTAL_PAGES:
        page.set_viewport_size({"width": width, "height": 860 if width < 720 else 800})
        page.goto(base + path.format(**ids))
        target = ROOT / "docs" / f"{name}.png"
        page.screenshot(path=str(target), full_page="/subscriptions/" not in path)
        print(f"wrote {target.relative_to(ROOT)}")
    page.close()


def main() -> None:
    import flask_migrate
    from playwright.sync_api import sync_playwright
    from werkzeug.serving import make_server

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        sys.exit("Debian's chromium is needed: make browser")
    instance = Path(tempfile.mkdtemp(prefix="promesa-screenshots-"))
    try:
        app = create_app({"SQLALCHEMY_DATABASE_URI": f"sqlite:///{instance / 'demo.db'}", "INSTANCE_PATH": str(instance),
                          "REDIS_URL": None, "PROMESA_REDIS_PREFIX": "promesa-demo", "PROMESA_QUEUE": "promesa-demo",
                          "CLOCK": FrozenClock(NOW), "PROMESA_BASE_URL": "https://promesa.example.com"})
        with app.app_context():
            flask_migrate.upgrade()
            ids = seed(app)
        server = make_server("127.0.0.1", 0, app, threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_port}"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                         args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            page = browser.new_page(viewport={"width": 1360, "height": 800})
            page.goto(base + "/login")
            page.fill("input[name=email]", "admin@example.com")
            page.fill("input[name=password]", "demo-password")
            page.click("button[type=submit]")
            page.wait_for_url(base + "/")
            screens = (({"width": 1360, "height": 800}, PAGES), ({"width": 400, "height": 860}, PHONE_PAGES))
            for viewport, pages in screens:
                page.set_viewport_size(viewport)
                for name, path in pages:
                    page.goto(base + path.format(**ids))
                    target = ROOT / "docs" / f"{name}.png"
                    page.screenshot(path=str(target), full_page=True)
                    print(f"wrote {target.relative_to(ROOT)}")
            shoot_portal(browser, app, base, ids)
            browser.close()
        server.shutdown()
    finally:
        shutil.rmtree(instance, ignore_errors=True)


if __name__ == "__main__":
    main()
