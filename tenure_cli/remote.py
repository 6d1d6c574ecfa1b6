"""The operator commands' HTTP client: Tenure's JSON API (``/api/v1``) with a bearer token.

It imports nothing of Tenure's server side (only ``httpx``), so ``tenure jobs …`` runs on any
machine that reaches the web app and is allowed exactly what the token's user is allowed there.
The token travels in the ``Authorization`` header only: never in a URL, a message or a log line.

Every failure is an :class:`ApiError` whose :attr:`~ApiError.exit_code` is what the command
exits with (:data:`EXIT_REFUSED`, :data:`EXIT_USAGE`, :data:`EXIT_NOT_FOUND`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

EXIT_OK = 0
#: The API refused the request (401, 403, 409, 429 …), failed (5xx) or could not be reached.
EXIT_REFUSED = 1
#: Bad arguments: refused by the command's parser, or by the API's validation (400, 422).
EXIT_USAGE = 2
#: 404: no such job, queue or schedule — or another user's job, which looks exactly the same.
EXIT_NOT_FOUND = 3

#: Seconds a plain request may take (connect, read, write each).
DEFAULT_TIMEOUT_S = 30.0
#: Seconds the live feed may stay silent before it counts as lost (the server sends a heartbeat
#: every ``LIVE_HEARTBEAT_S``, 10 s by default).
LIVE_READ_TIMEOUT_S = 60.0


class ApiError(Exception):
    """A request that did not succeed, with the API's own message (``error.message``)."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code

    @property
    def exit_code(self) -> int:
        if self.status == 404:
            return EXIT_NOT_FOUND
        if self.status in (400, 422):
            return EXIT_USAGE
        return EXIT_REFUSED


class UsageError(ApiError):
    """The command cannot be sent as given (no URL, no token, a URL carrying credentials)."""

    @property
    def exit_code(self) -> int:
        return EXIT_USAGE


def check_base_url(url: str | None) -> str:
    """The API's base URL (``http(s)://host[:port][/prefix]``), without a trailing slash.

    Raises:
      UsageError: No URL, not http(s), or user:password in it (credentials belong in TENURE_TOKEN).
    """
    if not url:
        raise UsageError("TENURE_URL is not set (or pass --url), e.g. https://tenure.example.com")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError("TENURE_URL must be an http:// or https:// URL with a host.")
    if parts.username is not None or parts.password is not None:
        # Said without echoing the URL: it holds a secret.
        raise UsageError("TENURE_URL must not contain credentials; put the token in TENURE_TOKEN.")
    if parts.query or parts.fragment:
        raise UsageError("TENURE_URL must not have a query or fragment.")
    return url.rstrip("/")


def segment(value: str) -> str:
    """*value* as one path segment (a job id or queue name can never reach another route)."""
    return quote(value, safe="")


def error_from(response: httpx.Response) -> ApiError:
    """The API's ``{"error": {"code", "message", "details"}}`` as an :class:`ApiError` (one line)."""
    code = None
    message = f"HTTP {response.status_code} {response.reason_phrase}".strip()
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = error.get("code")
        message = str(error.get("message") or message)
        details = error.get("details")
        if details:
            message = f"{message} {_one_line(details)}"
    return ApiError(message, status=response.status_code, code=code)


def _one_line(details: Any) -> str:
    """Validation details (``{"field": ["reason"]}``, nested) as ``field: reason; …``."""
    if isinstance(details, dict):
        parts = []
        for key, value in details.items():
            inner = _one_line(value)
            parts.append(f"{key}: {inner}" if inner else str(key))
        return "; ".join(parts)
    if isinstance(details, list):
        return ", ".join(_one_line(v) for v in details)
    return " ".join(str(details).split())


class Remote:
    """One Tenure web app, as seen with one token."""

    def __init__(self, url: str | None, token: str | None, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        base = check_base_url(url)
        if not token:
            raise UsageError("TENURE_TOKEN is not set (or pass --token): create a token on the web UI's Tokens page.")
        self.base_url = base
        #: After :meth:`pages`: the cursor the list would continue from (``None``: it ended).
        self.next_cursor: str | None = None
        self.client = httpx.Client(
            base_url=base,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout_s,
            follow_redirects=False,
        )

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, path: str, *, params: Any = None, body: Any = None) -> Any:
        """One request; the decoded JSON answer.

        Raises:
          ApiError: The answer is not a 2xx, or the server could not be reached.
        """
        try:
            response = self.client.request(method, path, params=params, json=body)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if not response.is_success:
            raise error_from(response)
        return response.json() if response.content else None

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None) -> Any:
        return self.call("POST", path, body=body)

    def _unreachable(self, exc: httpx.HTTPError) -> ApiError:
        return ApiError(f"Cannot reach {self.base_url}: {type(exc).__name__}: {exc}")

    def pages(self, path: str, params: dict[str, Any], *, limit: int | None, page_size: int) -> Iterator[dict]:
        """Items of a cursor-paged list (``items`` + ``next_cursor``), following cursors until *limit*
        items (``None``: all) or the end. The cursor to continue from is left in :attr:`next_cursor`."""
        cursor = params.get("cursor")
        sent = 0
        while True:
            size = page_size if limit is None else min(page_size, limit - sent)
            page = self.get(path, **{**params, "cursor": cursor, "limit": size})
            for item in page["items"]:
                yield item
                sent += 1
            cursor = page.get("next_cursor")
            # A filtered page may come back short (or empty) with a cursor: the scan goes on from there.
            if cursor is None or (limit is not None and sent >= limit):
                self.next_cursor = cursor
                return

    @contextmanager
    def live(self, cursor: str | None = None) -> Iterator[Iterator[dict[str, Any]]]:
        """The live feed over Server-Sent Events (``/api/v1/live.sse``): its messages, in order.

        Raises:
          ApiError: The feed was refused (401, 429 …) or the connection was lost.
        """
        timeout = httpx.Timeout(DEFAULT_TIMEOUT_S, read=LIVE_READ_TIMEOUT_S)
        headers = {"Accept": "text/event-stream"}
        if cursor is not None:
            headers["Last-Event-ID"] = str(cursor)  # the feed refuses query parameters
        opened = False
        try:
            with self.client.stream("GET", "/api/v1/live.sse", headers=headers, timeout=timeout) as r:
                if not r.is_success:
                    r.read()
                    raise error_from(r)
                opened = True
                yield self._sse_messages(r)
        except httpx.HTTPError as exc:
            if opened:  # cut mid-stream (a web restart, a silent network): not "cannot reach"
                raise ApiError(f"The live feed ended: {type(exc).__name__}: {exc}") from None
            raise self._unreachable(exc) from None

    @staticmethod
    def _sse_messages(response: httpx.Response) -> Iterator[dict[str, Any]]:
        data: list[str] = []
        for line in response.iter_lines():
            if line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            elif line == "" and data:
                yield json.loads("\n".join(data))
                data = []
            # ``id:``, ``event:`` and ``retry:`` repeat what the JSON says; comments are ignored.
        raise ApiError("The live feed ended: the server closed the connection.")
