"""The UI in a real browser (Playwright driving Debian's chromium) against gunicorn + a dramatiq worker.

Covers the issue's acceptance walk: log in; submit each kind (with a validation error first);
watch a job's progress bar move live without a reload; cancel a running job; retry a failed one;
pause a queue and see jobs wait; bulk-cancel; replay a dead letter; tokens; log out. Then
issue 19's: a schedule's fire history links the job each fire made and a paused schedule has no next
fire; dead letters show a redacted preview and are replayed and purged by filter after a dry run;
non-ASCII text stays text; settings read on/off; at 390 px no page is wider than the screen and every
control is on it; the submit form checks the kind's rules in the browser before sending (and the API
refuses the same payloads with the reason); the media kinds' forms say what their OpenAPI schemas say;
a failure's error in the list; deleting a finished job from its page; a scheduler back after downtime
shows the ticks it skipped. Then issue 16's: a viewer sees no action buttons, an operator pauses a queue
but cannot change settings, and the audit page shows both attempts. Screenshots of every page (1280
and 390 px) go to docs/screenshots/ (referenced from docs/ui.md), written only when their layout changed
(tests/e2e/screenshots.py). No console errors allowed (but the 403 of a page a test opens to be refused).
"""

from __future__ import annotations

import time

import pytest

from . import screenshots
from .browsing import Session, _wait_until
from .conftest import Deployment

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_login_page_and_keyboard(browser, deployment: Deployment) -> None:  # type: ignore[no-untyped-def]
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    page.goto(deployment.base_url + "/jobs")
    page.wait_for_url("**/login?next=*")
    screenshots.save(page, "login")
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
    # A click waits for the form, not its deferred script: until submit.js takes the form over, the browser's own
    # bubble answers the empty field instead of the message at the field.
    page.wait_for_function("document.querySelector('form[data-validate]')?.noValidate === true")
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


def _jobs_of(deployment: Deployment, kind: str) -> list[str]:
    return [j["id"] for j in deployment.api("GET", f"/api/v1/jobs?kind={kind}&limit=200", who="user")["items"]]


def _field_error(page, name: str) -> str:  # type: ignore[no-untyped-def]
    """The message shown under the input ``p_<name>`` ("" when there is none)."""
    errors = page.locator(".field", has=page.locator(f"#p_{name}")).locator(".error")
    return " ".join(errors.all_inner_texts())


def test_the_submit_form_checks_the_kinds_rules_before_sending(browser, deployment: Deployment) -> None:  # type: ignore[no-untyped-def]
    s = Session(browser, deployment, "user")
    page = s.page
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    before = {k: _jobs_of(deployment, k) for k in ("recording_pipeline", "render_clip")}
    # A width of -5 (the schema's bounds are 16..7680): the message at the field, nothing sent
    page.goto(deployment.base_url + "/submit/recording_pipeline")
    page.fill("#p_folder", "/recordings/23058-session-2026")
    page.fill("#p_width", "-5")
    page.click("#submit-btn")
    assert _field_error(page, "width") == "Must be between 16 and 7680."
    assert page.get_attribute("#p_width", "aria-invalid") == "true"
    assert page.locator("#p_width").evaluate("el => el === document.activeElement")  # focused, to fix it
    assert _field_error(page, "folder") == ""
    # A clip window whose end is not after its start; a required field left empty
    page.goto(deployment.base_url + "/submit/render_clip")
    page.fill("#p_start_s", "10")
    page.fill("#p_end_s", "10")
    page.click("#submit-btn")
    assert _field_error(page, "end_s") == "Must be after Start (10 s)."
    assert _field_error(page, "session_id") == "This field is required."
    s.shot("submit-checked")
    # Correcting the start clears the end's message as it is typed (the field is checked again)
    page.fill("#p_start_s", "2.5")
    assert _field_error(page, "end_s") == ""
    page.fill("#p_end_s", "1")
    page.click("#submit-btn")
    assert _field_error(page, "end_s") == "Must be after Start (2.5 s)."
    assert posts == [] and page.url.endswith("/submit/render_clip")
    assert {k: _jobs_of(deployment, k) for k in before} == before  # no job was created
    s.close()
    # The API (the authority) refuses the same payloads with the reason, per field
    for kind, payload, field, reason in (
        ("recording_pipeline", {"folder": "/recordings/x", "width": -5}, "width", "Must be at least 16."),
        ("render_clip", {"session_id": "s", "start_s": 10, "end_s": 10}, "end_s", "Must be after Start (10 s)."),
        ("render_clip", {"session_id": "s", "start_s": 10, "end_s": 4}, "end_s", "Must be after Start (10 s)."),
        ("recording_pipeline", {"folder": "/r", "start_s": 9, "end_s": 2}, "end_s", "Must be after Clip start (9 s)."),
        ("transcribe", {"session_id": "s", "segment": 0, "end_s": 0}, "end_s", "Must be after From (0 s)."),
    ):
        status, answer = deployment.call("POST", "/api/v1/jobs", {"kind": kind, "payload": payload}, who="user")
        assert status == 422 and answer["error"]["code"] == "validation_error", (kind, status, answer)
        assert answer["error"]["message"] == "The payload does not fit this kind."
        assert answer["error"]["details"] == {field: [reason]}, (kind, answer)
    assert {k: _jobs_of(deployment, k) for k in before} == before


