"""What the browser tests share (their Chromium is the ``browser`` fixture of conftest.py): a logged-in
page that records console errors, and polling from Python (the app's CSP forbids the eval that
``wait_for_function`` needs)."""

from __future__ import annotations

import time

from . import screenshots
from .conftest import Deployment


class Session:
    """One logged-in browser page that records console errors."""

    def __init__(self, browser, dep: Deployment, who: str, *, width: int = 1280, height: int = 860) -> None:  # type: ignore[no-untyped-def]
        self.dep = dep
        self.context = browser.new_context(viewport={"width": width, "height": height})
        self.page = self.context.new_page()
        self.page.set_default_timeout(15_000)
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        name, password = dep.login_of(who)
        self.page.goto(dep.base_url + "/login")
        self.page.fill("#username", name)
        self.page.fill("#password", password)
        self.page.click("button[type=submit]")
        self.page.wait_for_url("**/jobs")
        self.page.wait_for_selector("#live-state.on")  # the live feed is connected

    def shot(self, name: str) -> None:
        # caret="initial": hiding the caret, Playwright injects an inline style, which the CSP refuses
        screenshots.save(self.page, name, full_page=True, caret="initial")

    def close(self) -> None:
        self.context.close()
        assert self.errors == [], self.errors


def _wait_until(predicate, timeout_s: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    """Poll the page from Python (the app's CSP forbids the eval that wait_for_function needs)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.05)
