"""Every dashboard route, for every role: who may open it, who is refused, who cannot even see it.

The routes come from `app.url_map`, so a new route that is not in MATRIX fails
`test_every_route_is_in_the_matrix`. The README's role table says the same in words.

Each cell is what that role gets:
- "ok":    allowed (any answer below 500 that is not 401/403/404 and not a bounce to the login page);
- "403":   signed in, but not allowed;
- "404":   another team's object: it does not exist, as far as they can tell;
- "login": not signed in: sent to the login page.
"""

from __future__ import annotations

import datetime as dt
import html
from itertools import takewhile
from pathlib import Path

import pytest
from sqlalchemy import select

from dashboard.accounts import access
from dashboard.operations import notifications
from dashboard.core.extensions import db
from dashboard.models import ApiToken, Check, Delivery, Event, Incident, Replay

from tests.conftest import Auth, _csrf_from

pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]

ROLES = ("anonymous", "member", "owner", "outsider", "oncall", "operator", "admin")
ALL_IN = {"anonymous": "login", "member": "ok", "owner": "ok", "outsider": "ok", "oncall": "ok",
          "operator": "ok", "admin": "ok"}
# Pages about one subscription of team acme (member and owner are acme's; outsider owns another team).
TEAM_PAGE = {**ALL_IN, "outsider": "404"}
# Repairs (pause, resume, disable, enable, replay): operators, admins, and the team's owner.
OPERATE = {"anonymous": "login", "member": "403", "owner": "ok", "outsider": "404", "oncall": "403",
           "operator": "ok", "admin": "ok"}
# Redefining a subscription (edit, rotate, delete, test): admins and the team's owner.
EDIT = {**OPERATE, "operator": "403"}
ADMIN_ONLY = {"anonymous": "login", "member": "403", "owner": "403", "outsider": "403", "oncall": "403",
              "operator": "403", "admin": "ok"}
PUBLIC = {role: "ok" for role in ROLES}
TOKENS = {**ADMIN_ONLY, "owner": "ok", "outsider": "ok"}
CREATE = {**ADMIN_ONLY, "owner": "ok", "outsider": "ok"}
# Acknowledging an incident: on-call, operators, admins and the owning team.
ACKNOWLEDGE = {**TEAM_PAGE}

# The consumer portal's routes (/portal): a dashboard session is not a portal session (its cookie is not even sent
# there), so every role is refused: 401 for a page, 400 for a change (the portal session holds no CSRF token).
# What a portal session may do is in tests/portal/test_portal_isolation.py.
PORTAL_ONLY = {role: "refused" for role in ROLES}