#: The media workbench's kinds (tasks/): their forms are generated from their payload schemas.
MEDIA_KINDS = ("import_recording", "transcribe", "render_clip", "recording_pipeline", "notify_webhook", "notify_email")
#: What a docstring would leak into a form.
DOCSTRING_FRAGMENTS = ("Raises:", "Args:", "Returns:", "Parameters:", ":func:", ":class:", ":mod:", "``")


def test_media_kinds_forms_say_what_their_openapi_schemas_say(browser, deployment: Deployment) -> None:  # type: ignore[no-untyped-def]
    doc = deployment.api("GET", "/api/openapi.json")
    request_schemas = {v["title"]: v["properties"]["payload"] for v in doc["components"]["schemas"]["Submit"]["oneOf"]}
    s = Session(browser, deployment, "user")
    page = s.page
    units: set[str] = set()
    for kind in MEDIA_KINDS:
        schema = request_schemas[kind]
        page.goto(f"{deployment.base_url}/submit/{kind}")
        text = page.inner_text("main")
        assert not [f for f in DOCSTRING_FRAGMENTS if f in text], (kind, text)
        assert page.inner_text("h1") == schema["title"]
        description = page.inner_text("main > p.muted")
        assert description and schema["description"].startswith(description), kind  # then "Also: <rule>"
        names = page.locator(".field :is(input, select, textarea)").evaluate_all("els => els.map(e => e.name)")
        assert [n for n in names if n.startswith("p_")] == [f"p_{n}" for n in schema["properties"]], kind
        for name, prop in schema["properties"].items():
            field = page.locator(".field", has=page.locator(f"#p_{name}"))
            control = page.locator(f"#p_{name}")
            label = field.locator("label").first.inner_text().strip()
            expected = f"{prop['title']} ({prop['x-unit']})" if "x-unit" in prop else prop["title"]
            assert label == expected, (kind, name, label)
            units.update([prop["x-unit"]] if "x-unit" in prop else [])
            help_text = field.locator(f"#p_{name}-help").inner_text()
            assert help_text and help_text == prop.get("description", help_text), (kind, name, help_text)
            assert (control.get_attribute("required") is not None) == (name in schema.get("required", [])), name
            low = prop.get("minimum", prop.get("exclusiveMinimum"))
            for attribute, bound in (("min", low), ("max", prop.get("maximum"))):
                shown = control.get_attribute(attribute)
                assert (None if shown is None else float(shown)) == bound, (kind, name, attribute)
            assert control.get_attribute("data-exclusive-min") == (
                None if "exclusiveMinimum" not in prop else f"{prop['exclusiveMinimum']:g}"
            ), (kind, name)
            assert control.get_attribute("data-after") == (f"p_{prop['x-after']}" if "x-after" in prop else None)
    assert units == {"s", "px"}
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


