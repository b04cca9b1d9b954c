"""The PROMESA_BASE_URL banner: admins are told that notification links point at a default, on the pages where
those links matter (the overview they land on, the notification sinks), until they hide it for their session."""

from __future__ import annotations

from flask import current_app, redirect, request, session, url_for
from flask_login import current_user, login_required

from dashboard.accounts import access
from dashboard.web.pages import bp

# The pages that show the banner: where an admin lands, and where notifications are set up.
BANNER_PAGES = ("pages.overview", "pages.sinks")
# In the session once hidden; signing in starts a new session, which shows it again.
HIDDEN = "base_url_banner_hidden"


def base_url_banner_shown() -> bool:
    return (request.endpoint in BANNER_PAGES and current_user.is_authenticated and access.is_admin(current_user)
            and not current_app.config["PROMESA_BASE_URL_SET"] and not session.get(HIDDEN))


@bp.post("/base-url-banner/hide")
@login_required
def hide_base_url_banner():
    access.require_admin("hide the PROMESA_BASE_URL banner")
    session[HIDDEN] = True
    pages = {url_for(endpoint) for endpoint in BANNER_PAGES if endpoint in current_app.view_functions}
    back = request.form.get("back", "")
    return redirect(back if back in pages else url_for(".overview"))


@bp.app_context_processor
def _banner():
    return {"base_url_banner_shown": base_url_banner_shown}
