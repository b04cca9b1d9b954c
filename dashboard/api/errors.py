"""Every API failure is JSON `{"error": ...}` that says what is wrong; never an HTML page."""

from flask import jsonify
from werkzeug.exceptions import HTTPException

from ..validation import ApiError
from . import bp


@bp.errorhandler(ApiError)
def api_error(exc: ApiError):
    return jsonify(error=exc.message), exc.status


@bp.app_errorhandler(HTTPException)
def http_error(exc: HTTPException):
    from flask import request

    if not request.path.startswith("/api/"):
        return exc
    messages = {
        404: "no such resource",
        405: f"method {request.method} is not allowed here",
        413: "the request body is larger than the limit",
    }
    return jsonify(error=messages.get(exc.code, exc.description)), exc.code