def test_a_failure_shows_its_error_in_the_list_and_a_finished_job_is_deleted_from_its_page(  # type: ignore[no-untyped-def]
    browser, deployment: Deployment
) -> None:
    finished = deployment.submit("e2e_echo", {"text": "to be deleted"})
    deployment.wait_job(finished["id"], lambda j: j["status"] == "succeeded")
    # (a newer change than the finished job's own: the live feed's newest entry is never deleted on SQLite)
    failed = deployment.submit("e2e_fail", {"message": "the tape ran out at 01:02:03"})
    deployment.wait_job(failed["id"], lambda j: j["status"] == "failed")
    s = Session(browser, deployment, "user")
    page = s.page
    page.goto(deployment.base_url + "/jobs")
    assert page.inner_text(f"#job-{failed['id']} td.err") == "RuntimeError: the tape ran out at 01:02:03"
    assert page.inner_text(f"#job-{finished['id']} td.err") == ""  # only failures have one
    page.goto(f"{deployment.base_url}/jobs/{finished['id']}")
    page.click("#delete-btn")
    page.wait_for_url("**/jobs")
    assert f"Deleted job {finished['id']}." in page.inner_text(".flash.info")
    assert page.locator(f"#job-{finished['id']}").count() == 0
    assert deployment.call("GET", f"/api/v1/jobs/{finished['id']}", who="user")[0] == 404
    # A failed job's page offers Delete too; a running one's does not
    page.goto(f"{deployment.base_url}/jobs/{failed['id']}")
    assert page.locator("#delete-btn").is_visible()
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
    assert page.inner_text("#queue-e2e_slow .ready").strip() == "3"  # ready, waiting
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
    page.click(f"#replay-{dead[0]['id']}")
    page.wait_for_selector(".flash.info")
    deadline = time.monotonic() + 15
    while not flag.with_suffix(".done").exists():
        assert time.monotonic() < deadline, "the replayed message never ran"
        time.sleep(0.1)
    for path, name in (
        ("/ops", "ops-overview"),
        ("/ops/workers", "ops-workers"),
        ("/ops/settings", "ops-settings"),
        ("/jobs/bulk-by-filter?action=retry&status=failed", "jobs-bulk"),  # the dry run before a bulk retry
    ):
        page.goto(deployment.base_url + path)
        admin.shot(name)
    assert "job(s) match the filters" in page.inner_text("#dry-run")
    page.goto(deployment.base_url + "/ops/schedules")  # its screenshot shows a fire history, taken later
    assert "0 3 * * *" in page.inner_text("#schedule-nightly_echo")  # the declared cron schedule
    assert page.inner_text("#schedule-nightly_echo .next-fire").startswith("in ")
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
    for path in ("/jobs", "/ops"):  # the screenshots are taken at 390 px, below
        page.goto(deployment.base_url + path)
        width = page.locator("html").evaluate("el => el.scrollWidth")
        assert width <= 362, path
    page.goto(deployment.base_url + "/jobs")
    first = page.locator("tbody tr a").first
    first.focus()
    page.keyboard.press("Enter")
    page.wait_for_url("**/jobs/*")
    s.close()


