"""The browser client of the live feed (webapp/static/live.js) in a real browser against gunicorn.

Its manners: a refused handshake is asked about (HEAD) and retried only after ``Retry-After``; a
connection that stays silent for 2.5 heartbeats is replaced (the server is stopped with SIGSTOP: its
TCP connections stay open, nothing arrives); while the page is hidden there is no connection and no
polling, and when it shows again the feed resumes after the last cursor seen.

Headless Chromium reports every page as visible whatever happens to its window, so the hidden test
sets ``document.hidden`` / ``visibilityState`` (and fires ``visibilitychange``) through an init script:
the Page Visibility API's signal is the one thing driven from outside; the client, the browser's
WebSocket and the server are real.

This module's deployment: heartbeats every second (silence after 2.5 s) and ``Retry-After: 2``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
from websockets.sync.client import connect

from .conftest import Deployment

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DEPLOYMENT_ENV = {"TENURE_WEB_LIVE_HEARTBEAT_S": "1", "TENURE_WEB_LIVE_RETRY_AFTER_S": "2"}

REFETCHES = """
(() => {
  window.__tenureRefetched = 0;
  document.addEventListener("tenure:list-refetched", () => { window.__tenureRefetched += 1; });
})();
"""

VISIBILITY = """
(() => {
  let hidden = false;
  Object.defineProperty(Document.prototype, "hidden", { get() { return hidden; }, configurable: true });
  Object.defineProperty(Document.prototype, "visibilityState", {
    get() { return hidden ? "hidden" : "visible"; }, configurable: true,
  });
  window.__tenureSetHidden = (value) => { hidden = value; document.dispatchEvent(new Event("visibilitychange")); };
})();
"""


class Page:
    """ursula's logged-in page, with every WebSocket it opens and every frame and request it makes."""

    def __init__(self, browser: Any, dep: Deployment, *, wait_live: bool = True, init_script: str = "") -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 860})
        if init_script:
            self.context.add_init_script(init_script)
        self.page = self.context.new_page()
        self.page.set_default_timeout(15_000)
        self.sockets: list[dict[str, Any]] = []  # {"at", "sent", "received", "closed"}
        self.requests: list[tuple[float, str, str]] = []
        self.probes: list[tuple[float, int, str | None]] = []  # HEAD /api/v1/live.sse answers
        self.errors: list[str] = []
        self.notices: list[tuple[float, dict[str, Any]]] = []  # (when received, notice)
        self.page.on("websocket", self._socket)
        self.page.on("request", lambda r: self.requests.append((time.monotonic(), r.method, r.url)))
        self.page.on("response", self._response)
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        name, password = dep.user
        self.page.goto(dep.base_url + "/login")
        self.page.fill("#username", name)
        self.page.fill("#password", password)
        self.page.click("button[type=submit]")
        self.page.wait_for_url("**/jobs")
        if wait_live:
            self.page.wait_for_selector("#live-state.on")

    def _socket(self, ws: Any) -> None:
        record: dict[str, Any] = {"at": time.monotonic(), "sent": [], "received": [], "closed": None}
        ws.on("framesent", lambda payload: record["sent"].append(json.loads(payload)))
        ws.on("framereceived", lambda payload: self._received(record, json.loads(payload)))
        ws.on("close", lambda _ws: record.update(closed=time.monotonic()))
        self.sockets.append(record)

    def _received(self, record: dict[str, Any], message: dict[str, Any]) -> None:
        record["received"].append(message)
        if message.get("type") == "notice":
            self.notices.append((time.monotonic(), message))

    def _response(self, response: Any) -> None:
        if response.request.method == "HEAD" and response.url.endswith("/api/v1/live.sse"):
            self.probes.append((time.monotonic(), response.status, response.headers.get("retry-after")))

    def until(self, predicate: Any, timeout_s: float = 15.0) -> None:
        """Wait for *predicate* while Playwright delivers the page's events (it does so only inside its own
        calls: a plain sleep would hold them back and stamp them all late)."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert time.monotonic() < deadline, "condition never became true"
            self.page.wait_for_timeout(20)

    def last_cursor(self) -> str:
        received = [m for s in self.sockets for m in s["received"]]
        return next(m.get("id", m.get("cursor")) for m in reversed(received) if m.get("id", m.get("cursor")))

    def close(self, *, expected_errors: tuple[str, ...] = ()) -> None:
        self.context.close()
        unexpected = [e for e in self.errors if not any(x in e for x in expected_errors)]
        assert unexpected == [], unexpected


@contextlib.contextmanager
def _held(dep: Deployment, n: int):  # type: ignore[no-untyped-def]
    """*n* of ursula's live connections from another client (her limit is 4, across every web process)."""
    name, password = dep.user
    auth = {"Authorization": "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()}
    url = dep.base_url.replace("http://", "ws://") + "/api/v1/live"
    with contextlib.ExitStack() as stack:
        for _ in range(n):
            ws = stack.enter_context(connect(url, additional_headers=auth, open_timeout=10))
            ws.send(json.dumps({"cursor": None}))
            assert json.loads(ws.recv(timeout=10))["type"] == "hello"
        yield


def test_a_refused_page_asks_why_and_retries_only_after_retry_after(browser, deployment: Deployment) -> None:  # type: ignore[no-untyped-def]
    with _held(deployment, 4):
        p = Page(browser, deployment, wait_live=False)
        p.until(lambda: len(p.probes) >= 2 and len(p.sockets) >= 3, timeout_s=20)
        assert {(status, retry_after) for _, status, retry_after in p.probes} == {(429, "2")}
        # Each refused attempt is followed by a probe, and the next attempt comes Retry-After later.
        for before, after in zip(p.sockets, p.sockets[1:], strict=False):
            probe = next(t for t, _, _ in p.probes if t >= before["at"])
            assert probe < after["at"] and after["at"] - probe >= 1.95, (before["at"], probe, after["at"])
        assert p.page.inner_text("#live-state").startswith("○")
    # The others went away: the next attempt is admitted.
    p.page.wait_for_selector("#live-state.on", timeout=10_000)
    p.close(expected_errors=("429",))


def test_a_silent_connection_is_replaced_and_resumes(browser, deployment: Deployment) -> None:  # type: ignore[no-untyped-def]
    p = Page(browser, deployment)
    p.until(lambda: any(m["type"] == "heartbeat" for m in p.sockets[-1]["received"]))
    cursor = p.last_cursor()
    web = deployment.procs[0]
    os.killpg(web.pid, signal.SIGSTOP)  # the server goes silent; its connections stay open
    stopped_at = time.monotonic()
    try:
        p.until(lambda: len(p.sockets) >= 2, timeout_s=10)
        replaced_after = p.sockets[1]["at"] - stopped_at
        # 2.5 heartbeats after the last message (up to one heartbeat before the stop; checked each second).
        assert 1.4 <= replaced_after <= 5.0, replaced_after
    finally:
        os.killpg(web.pid, signal.SIGCONT)
    p.page.wait_for_selector("#live-state.on", timeout=10_000)
    p.until(lambda: p.sockets[-1]["sent"] != [])
    assert p.sockets[-1]["sent"][0] == {"cursor": cursor}  # resumed where it was
    p.close()


def test_a_hidden_page_is_quiet_and_resumes_when_shown(browser, deployment: Deployment) -> None:  # type: ignore[no-untyped-def]
    p = Page(browser, deployment, init_script=VISIBILITY)
    p.until(lambda: any(m["type"] == "hello" for m in p.sockets[-1]["received"]))
    cursor = p.last_cursor()
    p.page.evaluate("window.__tenureSetHidden(true)")
    p.until(lambda: p.sockets[-1]["closed"] is not None, timeout_s=5)
    hidden_at = time.monotonic()
    job = deployment.submit("e2e_echo", {"text": "while hidden"})["id"]
    p.until(lambda: time.monotonic() - hidden_at > 4)  # longer than the silence limit (2.5 s)
    quiet = [r for r in p.requests if r[0] > hidden_at]
    assert len(p.sockets) == 1 and quiet == [], quiet  # no new connection, no polling, nothing
    assert p.page.inner_text("#live-state").startswith("○")
    p.page.evaluate("window.__tenureSetHidden(false)")
    p.until(lambda: len(p.sockets) == 2 and p.sockets[1]["sent"] != [])
    assert p.sockets[1]["sent"][0] == {"cursor": cursor}  # resumes after the last cursor seen
    p.until(lambda: any(m.get("job_id") == job for m in p.sockets[1]["received"]))  # what it missed
    p.page.wait_for_selector(f"text={job[:8]}", timeout=10_000)
    p.close()


def test_a_page_whose_session_ended_stops_and_says_so(browser, deployment: Deployment) -> None:  # type: ignore[no-untyped-def]
    p = Page(browser, deployment)
    other_tab = p.context.new_page()  # the same browser session logs out in another tab
    other_tab.goto(deployment.base_url + "/jobs")
    other_tab.click("text=Log out")
    other_tab.wait_for_url("**/login")
    p.until(lambda: any(m.get("type") == "error" for m in p.sockets[0]["received"]), timeout_s=5)
    assert [m for m in p.sockets[0]["received"] if m["type"] == "error"][0]["code"] == "unauthorized"
    p.until(lambda: p.page.inner_text("#live-state") == "○ signed out", timeout_s=10)
    assert {status for _, status, _ in p.probes} == {401}
    attempts = len(p.sockets)
    p.until(lambda: False if time.monotonic() < p.probes[-1][0] + 3 else True)
    assert len(p.sockets) == attempts  # no more attempts
    p.close(expected_errors=("401", "HTTP Authentication failed"))


def test_a_list_refetched_for_a_notice_never_replaces_a_search_typed_since(browser, deployment: Deployment) -> None:  # type: ignore[no-untyped-def]
    """A notice re-fetches the job list a second later. When the person searches while that list is on
    its way and it answers first, the search's answer must still be what the table shows. Every list
    request is held, then let go in that order: the re-fetched list, then the search."""
    p = Page(browser, deployment, init_script=REFETCHES)
    page = p.page
    held: list[tuple[float, Any]] = []
    page.route(lambda url: urlsplit(url).path == "/jobs", lambda route: held.append((time.monotonic(), route)))
    other = deployment.submit("e2e_echo", {"text": "another job in the list"})
    job = deployment.submit("e2e_echo", {"text": "a notice for the list"})
    for submitted in (other["id"], job["id"]):
        deployment.wait_job(submitted, lambda j: j["status"] == "succeeded")
        p.until(lambda s=submitted: any(n["job_id"] == s and n["status"] == "succeeded" for _, n in p.notices))
    last_notice_at = max(at for at, _ in p.notices)
    p.until(lambda: any(at > last_notice_at for at, _ in held))  # the list asked for after the last notice
    refetched = [route for _, route in held]
    assert all("q=" not in route.request.url for route in refetched)

    page.locator("#q").press_sequentially(job["id"])
    p.until(lambda: len(held) > len(refetched))
    searched = [route for _, route in held[len(refetched) :]]
    assert all(f"q={job['id']}" in route.request.url for route in searched)
    for route in refetched:
        route.continue_()
    p.until(lambda: page.evaluate("window.__tenureRefetched") == len(refetched))
    for route in searched:
        route.continue_()

    rows = page.locator("#job-table tbody tr[id^=job-]")
    p.until(lambda: rows.count() == 1 and rows.first.get_attribute("id") == f"job-{job['id']}")
    assert f"q={job['id']}" in page.url
    p.close()
