"""The nav bar across the top: one line per page family, shown to the roles that may open it.
A family appears once its endpoint exists, so a new page module only adds its line here."""

from __future__ import annotations

from flask import current_app, request, url_for

from dashboard.accounts import access

# (endpoint, label, who sees the link)
NAV = [
    ("pages.overview", "Overview", lambda user: True),
    ("pages.consumers", "Consumers", lambda user: True),
    ("pages.dead_letters", "Dead letters", lambda user: True),
    ("pages.incidents", "Incidents", lambda user: True),
    ("pages.events", "Events", lambda user: True),
    ("pages.audit", "Audit log", lambda user: True),
    ("pages.new_subscription", "New subscription", lambda user: access.is_admin(user) or user.role == "owner"),
    ("pages.quotas_page", "Quotas", lambda user: True),
    ("pages.tokens", "Tokens", lambda user: access.is_admin(user) or user.role == "owner"),
    ("pages.users", "Users", access.is_admin),
    ("pages.sinks", "Notification sinks", access.is_admin),
]


def nav_items(user) -> list[tuple[str, str, bool]]:
    """(url, label, is this the current page's family) for every page family this user may open."""
    return [(url_for(endpoint), label, request.endpoint == endpoint)
            for endpoint, label, shown in NAV
            if endpoint in current_app.view_functions and shown(user)]
