"""Errors a browser meets (400, 403, 404, 405, a form whose CSRF token failed) answer inside the dashboard's
layout, with the nav, saying what was refused and why, and a way back. The API under /api keeps its JSON
(dashboard/web/api/errors.py hands every other path here)."""

from __future__ import annotations

from flask import render_template, request, url_for
from flask_wtf.csrf import CSRFError
from werkzeug.exceptions import HTTPException

from dashboard.accounts import access


def _way_back() -> str:
    """The page the person came from, when it is one of ours and not this one; the overview otherwise."""
    came_from = request.referrer or ""
    if came_from.startswith(request.host_url) and came_from != request.url:
        return "/" + came_from[len(request.host_url):].lstrip("/")  # never //elsewhere
    return url_for("pages.overview")


def error_page(exc: HTTPException):
    if exc.code is None or not 400 <= exc.code < 500:
        return exc
    headers = [(k, v) for k, v in exc.get_headers() if k.lower() != "content-type"]  # a 405's Allow
    reason = exc.description if exc.description != type(exc).description else None  # what the abort() said
    page = render_template("errors/page.html", error=exc, reason=reason, csrf_failed=isinstance(exc, CSRFError),
                           refused=exc if isinstance(exc, access.Refused) else None, roles_table=access.ROLES_TABLE,
                           way_back=_way_back())
    return page, exc.code, headers
