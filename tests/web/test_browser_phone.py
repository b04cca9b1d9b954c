"""Every page family on a 400 px phone and a 1360 px desktop (issue 36): nothing wider than the screen, no
table that hides columns behind a sideways scroll, and on the phone the state, the error and the main action
on screen. One seeded dataset, every page opened at both widths; screenshots go to
test-output/screenshots/ (git-ignored)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from dashboard.core.extensions import db
from dashboard.models import Delivery, Incident
from dashboard.operations.sweeper import sweep_once

from tests.support.browser import DESKTOP, PHONE, assert_fits, assert_on_screen, sign_in
from tests.web.test_browser import browser_page, deliver_due, live_url  # noqa: F401 (fixtures and a helper)

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"
# A path with no place to break: the URL, the receiver's answer ("status 400 from <path>") and the incident's
# "Where" are all one long word.
LONG_PATH = "/status/400/" + "billing-invoices-webhook-receiver-" * 3 + "v2"
LONG_DESCRIPTION = ("invoices paid, refunded and disputed, for the billing team's ledger and the monthly report "
                    "that finance reads on the first working day")


def seed(app, producer, receiver, clock) -> dict:
    """Two endpoints of the same host (one dead-lettering behind a long URL, one healthy), an open incident,
    a bulk replay, a failed delivery with its receiver's long answer."""
    failing = producer.subscribe(receiver.url + LONG_PATH, description=LONG_DESCRIPTION)
    producer.subscribe(receiver.url + "/ok", description="search")
    events = [producer.publish(data={"resource_id": f"f_{n}"}) for n in range(6)]
    for _ in range(3):
        deliver_due(app, clock)
        clock.advance(minutes=2)
    sweep_once(app)
    replay = producer.post(f"/api/v1/subscriptions/{failing['id']}/replays").get_json()
    dead = db.session.scalar(select(Delivery.id).where(Delivery.subscription_id == failing["id"]))
    incident = db.session.scalar(select(Incident.id))
    assert incident is not None and dead is not None
    return {"sub": failing["id"], "event": events[0]["id"], "delivery": dead, "incident": incident,
            "replay": replay["id"]}


# (path, what must be on a phone's screen: the state, the error, the main action), as the admin sees them.
ADMIN_PAGES = [
    ("/", ["table.overview tbody tr:first-child .state",
           "table.overview tbody tr:first-child td[data-label='Delivered 24 h']",
           "table.overview tbody tr:first-child td[data-label='Dead letters'] a.bad",
           "table.overview tbody tr:first-child td[data-label='Failing since'] .bad"]),
    ("/subscriptions/{sub}", ["main h1", ".status .state", "button:text('Replay all dead letters')",
                              "svg.bars:visible", "svg.lines:visible"]),
    ("/subscriptions/{sub}/contract", ["main h1"]),
    ("/subscriptions/new", ["main h1", "button:text('Create subscription')"]),
    ("/subscriptions/{sub}/edit", ["main h1", "button:text('Save')"]),
    ("/deliveries/{delivery}", ["main h1", "main .state >> nth=0",
                                "table.attempts td[data-label='Response (excerpt)'] pre",
                                "button:text('Replay')"]),
    ("/events/{event}", ["main h1", "section.delivery-summary .state >> nth=0"]),
    ("/events?q=f_1", ["main h1", "button:text('Search')"]),
    ("/dead-letters", ["main h1", "button:text('Replay the')",
                       "main table tbody tr:first-child td[data-label='Last result']"]),
    ("/replays", ["main h1", "main table tbody tr:first-child .state"]),
    ("/replays/{replay}", ["main h1", "main .state >> nth=0"]),
    ("/incidents", ["main h1", "table.incidents tbody tr:first-child .state",
                    "table.incidents tbody tr:first-child td[data-label='Where']"]),
    ("/incidents/{incident}", ["main h1", "#incident-state", "button:text('Acknowledge')", "figure.chart svg:visible"]),
    ("/audit", ["main h1", "table.audit tbody tr:first-child"]),
    ("/quotas", ["main h1", "button:text('Save')"]),
    ("/tokens", ["main h1", "button:text('Create a token')"]),
    ("/users", ["main h1", "button:text('Create user')"]),
    ("/sinks", ["main h1", "button:text('Add')"]),
    ("/account/password", ["main h1", "button:text('Change password')"]),
]


def check_both_widths(page, url: str, on_phone: list[str], name: str) -> None:
    for size in (DESKTOP, PHONE):
        page.set_viewport_size(size)
        response = page.goto(url)
        assert response is not None
        page.wait_for_load_state("load")
        assert_fits(page)
        if size is PHONE:
            for selector in on_phone:
                assert_on_screen(page.locator(selector).first)
            page.screenshot(path=str(SCREENSHOTS / f"phone-{name}.png"), full_page=True)


def test_every_page_fits_a_phone_and_a_desktop(app, producer, receiver, clock, users, live_url, browser_page):
    ids = seed(app, producer, receiver, clock)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = browser_page
    favicons = []
    page.on("response", lambda r: "favicon" in r.url and favicons.append((r.url, r.status)))

    check_both_widths(page, live_url + "/login", ["main h1", "button:text('Sign in')"], "login")
    page.set_viewport_size(DESKTOP)
    sign_in(page, live_url, "admin")
    # The admin's nav, beside the open incident's badge and who is signed in, keeps to one row at 1360 px.
    tops = page.locator("#main-nav a:visible").evaluate_all("links => links.map(a => a.getBoundingClientRect().top)")
    assert len(tops) == 11 and len(set(tops)) == 1, tops
    for path, on_phone in ADMIN_PAGES:
        name = path.split("?")[0].strip("/").replace("/", "-").replace("{", "").replace("}", "") or "overview"
        check_both_widths(page, live_url + path.format(**ids), on_phone, name)
    # A chart's labels stay readable on the phone: its SVG is drawn at about the width it is shown at.
    for path, chart in [("/subscriptions/{sub}", "svg.bars"), ("/incidents/{incident}", "figure.chart svg")]:
        page.goto(live_url + path.format(**ids))
        label_px = page.evaluate("""(chart) => {
          const svg = [...document.querySelectorAll(chart)].find(s => s.getBoundingClientRect().width > 0);
          const text = svg.querySelector('text');
          return text.getBoundingClientRect().height;
        }""", chart)
        assert label_px >= 9, f"{path}: chart labels are {label_px:.1f}px tall on a phone"
    # A pull subscription's page (a listen session's, which says more): no URL, the route its receiver pulls from
    # as one long word, and the session's label and last pull.
    pulled = producer.post("/api/v1/subscriptions", {"mode": "pull", "listen": True,
                                                     "description": LONG_DESCRIPTION}).get_json()
    check_both_widths(page, f"{live_url}/subscriptions/{pulled['id']}", ["main h1", "dl.facts", "dd.listen-session"],
                      "subscription-pull")

    page.set_viewport_size(DESKTOP)
    page.click("text=Sign out")
    sign_in(page, live_url, "member")
    check_both_widths(page, live_url + "/users", ["h1"], "403")
    check_both_widths(page, live_url + "/subscriptions/sub_nothing_here", ["h1"], "404")

    assert favicons and all(status < 400 for _, status in favicons), favicons
    assert page.request.get(live_url + "/favicon.ico").ok  # followed to the icon, for pages that name none

