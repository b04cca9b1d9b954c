"""The producer JSON API under /api/v1, authenticated with a team's bearer token."""

from flask import Blueprint

bp = Blueprint("api", __name__, url_prefix="/api/v1")

from . import errors, replays, routes  # noqa: E402,F401  (routes register on bp)