def test_a_scheduler_back_after_downtime_shows_the_ticks_it_skipped(browser, deployment: Deployment) -> None:  # type: ignore[no-untyped-def]
    """A scheduler (the class ``periodiq`` drives, on the deployment's database) that fired the hourly
    schedule three hours ago, then ran no more until now: "latest" fires the newest missed tick and
    records the two before it as skipped; the schedules page shows both rows."""
    from broker import SQLiteBroker
    from jobs.db import make_engine
    from tasks.scheduling import Scheduler, install

    from .apps.hourly import declare_hourly_tick

    hour = 3600 * 1000
    now = int(time.time() * 1000)
    last_hour = now // hour * hour
    clock = [last_hour - 3 * hour - 20 * 60 * 1000]
    url = deployment.env["TENURE_DATABASE_URL"]
    broker = SQLiteBroker(url, middleware=[])
    install(broker)
    spec = declare_hourly_tick(broker).options["periodic"]
    scheduler = Scheduler(broker, make_engine(url), clock=lambda: clock[0], owner="scheduler-e2e:1")
    try:
        assert scheduler.fire_due(spec) == []  # its first wake: the schedule starts here
        clock[0] = last_hour - 3 * hour + 2_000
        (on_time,) = scheduler.fire_due(spec)
        clock[0] = now  # three hours later, the scheduler is back
        (back,) = scheduler.fire_due(spec)
    finally:
        scheduler.engine.dispose()
        broker.close()
    assert (on_time.fire_time, on_time.skipped) == (last_hour - 3 * hour, 0)
    assert (back.fire_time, back.skipped, back.skipped_from) == (last_hour, 2, last_hour - 2 * hour)
    admin = Session(browser, deployment, "admin")
    page = admin.page
    page.goto(deployment.base_url + "/ops/schedules")
    card = page.locator("#schedule-hourly_tick")
    results = card.locator("tr[class^=fire-] .status").all_inner_texts()
    assert results == ["fired", "skipped", "fired"], results
    skipped = card.locator("tr.fire-skipped")
    assert "2 tick(s) before this fire never fired" in skipped.inner_text()
    tick_at = time.strftime("%Y-%m-%d %H:%M", time.gmtime((last_hour - 2 * hour) / 1000))
    assert skipped.locator("time").get_attribute("datetime").startswith(tick_at.replace(" ", "T"))
    assert card.locator(".next-fire").inner_text().startswith("in ")  # the next hour, planned at the wake
    admin.close()


def test_schedule_history_links_its_job_and_a_paused_schedule_has_no_next_fire(  # type: ignore[no-untyped-def]
    browser, deployment: Deployment
) -> None:
    fire = deployment.api("POST", "/api/v1/schedules/nightly_echo/run")
    admin = Session(browser, deployment, "admin")
    page = admin.page
    page.goto(deployment.base_url + "/ops/schedules")
    card = page.locator("#schedule-nightly_echo")
    assert "latest" in card.locator(".catchup").inner_text() and "1 h" in card.locator(".catchup").inner_text()
    assert card.locator(".jitter").inner_text().startswith("none")
    # The fire history has a "fired" entry whose link opens the job that fire submitted
    fired = card.locator("tr.fire-fired", has=page.locator(f"a[href='/jobs/{fire['job_id']}']"))
    assert fired.locator(".status").inner_text() == "fired" and "run now" in fired.inner_text()
    fired.locator("a").click()
    page.wait_for_url(f"**/jobs/{fire['job_id']}")
    assert "e2e_echo" in page.inner_text(".facts")
    # Paused: no next fire anywhere (page and API), until resumed
    page.goto(deployment.base_url + "/ops/schedules")
    page.click("#pause-nightly_echo")
    page.wait_for_selector("#resume-nightly_echo")
    next_fire = page.inner_text("#schedule-nightly_echo .next-fire")
    assert next_fire.startswith("none while paused") and " in " not in f" {next_fire}"
    (view,) = [s for s in deployment.api("GET", "/api/v1/schedules") if s["name"] == "nightly_echo"]
    assert view["paused"] and view["next_fire_at"] is None
    assert view["fires"][0]["job_id"] == fire["job_id"] and view["fires"][0]["cause"] == "manual"
    admin.shot("ops-schedules")
    page.click("#resume-nightly_echo")
    page.wait_for_selector("#pause-nightly_echo")
    assert page.inner_text("#schedule-nightly_echo .next-fire").startswith("in ")
    admin.close()


