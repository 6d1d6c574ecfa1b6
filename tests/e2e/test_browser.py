"""The UI in a real browser (Playwright driving Debian's chromium) against gunicorn + a dramatiq worker.

Covers the issue's acceptance walk: log in; submit each kind (with a validation error first);
watch a job's progress bar move live without a reload; cancel a running job; retry a failed one;
pause a queue and see jobs wait; bulk-cancel; replay a dead letter; tokens; log out. Screenshots
of the main pages go to docs/screenshots/ (referenced from docs/ui.md). No console errors allowed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import CHROMIUM, ROOT, Deployment

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
playwright_api = pytest.importorskip("playwright.sync_api")
SHOTS = ROOT / "docs" / "screenshots"


@pytest.fixture(scope="module")
def browser() -> Iterator:  # type: ignore[type-arg]
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (scripts/install_browser.sh)")
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-background-networking"])
        yield b
        b.close()


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
        name, password = dep.admin if who == "admin" else dep.user
        self.page.goto(dep.base_url + "/login")
        self.page.fill("#username", name)
        self.page.fill("#password", password)
        self.page.click("button[type=submit]")
        self.page.wait_for_url("**/jobs")
        self.page.wait_for_selector("#live-state.on")  # the live feed is connected

    def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)

    def close(self) -> None:
        self.context.close()
        assert self.errors == [], self.errors


def _wait_until(predicate, timeout_s: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    """Poll the page from Python (the app's CSP forbids the eval that wait_for_function needs)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.05)


def test_login_page_and_keyboard(browser, deployment: Deployment) -> None:  # type: ignore[no-untyped-def]
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    page.goto(deployment.base_url + "/jobs")
    page.wait_for_url("**/login?next=*")
    (SHOTS).mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "login.png"))
    page.fill("#username", "admin")
    page.fill("#password", "wrong password")
    page.keyboard.press("Enter")  # submit from the keyboard
    page.wait_for_selector(".flash.error")
    assert "Invalid user name or password" in page.inner_text(".flash.error")
    context.close()


def test_submit_each_kind_and_watch_progress_live(browser, deployment: Deployment) -> None:  # type: ignore[no-untyped-def]
    s = Session(browser, deployment, "user")
    page = s.page
    page.click("text=Submit")
    page.wait_for_url("**/submit")
    s.shot("submit")
    kinds = page.locator(".kinds a").all_inner_texts()
    assert {"Count through steps", "Always fail", "Echo text"} <= set(kinds)
    # Echo: a validation message first, then a valid submit.
    page.click("text=Echo text")
    page.click("#submit-btn")  # the required text is empty
    page.wait_for_selector(".field.invalid")
    s.shot("submit-validation")
    assert "This field is required." in page.inner_text(".field.invalid")
    page.fill("#p_text", "hello")
    page.fill("#p_times", "2")
    page.click("#submit-btn")
    page.wait_for_url("**/jobs/*")
    echo_id = page.url.rsplit("/", 1)[1]
    # Fail: defaults are enough.
    page.goto(deployment.base_url + "/submit/e2e_fail")
    page.click("#submit-btn")
    page.wait_for_url("**/jobs/*")
    # Progress: a long one, watched live on its detail page.
    page.goto(deployment.base_url + "/submit/e2e_progress")
    page.fill("#p_steps", "40")
    page.fill("#p_step_s", "0.15")
    page.click("#submit-btn")
    page.wait_for_url("**/jobs/*")
    navigations: list[str] = []  # a reload would show up here
    page.on("framenavigated", lambda frame: navigations.append(frame.url) if frame == page.main_frame else None)
    page.wait_for_selector("#job-panel progress[value]")
    first = float(page.get_attribute("#job-panel progress", "value") or 0)
    _wait_until(lambda: float(page.get_attribute("#job-panel progress", "value") or 0) > first + 0.2)
    s.shot("job-running")
    page.locator("#job-panel .status", has_text="succeeded").wait_for(timeout=20_000)
    assert navigations == []  # the bar moved and the job finished without a reload
    assert page.locator("#job-panel .files a").inner_text() == "1-report.txt"
    s.shot("job-succeeded")
    deployment.wait_job(echo_id, lambda j: j["status"] == "succeeded")
    page.goto(deployment.base_url + "/jobs")
    s.shot("jobs")
    s.close()


def test_cancel_running_and_retry_failed(browser, deployment: Deployment) -> None:  # type: ignore[no-untyped-def]
    s = Session(browser, deployment, "user")
    page = s.page
    running = deployment.submit("e2e_progress", {"steps": 200, "step_s": 0.1})
    deployment.wait_job(running["id"], lambda j: j["status"] == "running")
    page.goto(f"{deployment.base_url}/jobs/{running['id']}")
    page.click("#cancel-btn")
    page.locator("#job-panel .status", has_text="cancelled").wait_for()
    assert page.locator("#retry-btn").is_visible() and page.locator("#cancel-btn").count() == 0
    failed = deployment.submit("e2e_fail", {"message": "the disk is full"})
    deployment.wait_job(failed["id"], lambda j: j["status"] == "failed")
    page.goto(f"{deployment.base_url}/jobs/{failed['id']}")
    assert "the disk is full" in page.inner_text(".error-text")
    s.shot("job-failed")
    page.click("#retry-btn")
    page.wait_for_url(lambda url: failed["id"] not in url and "/jobs/" in url)
    assert failed["id"] in page.inner_text(".facts")  # "Retry of" links the old job
    s.close()