# (endpoint, method) -> expected per role. Path arguments are filled from the sample objects below.
MATRIX = {
    ("auth.login", "GET"): PUBLIC,
    ("auth.login", "POST"): {**PUBLIC, "anonymous": "login"},  # the matrix posts no password: 401
    ("auth.logout", "POST"): {**ALL_IN},
    ("auth.change_password", "GET"): ALL_IN,  # one's own password: everyone signed in
    ("auth.change_password", "POST"): ALL_IN,
    ("pages.overview", "GET"): ALL_IN,
    # The way in to the portal (an unknown link: its page says so, 410) and its stylesheet: anyone's.
    ("portal.open_link", "GET"): PUBLIC,
    ("portal.theme", "GET"): PUBLIC,
    ("pages.subscription", "GET"): TEAM_PAGE,
    ("pages.contract", "GET"): TEAM_PAGE,
    ("pages.delivery", "GET"): TEAM_PAGE,
    ("pages.pause", "POST"): OPERATE,
    ("pages.resume", "POST"): OPERATE,
    ("pages.replay", "POST"): OPERATE,
    ("pages.dead_letters", "GET"): ALL_IN,
    # Replays what the filter matches among the teams one may operate: an outsider replays only its own team's.
    ("pages.replay_dead_letters", "POST"): {**OPERATE, "outsider": "ok"},
    ("pages.replays", "GET"): ALL_IN,
    ("pages.replay_progress", "GET"): TEAM_PAGE,
    ("pages.cancel_replay", "POST"): OPERATE,
    ("pages.replay_since", "POST"): OPERATE,
    ("pages.disable", "POST"): OPERATE,
    ("pages.enable", "POST"): OPERATE,
    ("pages.audit", "GET"): ALL_IN,  # each sees the entries of the teams they may see
    ("pages.events", "GET"): ALL_IN,  # search: each finds the events of the teams they may see
    ("pages.event", "GET"): TEAM_PAGE,
    ("pages.users", "GET"): ADMIN_ONLY,
    ("pages.create_user", "POST"): ADMIN_ONLY,
    ("pages.change_role", "POST"): ADMIN_ONLY,
    ("pages.deactivate_user", "POST"): ADMIN_ONLY,
    ("pages.reactivate_user", "POST"): ADMIN_ONLY,
    # Owners manage their own team's tokens (the outsider: its own team's page, not acme's token), admins all.
    ("pages.tokens", "GET"): TOKENS,
    ("pages.create_token", "POST"): TOKENS,
    ("pages.revoke_token", "POST"): {**TOKENS, "outsider": "404"},
    ("pages.quotas_page", "GET"): ALL_IN,  # each sees the quotas of the teams they may see
    ("pages.set_quotas", "POST"): ADMIN_ONLY,
    ("pages.incidents", "GET"): ALL_IN,
    ("pages.incident", "GET"): TEAM_PAGE,
    ("pages.acknowledge_incident", "POST"): ACKNOWLEDGE,
    # Snoozing and resolving by hand: whoever may acknowledge (the matrix posts no `hours`: a 400).
    ("pages.snooze_incident", "POST"): ACKNOWLEDGE,
    ("pages.end_incident_snooze", "POST"): ACKNOWLEDGE,
    ("pages.resolve_incident", "POST"): ACKNOWLEDGE,
    ("pages.replay_incident", "POST"): OPERATE,
    ("pages.pause_from_incident", "POST"): OPERATE,
    ("pages.save_incident_rule", "POST"): EDIT,
    ("pages.hide_base_url_banner", "POST"): ADMIN_ONLY,  # the PROMESA_BASE_URL banner, for this session
    ("pages.sinks", "GET"): ADMIN_ONLY,
    ("pages.add_sink", "POST"): ADMIN_ONLY,
    ("pages.change_sink", "POST"): ADMIN_ONLY,
    ("pages.remove_sink", "POST"): ADMIN_ONLY,
    ("pages.test_sink", "POST"): ADMIN_ONLY,
    # Loopback clients (the test client) without PROMESA_METRICS_TOKEN: tests/test_metrics.py checks the rest.
    ("metrics.metrics", "GET"): PUBLIC,
    # Probes answer everyone and reveal nothing; tests/web/test_health.py checks who sees the details.
    ("health.healthz", "GET"): PUBLIC,
    ("health.readyz", "GET"): PUBLIC,
    ("pages.favicon", "GET"): PUBLIC,  # a redirect to the static icon
    # Owner tools (dashboard/pages/owner_tools.py).
    ("pages.edit_subscription", "GET"): EDIT,
    ("pages.edit_subscription", "POST"): EDIT,
    ("pages.rotate_secret", "POST"): EDIT,
    # Where creation and a rotation without htmx lead (the secret, once): those who may edit it.
    ("pages.subscription_created", "GET"): EDIT,
    ("pages.secret_rotated", "GET"): EDIT,
    ("pages.replace_pull_key", "POST"): EDIT,
    ("pages.pull_key_replaced", "GET"): EDIT,
    ("pages.end_grace", "POST"): EDIT,
    ("pages.delete_subscription", "POST"): EDIT,
    ("pages.send_test_event", "POST"): EDIT,
    ("pages.test_event_result", "GET"): TEAM_PAGE,
    # A new subscription: admins for any team, owners for their own (the outsider: its own team).
    ("pages.new_subscription", "GET"): CREATE,
    ("pages.new_subscription", "POST"): CREATE,
    # Trying a filter on a team's catalog example: the matrix's form names no team, which no one sees.
    ("pages.try_filter", "POST"): {**{role: "404" for role in ROLES}, "anonymous": "login"},
    # Ending dead letters and hopeless schedules (dashboard/pages/subscriptions.py, dead_letters.py): repairs.
    ("pages.discard", "POST"): OPERATE,
    ("pages.give_up", "POST"): OPERATE,
    ("pages.discard_dead_letters", "POST"): {**OPERATE, "outsider": "ok"},  # as replay_dead_letters
    # The receiver check (dashboard/web/pages/checks.py): members and on-call read the report, repairers run one.
    ("pages.run_check", "POST"): OPERATE,
    ("pages.check_card", "GET"): TEAM_PAGE,
    # Consumers (dashboard/web/pages/consumers.py): each sees its teams' list (the outsider: its own team's);
    # disabling and enabling one is a repair (the matrix posts no reason: the owner's disable is a 400).
    ("pages.consumers", "GET"): ALL_IN,
    ("pages.consumer", "GET"): TEAM_PAGE,
    ("pages.disable_consumer", "POST"): OPERATE,
    ("pages.enable_consumer", "POST"): OPERATE,
    ("pages.recover_consumer", "POST"): OPERATE,  # "replay since": refused on its form (422) when empty
    ("pages.recover_preview", "GET"): OPERATE,
    # The team's consumer portal settings (frame origins, accent, logo): its owners and admins, as its tokens.
    ("pages.portal_settings", "POST"): EDIT,
}


