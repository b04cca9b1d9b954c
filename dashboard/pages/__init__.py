"""The dashboard: server-rendered pages, one module per family of pages, all on one blueprint.

State changes are POST-only, behind CSRF, and ask `dashboard.access` who may make them.
Templates mirror the modules: `templates/<family>/page.html` and `_partial.html`.
"""

from __future__ import annotations

from flask import Blueprint

bp = Blueprint("pages", __name__)

# Each module registers its routes on `bp` when imported.
from . import deliveries, overview, owner_tools, subscriptions  # noqa: E402,F401
from .nav import nav_items  # noqa: E402


@bp.app_context_processor
def _navigation():
    return {"nav_items": nav_items}
