"""The consumer portal's way in: links a producer hands one consumer, the one session each opens, and the
team's portal settings (who may frame it, its accent colour and logo). The pages are in dashboard.web.portal.

A link holds a random token, stored only as its SHA-256. Its first use opens a session (a second random token,
in the portal's cookie, also stored hashed) that ends when the link would have expired; a second use is refused.
Revoking, disabling or deleting the consumer ends every session and every unused link of it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import re
import secrets
from urllib.parse import urlsplit

from flask import current_app
from sqlalchemy import select, update

from dashboard import audit
from dashboard.core.extensions import db
from dashboard.core.links import absolute
from dashboard.core.validation import ApiError
from dashboard.models import Consumer, ConsumerState, PortalLink, Team

LINK_SECONDS_MIN, LINK_SECONDS_MAX, LINK_SECONDS_DEFAULT = 60, 7 * 86400, 3600
LINK_PATH = "/portal/in/"
MAX_FRAME_ANCESTORS = 10
_ACCENT = re.compile(r"^#[0-9a-fA-F]{6}$")


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _now() -> dt.datetime:
    return current_app.config["CLOCK"].now()


def create_link(consumer: Consumer, expires_in: int) -> tuple[str, PortalLink]:
    """A new link for the consumer (its URL, and the row); the token is shown once, in the answer."""
    if not LINK_SECONDS_MIN <= expires_in <= LINK_SECONDS_MAX:
        raise ApiError(422, f"expires_in must be from {LINK_SECONDS_MIN} to {LINK_SECONDS_MAX} seconds (7 days)")
    if consumer.state != ConsumerState.ACTIVE:
        raise ApiError(409, f"consumer {consumer.uid!r} is disabled: enable it before handing it a portal link")
    now = _now()
    token = secrets.token_urlsafe(32)
    kind, name = audit.current_actor()
    link = PortalLink(team_id=consumer.team_id, consumer_id=consumer.id, token_hash=digest(token), created_at=now,
                      created_by=f"{kind}:{name}"[:254], expires_at=now + dt.timedelta(seconds=expires_in))
    db.session.add(link)
    audit.record("portal.link_created", team_id=consumer.team_id, target=f"consumer:{consumer.uid}",
                 detail={"expires_at": link.expires_at.isoformat(timespec="seconds") + "Z"})
    db.session.commit()
    return absolute(LINK_PATH + token), link


class LinkRefused(Exception):
    """Why a link opens no session, in words for the page that says so."""


def open_link(token: str) -> tuple[str, PortalLink]:
    """Exchange an unused, unexpired link for a session: (the session's token, the link). Exactly one of two
    browsers opening the same link at once gets the session (the UPDATE's condition decides)."""
    now = _now()
    session_token = secrets.token_urlsafe(32)
    opened = db.session.execute(
        update(PortalLink).where(PortalLink.token_hash == digest(token), PortalLink.opened_at.is_(None),
                                 PortalLink.revoked_at.is_(None), PortalLink.expires_at > now)
        .values(opened_at=now, session_hash=digest(session_token))
        .execution_options(synchronize_session=False)).rowcount
    link = db.session.scalar(select(PortalLink).where(PortalLink.token_hash == digest(token)))
    if not opened:
        db.session.rollback()
        raise LinkRefused(_refusal(link, now))
    consumer = db.session.get(Consumer, link.consumer_id)
    if consumer.deleted_at is not None or consumer.state != ConsumerState.ACTIVE:
        db.session.rollback()
        raise LinkRefused("This link's account is disabled. Ask for a new link once it is enabled again.")
    audit.record("portal.signed_in", team_id=link.team_id, target=f"consumer:{consumer.uid}",
                 actor=("portal", consumer.uid))
    db.session.commit()
    return session_token, link


def opened_by(token: str, session_token: str) -> bool:
    """Is this the link that opened this (still open) session?"""
    return db.session.scalar(select(PortalLink.id).where(PortalLink.token_hash == digest(token),
                                                         PortalLink.session_hash == digest(session_token))) is not None


def _refusal(link: PortalLink | None, now: dt.datetime) -> str:
    if link is None:
        return "This is not a portal link. Check that the whole link was copied, or ask for a new one."
    if link.revoked_at is not None:
        return "This link was revoked. Ask for a new one."
    if link.opened_at is not None:
        return "This link has been used already: each link signs in once. Ask for a new one."
    return "This link has expired. Ask for a new one."


@dataclasses.dataclass(frozen=True)
class Session:
    link_id: int
    team_id: int
    consumer_id: int
    uid: str
    expires_at: dt.datetime


def session_of(session_token: str) -> Session | None:
    """The open session this token is, or None: revoked, past its link's expiry, or its consumer is no longer
    active. Read at every request, so revoking ends a session at the next click."""
    now = _now()
    row = db.session.execute(
        select(PortalLink.id, PortalLink.team_id, PortalLink.consumer_id, Consumer.uid, PortalLink.expires_at)
        .join(Consumer, Consumer.id == PortalLink.consumer_id)
        .where(PortalLink.session_hash == digest(session_token), PortalLink.revoked_at.is_(None),
               PortalLink.expires_at > now, Consumer.deleted_at.is_(None),
               Consumer.state == ConsumerState.ACTIVE)).one_or_none()
    return Session(*row) if row is not None else None


def revoke(consumer: Consumer, why: str) -> int:
    """End every open session and unused link of the consumer; how many. Added to the caller's transaction."""
    now = _now()
    ended = db.session.execute(
        update(PortalLink).where(PortalLink.consumer_id == consumer.id, PortalLink.revoked_at.is_(None),
                                 PortalLink.expires_at > now)
        .values(revoked_at=now).execution_options(synchronize_session=False)).rowcount
    if ended:
        audit.record("portal.sessions_revoked", team_id=consumer.team_id, target=f"consumer:{consumer.uid}",
                     detail={"links": ended, "why": why})
    return ended


def end_session(session_token: str) -> None:
    """The consumer left: this session ends now (its link stays used)."""
    now = _now()
    db.session.execute(update(PortalLink).where(PortalLink.session_hash == digest(session_token),
                                                PortalLink.revoked_at.is_(None))
                       .values(revoked_at=now).execution_options(synchronize_session=False))
    db.session.commit()


def team_of_session(session_token: str) -> int | None:
    """The team of a session, open or ended: an ended session's page keeps its team's frame policy."""
    return db.session.scalar(select(PortalLink.team_id).where(PortalLink.session_hash == digest(session_token)))


# -- the team's portal settings ---------------------------------------------------------------------------------

def _origin(value: str) -> str:
    """An origin a page may frame the portal from: scheme://host[:port], nothing more (a CSP source)."""
    if not isinstance(value, str) or len(value) > 200:
        raise ApiError(422, "frame_ancestors: each must be an origin of at most 200 characters")
    parts = urlsplit(value)
    origin = f"{parts.scheme}://{parts.netloc}".lower()
    if parts.scheme not in ("https", "http") or not parts.hostname or parts.path not in ("", "/") \
            or parts.query or parts.fragment or parts.username or parts.password \
            or not re.fullmatch(r"[a-z0-9.-]+(:[0-9]{1,5})?", parts.netloc.lower()):
        raise ApiError(422, f"frame_ancestors: {value!r} is not an origin (scheme://host[:port], such as "
                            "https://app.example.com)")
    return origin


def _logo(value: str | None) -> str | None:
    if value is None or value == "":
        return None
    parts = urlsplit(value)
    if len(value) > 500 or parts.scheme != "https" or not parts.hostname \
            or any(ch in value for ch in " \"'<>\\") or any(ord(ch) < 0x21 for ch in value):
        raise ApiError(422, "logo_url must be an https URL of at most 500 characters, without spaces or quotes")
    return value


def update_settings(team: Team, *, frame_ancestors: list[str] | None = None, accent_color: str | None = None,
                    logo_url: str | None = None, given: frozenset[str] = frozenset()) -> Team:
    """Change the settings named in `given`; every one is checked before any is stored."""
    changes = {}
    if "frame_ancestors" in given:
        origins = [_origin(v) for v in (frame_ancestors or [])]
        if len(origins) > MAX_FRAME_ANCESTORS:
            raise ApiError(422, f"frame_ancestors: at most {MAX_FRAME_ANCESTORS} origins")
        changes["portal_frame_ancestors"] = sorted(set(origins)) or None
    if "accent_color" in given:
        if accent_color not in (None, "") and not _ACCENT.fullmatch(accent_color):
            raise ApiError(422, "accent_color must be a colour as #rrggbb, such as #0b5fff")
        changes["portal_accent"] = accent_color.lower() if accent_color else None
    if "logo_url" in given:
        changes["portal_logo_url"] = _logo(logo_url)
    for column, value in changes.items():
        setattr(team, column, value)
    if changes:
        audit.record("portal.settings_changed", team_id=team.id,
                     detail={column.removeprefix("portal_"): value for column, value in changes.items()})
    db.session.commit()
    return team


def settings(team: Team) -> dict:
    return {"frame_ancestors": list(team.portal_frame_ancestors or []), "accent_color": team.portal_accent,
            "logo_url": team.portal_logo_url}