# What a signed-in person may always do to their own session and account (signing in again included).
OWN_ACCOUNT = {("auth.login", "POST"), ("auth.logout", "POST"), ("auth.change_password", "POST")}
# What access.ROLES_TABLE says on-call and members may change ("...incidents; nothing else").
ANSWERING_INCIDENTS = {("pages.acknowledge_incident", "POST"), ("pages.snooze_incident", "POST"),
                       ("pages.resolve_incident", "POST"), ("pages.end_incident_snooze", "POST")}
ROOT = Path(__file__).resolve().parents[2]


def _roles_table(markdown: str) -> dict:
    lines = markdown.splitlines()
    rows = takewhile(lambda line: line.startswith("| `"), lines[lines.index("| role | sees | may |") + 2:])
    cells = ([cell.strip() for cell in row.strip("|").split("|")] for row in rows)
    return {role.strip("`"): (sees, may) for role, sees, may in cells}


def test_the_roles_are_said_one_way_on_the_users_page_in_the_readme_and_in_the_docs(client, auth, users):
    """access.ROLES_TABLE is the one statement of the roles; every copy says exactly it, and the matrix agrees."""
    for document in ("README.md", "docs/dashboard.md"):
        assert _roles_table((ROOT / document).read_text()) == access.ROLES_TABLE, document
    auth.login("admin")
    page = client.get("/users").get_data(as_text=True)
    for role, (sees, may) in access.ROLES_TABLE.items():
        assert f"<dt>{role}</dt><dd>Sees {sees}. May: {html.escape(may)}.</dd>" in page
    for role in ("oncall", "member"):  # "...incidents; nothing else"
        changes = {route for route, who in MATRIX.items() if route[1] == "POST" and who[role] == "ok"}
        assert changes == OWN_ACCOUNT | ANSWERING_INCIDENTS, role
        assert access.ROLES_TABLE[role][1].endswith("resolves its incidents; nothing else" if role == "member"
                                                     else "resolves incidents; nothing else")


def _dashboard_routes(app):
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.endpoint.startswith("api."):
            continue  # static files are public; the API authenticates with team tokens (tests/test_api_*)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            yield rule, method


def _expected(endpoint: str, method: str) -> dict | None:
    if (endpoint, method) in MATRIX:
        return MATRIX[(endpoint, method)]
    return PORTAL_ONLY if endpoint.startswith("portal.") else None


def test_every_route_is_in_the_matrix(app):
    missing = [(rule.endpoint, method, rule.rule) for rule, method in _dashboard_routes(app)
               if _expected(rule.endpoint, method) is None]
    assert not missing, f"routes with no row in MATRIX (add who may use them): {missing}"


