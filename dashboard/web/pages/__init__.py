"""The dashboard: server-rendered pages, one module per family of pages, all on one blueprint.

State changes are POST-only, behind CSRF, and ask `dashboard.accounts.access` who may make them.
Templates mirror the modules: `templates/<family>/page.html` and `_partial.html`.
"""

from __future__ import annotations

from flask import Blueprint, flash, redirect, request, url_for

from dashboard.core.validation import ApiError
from dashboard.web.paths import PORTAL_PREFIX

bp = Blueprint("pages", __name__)
# The consumer portal (pages/portal.py): one consumer's own subscriptions, at /portal, behind its own cookie.
portal_bp = Blueprint("portal", __name__, url_prefix=PORTAL_PREFIX)


def both(rule: str, **options):
    """Register a view on the dashboard and, at /portal<rule>, in the consumer portal: one view, one template,
    whoever looks. Its access checks (dashboard.accounts.access) keep a portal session to its consumer's own;
    its templates link with url_for(".endpoint"), which stays in the blueprint the page was opened in."""

    def register(view):
        bp.add_url_rule(rule, view_func=view, **options)
        portal_bp.add_url_rule(rule, view_func=view, **options)
        return view

    return register


# Each module registers its routes on `bp` when imported.
from dashboard.web.charts import COMPACT_WIDTH, bar_paths, line_paths, x_ticks  # noqa: E402
from dashboard.web.pages import (  # noqa: E402,F401  (each registers its routes on bp)
    audit,
    base_url,
    checks,
    consumers,
    dead_letters,
    deliveries,
    events,
    formatting,
    incidents,
    overview,
    owner_tools,
    portal,
    quotas,
    replays,
    sinks,
    subscriptions,
    tokens,
    users,
)
from dashboard.web.pages.nav import nav_items  # noqa: E402


@bp.app_context_processor
def _navigation():
    return {"nav_items": nav_items}


# The chart macros' geometry (templates/shared/_charts.html).
for _geometry in (bar_paths, line_paths, x_ticks):
    bp.add_app_template_global(_geometry, _geometry.__name__)
bp.add_app_template_global(COMPACT_WIDTH, "COMPACT_WIDTH")


@bp.get("/favicon.ico")
def favicon():
    """The icon, for pages that name none (Werkzeug's 403 and 404) and browsers that ask for it anyway."""
    return redirect(url_for("static", filename="favicon.svg"), 301)


@bp.errorhandler(ApiError)
@portal_bp.errorhandler(ApiError)
def _refused(exc: ApiError):
    """A service refused a dashboard action (e.g. pausing a deleted subscription): say why, on the page."""
    flash(exc.message, "error")
    subscription_id = (request.view_args or {}).get("subscription_id")
    return redirect(url_for(".subscription", subscription_id=subscription_id) if subscription_id
                    else url_for(".overview" if request.blueprint == "pages" else ".home"))


def init_app(app) -> None:
    app.register_blueprint(bp)
    app.register_blueprint(portal_bp)
