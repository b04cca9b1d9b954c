"""The consumer portal's own pages: the link that signs a consumer in, its home (its endpoints and dead letters),
its look (the team's accent colour, as a stylesheet), and leaving. Every other portal page is a dashboard page
registered on both blueprints (`pages.both`), so the portal and the dashboard share views and templates.

A portal session sees one consumer of one team: `access.PortalUser` and the access rules keep it there, and its
cookie is sent only to /portal (dashboard.web.security). Its frame-ancestors are the team's allowed origins.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from flask import current_app, g, redirect, render_template, request, session, url_for
from flask_login import current_user, login_required, login_user, logout_user
from flask_wtf.csrf import generate_csrf
from sqlalchemy import select

from dashboard.accounts import access
from dashboard.consumers import portal as portal_service
from dashboard.core.extensions import db
from dashboard.delivery import failures
from dashboard.models import Consumer, PortalLink, Subscription, Team
from dashboard.operations import replays as replay_service
from dashboard.operations import subscription_status
from dashboard.stats import overview as figures
from dashboard.subscriptions import checks as check_service
from dashboard.web.pages import portal_bp
from dashboard.web.security import CONTENT_SECURITY_POLICY

DEAD_LETTERS = 20
NO_ONE = "'none'"


def portal_team() -> Team | None:
    """The team whose portal this request is in: the session's, or the link's being opened."""
    team_id = current_user.team_id if access.is_portal(current_user) else g.get("portal_team_id")
    return db.session.get(Team, team_id) if team_id is not None else None


@portal_bp.app_context_processor
def _portal_look():
    # Every template asks: the dashboard's pages say less (no team tools, no users) when shown in the portal.
    shown = request.blueprint == "portal" if request else False
    return {"in_portal": shown, "portal_team": portal_team() if shown else None}


@portal_bp.after_request
def _frame_policy(response):
    """Only the team's allowed origins may frame its portal, and its logo may come from its own host."""
    team = portal_team()
    ancestors = " ".join(team.portal_frame_ancestors or []) if team is not None else ""
    logo = urlsplit(team.portal_logo_url) if team is not None and team.portal_logo_url else None
    policy = CONTENT_SECURITY_POLICY.replace("frame-ancestors 'none'", f"frame-ancestors {ancestors or NO_ONE}")
    if logo is not None:
        policy = policy.replace("img-src 'self' data:", f"img-src 'self' data: {logo.scheme}://{logo.netloc}")
    response.headers["Content-Security-Policy"] = policy
    return response


@portal_bp.get("/in/<token>")
def open_link(token):
    """The link a producer handed its consumer: its first use signs this browser in, and only that one."""
    if access.is_portal(current_user) and portal_service.opened_by(token[:200], current_user.session_token):
        return redirect(url_for(".home"))  # this browser's own link, opened again (a reloaded frame): still in
    logout_user()
    session.clear()
    try:
        session_token, link = portal_service.open_link(token[:200])
    except portal_service.LinkRefused as refused:
        # A known link's refusal (used, expired, revoked) says so inside the team's iframe, not a blocked frame.
        g.portal_team_id = db.session.scalar(select(PortalLink.team_id)
                                             .where(PortalLink.token_hash == portal_service.digest(token[:200])))
        return render_template("portal/ended.html", reason=str(refused)), 410
    g.portal_team_id = link.team_id
    consumer = db.session.get(Consumer, link.consumer_id)
    login_user(access.PortalUser(session_token, link.team_id, link.consumer_id, consumer.uid))
    generate_csrf()  # a fresh token, in the new session
    return redirect(url_for(".home"))


@portal_bp.get("/")
@login_required
def home():
    """The consumer's endpoints with their health, and its newest dead letters."""
    now = current_app.config["CLOCK"].now()
    consumer = db.session.get(Consumer, current_user.consumer_id)
    subs = db.session.scalars(select(Subscription).where(Subscription.consumer_id == consumer.id,
                                                         Subscription.team_id == consumer.team_id,
                                                         Subscription.deleted_at.is_(None))
                              .order_by(Subscription.created_at.desc())).all()
    rows = figures.overview_rows(db.session, subs, now)
    dead = replay_service.DeadLetterFilter(team_id=consumer.team_id, consumer=consumer.uid)
    where = dead.where(Subscription.team_id == consumer.team_id)
    dead_letters, _ = replay_service.page(where, None, DEAD_LETTERS)
    # A consumer has a few endpoints (subscriptions_per_consumer): each one's last error is one indexed read.
    last_failures = {r.sub.id: subscription_status.last_failure(r.sub.id) for r in rows}
    return render_template("portal/home.html", consumer=consumer, rows=rows, now=now, last_failures=last_failures,
                           error_class=failures.words,
                           failed_checks=check_service.latest_failed([r.sub.id for r in rows]),
                           dead_letters=dead_letters, dead_count=replay_service.count(where))


def _luminance(colour: str) -> float:
    """The relative luminance (WCAG 2) of a #rrggbb colour."""
    def channel(hex2: str) -> float:
        c = int(hex2, 16) / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g_, b = (channel(colour[i:i + 2]) for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g_ + 0.0722 * b


DARK_TEXT, LIGHT_TEXT = "#1d2330", "#fff"


LINK_CONTRAST = 4.5  # WCAG AA for text: a link in the accent must read on the page's white


def text_on(accent: str) -> str:
    """White on the accent if that reads at least as well as the dashboard's dark ink does, else that ink."""
    lum = _luminance(accent)
    on_white = 1.05 / (lum + 0.05)
    on_dark = (lum + 0.05) / (_luminance(DARK_TEXT) + 0.05)
    return LIGHT_TEXT if on_white >= on_dark else DARK_TEXT


def reads_on_white(accent: str) -> bool:
    return 1.05 / (_luminance(accent) + 0.05) >= LINK_CONTRAST


@portal_bp.get("/theme.css")
def theme():
    """The team's accent colour as a stylesheet (the pages allow no inline style): static/promesa.css paints the
    portal's top bar and primary buttons with var(--accent, its own colours), text on them var(--accent-text), and
    links with var(--accent-link): the accent, unless it is too light to read on the page (then the usual blue)."""
    team = portal_team()
    accent = team.portal_accent if team is not None and team.portal_accent else None
    link = f" --accent-link: {accent};" if accent and reads_on_white(accent) else ""
    css = f":root {{ --accent: {accent}; --accent-text: {text_on(accent)};{link} }}\n" if accent else ""
    return current_app.response_class(css, mimetype="text/css")


@portal_bp.post("/leave")
@login_required
def leave():
    """End this session here (the link stays used): for a shared computer."""
    portal_service.end_session(current_user.session_token)
    g.portal_team_id = current_user.team_id  # the page that says so still shows in the team's iframe
    logout_user()
    session.clear()
    return render_template("portal/ended.html", reason="You have left. Ask for a new link to come back.")