def test_pause_queue_bulk_cancel_and_resume(browser, deployment: Deployment) -> None:  # type: ignore[no-untyped-def]
    admin = Session(browser, deployment, "admin")
    page = admin.page
    page.goto(deployment.base_url + "/ops/queues")
    page.click("#pause-e2e_slow")
    page.wait_for_selector("#resume-e2e_slow")
    waiting = [deployment.submit("e2e_echo", {"text": f"w{i}"}) for i in range(3)]
    time.sleep(1.5)  # a worker is idle and would have run them by now
    assert all(deployment.api("GET", f"/api/v1/jobs/{j['id']}")["status"] == "queued" for j in waiting)
    page.reload()
    assert page.inner_text("#queue-e2e_slow").split("\t")[1].strip() == "3"  # ready, waiting
    admin.shot("ops-queues")
    page.goto(deployment.base_url + "/jobs?kind=e2e_echo&status=queued")
    for job in waiting:
        page.check(f"#job-{job['id']} input[name=ids]")
    page.click("#bulk-cancel")
    page.wait_for_selector(".flash.info")
    assert "Cancelled 3 job(s)" in page.inner_text(".flash.info")
    assert all(deployment.api("GET", f"/api/v1/jobs/{j['id']}")["status"] == "cancelled" for j in waiting)
    after = deployment.submit("e2e_echo", {"text": "after"})
    page.goto(deployment.base_url + "/ops/queues")
    page.click("#resume-e2e_slow")
    page.wait_for_selector("#pause-e2e_slow")
    deployment.wait_job(after["id"], lambda j: j["status"] == "succeeded")
    admin.close()


def test_replay_dead_letter_and_ops_pages(browser, deployment: Deployment) -> None:  # type: ignore[no-untyped-def]
    import dramatiq

    from broker import SQLiteBroker

    flag = deployment.tmp / "flag"
    producer = SQLiteBroker(deployment.env["TENURE_DATABASE_URL"], middleware=[])
    producer.declare_queue("e2e")
    producer.enqueue(
        dramatiq.Message(queue_name="e2e", actor_name="e2e_flaky", args=(str(flag),), kwargs={}, options={})
    )
    producer.close()
    deadline = time.monotonic() + 15
    while not (dead := deployment.api("GET", "/api/v1/dead?queue=e2e")):
        assert time.monotonic() < deadline, "the message was never dead-lettered"
        time.sleep(0.1)
    flag.write_text("now it works")
    admin = Session(browser, deployment, "admin")
    page = admin.page
    page.goto(deployment.base_url + "/ops/dead")
    admin.shot("ops-dead")
    page.click(f"#replay-{dead[0]['id']}")
    page.wait_for_selector(".flash.info")
    deadline = time.monotonic() + 15
    while not flag.with_suffix(".done").exists():
        assert time.monotonic() < deadline, "the replayed message never ran"
        time.sleep(0.1)
    for path, name in (("/ops", "ops-overview"), ("/ops/workers", "ops-workers"), ("/ops/schedules", "ops-schedules")):
        page.goto(deployment.base_url + path)
        admin.shot(name)
    assert "0 3 * * *" in page.inner_text("table")  # the declared cron schedule, with its next fire
    page.click("#run-nightly_echo")
    page.wait_for_url("**/jobs/*")  # "Run now" submitted a job
    assert "e2e_echo" in page.inner_text(".facts")
    page.goto(deployment.base_url + "/ops")
    assert page.locator("svg.chart").count() == 3
    page.goto(deployment.base_url + "/tokens")
    page.fill("#name", "ci")
    page.click("text=Create token")
    secret = page.inner_text("#new-token")
    assert secret.startswith("tnr_")
    admin.shot("tokens")
    page.reload()
    assert secret not in page.content()  # shown once
    page.click("#logout")
    page.wait_for_url("**/login")
    admin.close()


def test_mobile_360px(browser, deployment: Deployment) -> None:  # type: ignore[no-untyped-def]
    deployment.submit("e2e_echo", {"text": "small screen"})
    s = Session(browser, deployment, "admin", width=360, height=740)
    page = s.page
    for path, name in (("/jobs", "mobile-jobs"), ("/ops", "mobile-ops")):
        page.goto(deployment.base_url + path)
        width = page.locator("html").evaluate("el => el.scrollWidth")
        assert width <= 362, path
        s.shot(name)
    page.goto(deployment.base_url + "/jobs")
    first = page.locator("tbody tr a").first
    first.focus()
    page.keyboard.press("Enter")
    page.wait_for_url("**/jobs/*")
    s.close()


def test_no_credentials_in_logs(deployment: Deployment) -> None:
    """After the whole walk (logins, Basic and bearer API calls), no password or token was logged."""
    logs = (deployment.tmp / "web.log").read_text() + (deployment.tmp / "worker.log").read_text()
    assert "Authorization" not in logs
    for secret in (deployment.admin[1], deployment.user[1], deployment.admin_token):
        assert secret not in logs
    assert "POST /login" in logs  # the access log is there, just without secrets
