"""The producer JSON API under /api/v1, authenticated with a team's bearer token."""

from flask import Blueprint

URL_PREFIX = "/api/v1"
bp = Blueprint("api", __name__, url_prefix=URL_PREFIX)

from . import errors, replays, routes  # noqa: E402,F401  (routes register on bp)
