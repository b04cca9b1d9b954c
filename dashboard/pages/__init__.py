"""The dashboard: server-rendered pages, one module per family of pages, all on one blueprint.

State changes are POST-only, behind CSRF, and ask `dashboard.access` who may make them.
Templates mirror the modules: `templates/<family>/page.html` and `_partial.html`.
"""

from __future__ import annotations

from flask import Blueprint, abort, request

from ..validation import nul_in_path_or_query

bp = Blueprint("pages", __name__)


@bp.before_request
def refuse_nul():
    if nul_in_path_or_query(request):
        abort(400, "the path and the query must not contain NUL characters")

# Each module registers its routes on `bp` when imported.
from . import (  # noqa: E402,F401
    audit, dead_letters, deliveries, events, formatting, incidents, overview, owner_tools, replays, sinks, subscriptions,
    tokens, users,
)
from ..charts import bar_paths  # noqa: E402
from .nav import nav_items  # noqa: E402


@bp.app_context_processor
def _navigation():
    return {"nav_items": nav_items}


bp.add_app_template_global(bar_paths, "bar_paths")  # the chart macros' geometry (templates/shared/_charts.html)
