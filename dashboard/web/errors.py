"""Errors a browser meets (400, 403, 404, 405, a form whose CSRF token failed) answer inside the dashboard's
layout, with the nav, saying what was refused and why, and a way back. The API under /api keeps its JSON
(dashboard/web/api/errors.py hands every other path here). In the consumer portal the same page names no user
and no role, and its way back stays in the portal."""

from __future__ import annotations

from flask import render_template, request, url_for
from flask_wtf.csrf import CSRFError
from werkzeug.exceptions import HTTPException

from dashboard.accounts import access
from dashboard.web.pages.portal import portal_team
from dashboard.web.paths import PORTAL_PREFIX, in_portal


def _way_back(portal: bool) -> str:
    """The page the person came from, when it is one of ours and not this one (in the portal: one of the portal's);
    the overview (the portal's home) otherwise."""
    came_from = request.referrer or ""
    if came_from.startswith(request.host_url) and came_from != request.url:
        path = "/" + came_from[len(request.host_url):].lstrip("/")  # never //elsewhere
        if not portal or path.startswith(PORTAL_PREFIX + "/"):
            return path
    return url_for("portal.home" if portal else "pages.overview")


def error_page(exc: HTTPException):
    if exc.code is None or not 400 <= exc.code < 500:
        return exc
    headers = [(k, v) for k, v in exc.get_headers() if k.lower() != "content-type"]  # a 405's Allow
    reason = exc.description if exc.description != type(exc).description else None  # what the abort() said
    # In the portal (a route of its own, or a path under it that is none), the page names no user and no role.
    portal = in_portal()
    if portal:
        shown = {"in_portal": True, "portal_team": portal_team()}
    else:
        shown = {"roles_table": access.ROLES_TABLE}
    page = render_template("errors/page.html", error=exc, reason=reason, csrf_failed=isinstance(exc, CSRFError),
                           refused=exc if isinstance(exc, access.Refused) else None, way_back=_way_back(portal),
                           **shown)
    return page, exc.code, headers