@pytest.fixture
def samples(producer, receiver, users, clock):
    """One of each object a route can name, all belonging to team acme."""
    sub = producer.subscribe(receiver.url + "/status/200")
    event = producer.publish()
    delivery = db.session.scalar(select(Delivery).join(Delivery.event).where(Event.id == event["id"]))
    token = db.session.scalar(select(ApiToken).where(ApiToken.team_id == producer.team.id))
    now = clock.now()
    incident = Incident(subscription_id=sub["id"], team_id=producer.team.id, rule="dead_letters", state="open",
                        opened_at=now, first_seen_at=now, last_seen_at=now, figures={"dead": 5})
    replay = Replay(actor_kind="user", actor="owner@example.com", team_id=producer.team.id, subscription_id=sub["id"],
                    filter={"subscription_id": sub["id"]}, filter_key="sample", total=0, done=0, succeeded=0,
                    failed=0, state="finished", created_at=now, finished_at=now)
    check = Check(id="chk_sample", subscription_id=sub["id"], state="finished", requested_by="owner@example.com",
                  started_at=now - dt.timedelta(hours=1), finished_at=now - dt.timedelta(hours=1), results=[])
    db.session.add_all([incident, replay, check])
    db.session.commit()
    sink, _ = notifications.add_sink("json", receiver.url + "/ok")
    producer.put_consumer("cus_sample")
    return {"uid": "cus_sample", "subscription_id": sub["id"], "delivery_id": delivery.id, "event_id": event["id"],
            "incident_id": incident.id, "rule": "dead_letters", "sink_id": sink.id, "replay_id": replay.id,
            "user_id": users["member"].id, "token_id": token.id, "check_id": check.id, "team_id": producer.team.id,
            "token": "not-a-portal-link"}


def _outcome(resp) -> str:
    if resp.status_code == 302 and "/login" in resp.headers.get("Location", ""):
        return "login"
    if resp.status_code in (401, 403, 404):
        return {401: "login", 403: "403", 404: "404"}[resp.status_code]
    assert resp.status_code < 500, resp.get_data(as_text=True)[:500]
    return "ok"


@pytest.mark.parametrize("role", ROLES)
def test_each_role_gets_what_the_matrix_says(app, samples, role):
    client = app.test_client()
    if role != "anonymous":
        assert Auth(client).login(role).status_code == 302
    wrong = []
    for rule, method in _dashboard_routes(app):
        if rule.endpoint == "auth.logout":
            continue  # signing out ends this client's session; checked last
        expected = _expected(rule.endpoint, method)[role]
        path = app.url_map.bind("localhost").build(rule.endpoint, {k: samples[k] for k in rule.arguments})
        if method == "GET":
            resp = client.get(path)
        else:
            token = _csrf_from(client.get("/login" if role == "anonymous" else "/",
                                          follow_redirects=True).get_data(as_text=True))
            resp = client.open(path, method=method, data={"csrf_token": token})
        got = _outcome(resp)
        if expected == "refused":
            got = "refused" if resp.status_code in (400, 401) else f"{got} ({resp.status_code})"
        if got != expected:
            wrong.append(f"{method} {path}: expected {expected}, got {got} ({resp.status_code})")
    assert not wrong, f"{role}: " + "; ".join(wrong)



@pytest.mark.parametrize("role, sees", [("admin", True), ("operator", False), ("oncall", False)])
def test_only_admins_see_the_notification_sinks_subscriptions(app, client, auth, users, receiver, role, sees):
    """A sink's URL is a credential (a Slack webhook): operators and on-call do not see its subscription."""
    from dashboard.operations import notifications

    sink, _ = notifications.add_sink("slack", receiver.url + "/hooks/secret-path")
    db.session.commit()
    auth.login(role)
    assert (client.get(f"/subscriptions/{sink.subscription_id}").status_code == 200) is sees
    assert ("secret-path" in client.get("/").get_data(as_text=True)) is sees
