"""Absolute links into the dashboard, for what is read outside it (notifications, API answers, a check's
advice): always at PROMESA_BASE_URL, never at a request's Host, which the client chooses."""

from __future__ import annotations

from flask import current_app


def absolute(path: str) -> str:
    """`path` (starting with /) at PROMESA_BASE_URL."""
    return current_app.config["PROMESA_BASE_URL"].rstrip("/") + path


def absolute_for(endpoint: str, **values) -> str:
    """The URL of a dashboard `endpoint` at PROMESA_BASE_URL; works inside a job too (no request needed)."""
    return absolute(current_app.url_map.bind("promesa.invalid").build(endpoint, values))