def test_dead_letter_preview_replay_all_and_purge_after_a_dry_run(browser, deployment: Deployment) -> None:  # type: ignore[no-untyped-def]
    import dramatiq

    from broker import SQLiteBroker

    flag = deployment.tmp / "bulk-flag"
    secret_url = "postgres://bob:hunter2-db-pass@db.internal/media"
    producer = SQLiteBroker(deployment.env["TENURE_DATABASE_URL"], middleware=[])
    producer.declare_queue("e2e")
    for _ in range(3):
        producer.enqueue(
            dramatiq.Message(queue_name="e2e", actor_name="e2e_flaky", args=(str(flag),), kwargs={}, options={})
        )
    # One that can never run: an unknown keyword argument carrying a token, and a credential in an argument
    poison = producer.enqueue(
        dramatiq.Message(
            queue_name="e2e",
            actor_name="e2e_flaky",
            args=(secret_url,),
            kwargs={"api_token": "tnr_e2e_secret_value"},
            options={},
        )
    )
    producer.close()
    deadline = time.monotonic() + 15
    while len(deployment.api("GET", "/api/v1/dead?queue=e2e&actor=e2e_flaky")) < 4:
        assert time.monotonic() < deadline, "the messages were never dead-lettered"
        time.sleep(0.1)
    admin = Session(browser, deployment, "admin")
    page = admin.page
    page.goto(deployment.base_url + "/ops/dead?queue=e2e&actor=e2e_flaky")
    # The preview: identifiers, timestamps and the error's last line; secrets masked, no raw body
    row = page.locator("tr", has=page.locator(f"code:text-is('{poison.message_id}')"))
    row.locator("summary").click()
    preview = row.locator(".preview").inner_text()
    assert "TypeError" in preview and "Enqueued" in preview and "api_token=***" in preview
    assert "postgres://bob:***@db.internal/media" in preview
    for leak in ("hunter2-db-pass", "tnr_e2e_secret_value", "Traceback"):
        assert leak not in page.content()
    admin.shot("ops-dead")
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.locator("html").evaluate("el => el.scrollWidth") <= 390
    admin.shot("mobile-dead")
    page.set_viewport_size({"width": 1280, "height": 860})
    # Replay all matching: the dry run counts 4 and changes nothing; confirming replays them
    page.click("#dead-replay-all")
    page.wait_for_url("**/ops/dead/bulk?*")
    assert "4 dead letter(s) match" in page.inner_text("#dry-run")
    assert len(deployment.api("GET", "/api/v1/dead?queue=e2e&actor=e2e_flaky")) == 4
    admin.shot("ops-dead-bulk")
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.locator("html").evaluate("el => el.scrollWidth") <= 390
    admin.shot("mobile-dead-bulk")
    page.set_viewport_size({"width": 1280, "height": 860})
    flag.write_text("now it works")
    page.click("#confirm-dead-bulk")
    page.wait_for_selector(".flash.info")
    assert "Replayed 4 of 4 matching dead letter(s)." in page.inner_text(".flash.info")
    # Three run now; the poison one dies again. The API's dry run counts it; purge deletes only it
    deadline = time.monotonic() + 15
    while [d["message_id"] for d in deployment.api("GET", "/api/v1/dead?queue=e2e&actor=e2e_flaky")] != [
        poison.message_id
    ]:
        assert time.monotonic() < deadline, "the replayed messages did not settle"
        time.sleep(0.1)
    body = {"filter": {"queue": "e2e", "actor": "e2e_flaky"}, "dry_run": True}
    dry = deployment.api("POST", "/api/v1/dead/bulk/purge", body)
    assert (dry["dry_run"], dry["matched"], dry["affected"]) == (True, 1, 1)
    page.goto(deployment.base_url + "/ops/dead?queue=e2e&actor=e2e_flaky")
    page.click("#dead-purge-all")
    assert "1 dead letter(s) match" in page.inner_text("#dry-run")
    page.click("#confirm-dead-bulk")
    page.wait_for_selector(".flash.info")
    assert "Purged 1 of 1 matching dead letter(s)." in page.inner_text(".flash.info")
    assert deployment.api("GET", "/api/v1/dead?queue=e2e&actor=e2e_flaky") == []
    assert page.locator("td.empty").inner_text() == "No dead letters match."
    admin.close()


