"""Where the web app's parts live: the producer API and the consumer portal, by path. A leaf of the web
package: the API, the error pages and the cookie rules all ask it, and it asks none of them."""

from __future__ import annotations

from flask import request

API_PREFIX = "/api/v1"
PORTAL_PREFIX = "/portal"


def in_portal() -> bool:
    """Is this request for the consumer portal (dashboard.web.pages.portal)?"""
    return request.path == PORTAL_PREFIX or request.path.startswith(PORTAL_PREFIX + "/")
