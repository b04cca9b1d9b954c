"""Every API failure is JSON `{"error": ...}` that says what is wrong; never an HTML page. Elsewhere a failure is a
dashboard page (dashboard/web/errors.py)."""

from flask import jsonify, request
from werkzeug.exceptions import HTTPException

from dashboard.core.validation import ApiError
from dashboard.web.api import bp
from dashboard.web.errors import error_page


@bp.errorhandler(ApiError)
def api_error(exc: ApiError):
    headers = dict(exc.headers)
    if getattr(exc, "retry_after", None):  # a receiver check refused within its minute
        headers["Retry-After"] = str(exc.retry_after)
    return jsonify(error=exc.message, **exc.fields), exc.status, headers


@bp.app_errorhandler(HTTPException)
def http_error(exc: HTTPException):
    if not request.path.startswith("/api/"):
        return error_page(exc)
    messages = {
        404: "no such resource",
        405: f"method {request.method} is not allowed here",
        413: "the request body is larger than the limit",
    }
    # Keep what the exception says in headers (a 405's Allow), but answer JSON.
    headers = [(k, v) for k, v in exc.get_headers() if k.lower() != "content-type"]
    return jsonify(error=messages.get(exc.code, exc.description)), exc.code, headers