PAGES_390 = (
    "/jobs",
    "/jobs/{job}",
    "/submit",
    "/submit/e2e_echo",
    "/submit/render_clip",
    "/jobs/bulk-by-filter?action=retry&status=failed",
    "/ops",
    "/ops/queues",
    "/ops/dead",
    "/ops/dead/bulk?action=purge",
    "/ops/workers",
    "/ops/schedules",
    "/ops/settings",
    "/tokens",
    "/users",
    "/audit",
)
#: Pages whose 390 px screenshot docs/ui.md shows (dead letters and their bulk confirmation: taken with
#: letters, in the test above; the login page: below, logged out).
SHOTS_390 = {
    "/jobs": "mobile-jobs",
    "/jobs/{job}": "mobile-job",
    "/submit": "mobile-submit",
    "/submit/render_clip": "mobile-submit-form",
    "/jobs/bulk-by-filter?action=retry&status=failed": "mobile-jobs-bulk",
    "/ops": "mobile-ops",
    "/ops/queues": "mobile-queues",
    "/ops/workers": "mobile-workers",
    "/ops/settings": "mobile-settings",
    "/ops/schedules": "mobile-schedules",
    "/tokens": "mobile-tokens",
    "/users": "mobile-users",
    "/audit": "mobile-audit",
}


def test_every_page_fits_390px_with_its_controls_on_screen(browser, deployment: Deployment) -> None:  # type: ignore[no-untyped-def]
    # A failed job with a long error, an attempt and CJK text in its result's neighbour, the job page's widest case
    job = deployment.submit("e2e_fail", {"message": "录制 session 2026: " + "the disk is full " * 8})
    echo = deployment.submit("e2e_echo", {"text": "录制 «session» 2026"})
    deployment.wait_job(job["id"], lambda j: j["status"] == "failed")
    deployment.wait_job(echo["id"], lambda j: j["status"] == "succeeded")
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    page.goto(deployment.base_url + "/login")
    assert page.locator("html").evaluate("el => el.scrollWidth") <= 390, "/login"
    screenshots.save(page, "mobile-login", full_page=True, caret="initial")
    context.close()
    s = Session(browser, deployment, "admin", width=390, height=844)
    page = s.page
    for path in PAGES_390:
        page.goto(deployment.base_url + path.format(job=job["id"]))
        assert page.locator("html").evaluate("el => el.scrollWidth") <= 390, path
        # Every button, input and select is on the screen, not in a table scrolled off to the right
        right = page.locator("main button, main input:not([type=hidden]), main select, main a.button").evaluate_all(
            "els => Math.max(0, ...els.map(e => e.getBoundingClientRect().right))"
        )
        assert right <= 390, (path, right)
        if path in SHOTS_390:
            s.shot(SHOTS_390[path])
    # Non-ASCII text is shown as text, on the page and in the API's JSON
    page.goto(f"{deployment.base_url}/jobs/{echo['id']}")
    assert "录制 «session» 2026" in page.inner_text("pre.result")
    assert "\\u5f55" not in page.content()
    # Settings in the UI's words: on/off, and "at once" for a queue pause (as docs/operations.md says)
    page.goto(deployment.base_url + "/ops/settings")
    row = page.locator("[id='setting-queues.e2e_slow.paused']")
    assert row.locator(".effective").inner_text() == "off" and row.locator(".effect").inner_text() == "at once"
    assert row.locator("select option").all_inner_texts() == ["not saved", "on", "off"]
    s.close()


def _refused_pages_only(session: Session) -> None:
    """The console errors are the 403s of the pages the test opened to be refused, and nothing else."""
    assert session.errors and all("403" in e for e in session.errors), session.errors
    session.errors.clear()


