"""One error tree for the web layer, translated to HTTP in one place.

API paths (``/api/…``) answer ``{"error": {"code": "...", "message": "..."}}`` with the status of the
error; UI paths render ``error.html``. Every exception a view does not handle is logged and becomes a
500 without detail — but bad input must never get there: validation is a 400/422, a missing or
foreign job a 404, a state conflict a 409.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, jsonify, render_template, request
from werkzeug.exceptions import HTTPException

logger = logging.getLogger(__name__)

#: Machine-readable codes for plain HTTP errors raised by Flask/Werkzeug themselves.
_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "too_many_requests",
    500: "internal_error",
    503: "unavailable",
}


class ApiError(Exception):
    """The request cannot be served."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str | None = None, *, details: Any = None, headers: dict[str, str] | None = None):
        super().__init__(message or (self.__doc__ or "").strip())
        self.message = str(self.args[0])
        self.details = details
        self.headers = headers or {}


class Invalid(ApiError):
    """The request is malformed."""

    status, code = 422, "validation_error"


class Unauthorized(ApiError):
    """Authentication required."""

    status, code = 401, "unauthorized"

    def __init__(self, message: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("headers", {"WWW-Authenticate": 'Bearer realm="tenure", Basic realm="tenure"'})
        super().__init__(message, **kwargs)


class Forbidden(ApiError):
    """You are not allowed to do this."""

    status, code = 403, "forbidden"


class NotFound(ApiError):
    """Not found."""

    status, code = 404, "not_found"


class JobNotFoundError(NotFound):
    """Job not found."""


class Conflict(ApiError):
    """The request conflicts with the current state."""

    status, code = 409, "conflict"


class TooManyRequests(ApiError):
    """Too many requests; retry later."""

    status, code = 429, "too_many_requests"


class PayloadTooLarge(ApiError):
    """The request body is too large."""

    status, code = 413, "payload_too_large"


class Unavailable(ApiError):
    """The service is not ready."""

    status, code = 503, "unavailable"


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    """The JSON error envelope."""
    error: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        error["details"] = details
    return {"error": error}


def wants_json() -> bool:
    """API callers get JSON errors; people in the UI get an HTML page."""
    return (
        request.path.startswith("/api/")
        or request.path == "/metrics"
        or request.accept_mimetypes.best == "application/json"
    )


def _respond(status: int, code: str, message: str, details: Any = None, headers: dict[str, str] | None = None):
    if wants_json():
        response = jsonify(error_body(code, message, details))
    else:
        response = Response(render_template("error.html", status=status, message=message), mimetype="text/html")
    response.status_code = status
    for key, value in (headers or {}).items():
        response.headers[key] = value
    return response


def handle_api_error(error: ApiError):
    return _respond(error.status, error.code, error.message, error.details, error.headers)


def handle_http_exception(error: HTTPException):
    status = error.code or 500
    headers = dict(error.get_headers()) if status == 405 else {}
    headers.pop("Content-Type", None)
    data = getattr(error, "data", None) or {}
    details = data.get("messages") or data.get("errors")
    message = data.get("message") or error.description or error.name
    if details is not None and status in (400, 422):
        # webargs' validation errors: say which fields are wrong, never echo the input back.
        message = "The request did not validate."
        status = 422
    headers.update(data.get("headers") or {})
    return _respond(status, _HTTP_CODES.get(status, "error"), str(message), details, headers)


def handle_unexpected(error: Exception):
    logger.exception("Unhandled error on %s %s", request.method, request.path)
    return _respond(500, "internal_error", "Internal error.")


def register(app: Flask) -> None:
    """Install the handlers on *app* (after flask-smorest, so ours win)."""
    app.register_error_handler(ApiError, handle_api_error)
    app.register_error_handler(HTTPException, handle_http_exception)
    app.register_error_handler(Exception, handle_unexpected)
