"""The producer JSON API under /api/v1, authenticated with a team's bearer token."""

from flask import Blueprint, current_app, g

from dashboard.accounts import service as accounts
from dashboard.core.extensions import csrf
from dashboard.web.paths import API_PREFIX as URL_PREFIX

bp = Blueprint("api", __name__, url_prefix=URL_PREFIX)

from dashboard.web.api import checks, consumers, errors, incidents, pull, replays, routes  # noqa: E402,F401  (routes register on bp)


@bp.after_request
def _note_token_use(response):
    # A token whose request succeeded was used: the Tokens page shows when, to the minute.
    digest = g.get("bearer_digest")
    if digest and response.status_code < 400:
        accounts.note_token_use(digest, current_app.config["CLOCK"].now())
    return response


def init_app(app) -> None:
    app.register_blueprint(bp)
    csrf.exempt(bp)  # the API authenticates with bearer tokens, not cookies