def test_what_each_role_sees_and_the_audit_page_shows(browser, deployment: Deployment) -> None:  # type: ignore[no-untyped-def]
    """A viewer sees no action buttons; an operator pauses a queue but cannot change settings; the admin's
    audit page shows both of the operator's attempts."""
    failed = deployment.submit("e2e_fail", {"message": "viewer test"})
    deployment.wait_job(failed["id"], lambda j: j["status"] == "failed")
    viewer = Session(browser, deployment, "viewer")
    page = viewer.page
    nav = page.inner_text("header nav")
    assert "Jobs" in nav and "Operations" in nav and "Tokens" in nav
    assert "Submit" not in nav and "Users" not in nav and "Audit" not in nav
    assert page.locator("#bulk").count() == 0 and page.locator("input[name=ids]").count() == 0
    assert page.locator(f"#job-{failed['id']}").count() == 1  # a viewer reads everyone's jobs
    page.goto(f"{deployment.base_url}/jobs/{failed['id']}")
    assert page.locator("#job-panel button").count() == 0 and page.locator("#no-actions").is_visible()
    for path in ("/ops/queues", "/ops/dead", "/ops/schedules", "/ops/workers"):
        page.goto(deployment.base_url + path)
        assert page.locator("main form[method=post] button").count() == 0, path
        assert page.locator("#subnav-settings").count() == 0, path
    page.goto(deployment.base_url + "/submit")
    assert "needs the jobs.submit permission" in page.inner_text("main")
    _refused_pages_only(viewer)
    viewer.close()

    operator = Session(browser, deployment, "operator")
    page = operator.page
    nav = page.inner_text("header nav")
    assert "Operations" in nav and "Submit" in nav and "Users" not in nav and "Audit" not in nav
    page.goto(deployment.base_url + "/ops/queues")
    assert page.locator("#subnav-settings").count() == 0
    page.click("#pause-e2e")
    page.wait_for_selector("#resume-e2e")
    assert "Queue e2e paused." in page.inner_text(".flash.info")
    assert next(q for q in deployment.api("GET", "/api/v1/queues") if q["queue"] == "e2e")["paused"]
    page.click("#resume-e2e")
    page.wait_for_selector("#pause-e2e")
    # Settings: the page is refused, and so is a save posted from this session (with its CSRF token)
    revision = deployment.api("GET", "/api/v1/settings")["revision"]
    page.goto(deployment.base_url + "/ops/settings")
    assert "needs the settings.change permission" in page.inner_text("main")
    csrf = page.get_attribute("meta[name=csrf-token]", "content")
    posted = page.request.post(
        deployment.base_url + "/ops/settings",
        form={"csrf_token": csrf or "", "expected_revision": str(revision), "v:retention.audit_days": "1"},
        max_redirects=0,
    )
    assert posted.status == 403
    assert deployment.api("GET", "/api/v1/settings")["revision"] == revision
    _refused_pages_only(operator)
    operator.close()

    admin = Session(browser, deployment, "admin")
    page = admin.page
    page.click("#nav-audit")
    page.wait_for_url("**/audit")
    page.fill("input[name=actor]", "otto")
    page.click("#audit-filters button[type=submit]")
    page.wait_for_url("**/audit?*")
    rows = {
        (r.get_attribute("data-action"), r.get_attribute("data-outcome")) for r in page.locator("tr.audit-row").all()
    }
    assert {("queue.pause", "ok"), ("queue.resume", "ok"), ("settings.save", "refused"), ("access", "refused")} <= rows
    refused = page.locator("tr.audit-row[data-action='settings.save']").first.inner_text()
    assert "needs the settings.change permission" in refused and "via session" in refused
    admin.shot("audit")
    page.click("#nav-users")
    page.wait_for_url("**/users")
    assert page.locator("#user-otto select[name=role]").input_value() == "operator"
    admin.shot("users")
    admin.close()


def test_no_credentials_in_logs(deployment: Deployment) -> None:
    """After the whole walk (logins, Basic and bearer API calls), no password or token was logged."""
    logs = (deployment.tmp / "web.log").read_text() + (deployment.tmp / "worker.log").read_text()
    assert "Authorization" not in logs
    for secret in (deployment.admin[1], deployment.user[1], deployment.admin_token):
        assert secret not in logs
    for _, password in deployment.others.values():
        assert password not in logs
    assert "POST /login" in logs  # the access log is there, just without secrets
