"""HTTP helpers for the operations tests: a client of a real web process (the JSON API with HTTP Basic,
UI pages with a logged-in session), its liveness probe, and a free port on 127.0.0.1."""

from __future__ import annotations

import base64
import http.cookiejar
import json
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def live(port: int) -> bool:
    """Whether ``GET /api/health/live`` answers 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health/live", timeout=2) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False


class Http:
    """One user's client: ``call`` for the API (Basic auth), ``page`` for UI pages (logs in once)."""

    def __init__(self, port: int, user: str, password: str) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.user, self.password = user, password
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self._browser: urllib.request.OpenerDirector | None = None

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, auth: bool = True) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", self.auth)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            with e:
                return e.code, json.loads(e.read() or b"null")

    def page(self, path: str) -> str:
        """The HTML of a UI page, as this user sees it after logging in through ``/login``."""
        if self._browser is None:
            browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
            with browser.open(self.base + "/login", timeout=10) as resp:
                token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', resp.read().decode())
            assert token, "no CSRF token on the login page"
            form = {"csrf_token": token.group(1), "username": self.user, "password": self.password}
            with browser.open(self.base + "/login", urllib.parse.urlencode(form).encode(), timeout=10) as resp:
                assert "/login" not in resp.url, "login failed"
            self._browser = browser
        with self._browser.open(self.base + path, timeout=10) as resp:
            assert resp.status == 200, resp.status
            return resp.read().decode()

    def submit_form(self, page: str, form_id: str) -> str:
        """Submit the form *form_id* of the UI page *page* (HTML) as a browser would: its action, its hidden
        fields (the CSRF token among them); returns the page it redirects to."""
        form = re.search(rf'<form method="post" action="([^"]+)" id="{form_id}">(.*?)</form>', page, re.S)
        assert form, f"no form {form_id!r} on the page"
        fields = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form.group(2))
        assert self._browser is not None, "log in first (page)"
        data = urllib.parse.urlencode(fields).encode()
        with self._browser.open(self.base + form.group(1), data, timeout=10) as resp:
            assert resp.status == 200, resp.status
            return resp.read().decode()
