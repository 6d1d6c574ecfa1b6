"""UI flows through the Flask test client (the browser walk is in tests/e2e)."""

from __future__ import annotations

from .conftest import login


def _job(driver, person, text="x"):  # type: ignore[no-untyped-def]
    return driver.submit(person.user.owner_id, payload={"text": text})


def test_bulk_by_filter_shows_dry_run_then_acts(client, alice, bob, driver):  # type: ignore[no-untyped-def]
    mine = [_job(driver, alice, str(i)) for i in range(3)]
    theirs = _job(driver, bob)
    driver.succeed(mine[0].id)
    token = login(client, alice)
    page = client.get("/jobs?status=queued&status=succeeded").get_data(as_text=True)
    assert "status=queued" in page and "status=succeeded" in page  # the bulk links keep every filter
    confirm = client.get("/jobs/bulk-by-filter?action=cancel&status=queued&status=succeeded").get_data(as_text=True)
    assert "<strong>3</strong> job(s) match" in confirm and "<strong>2</strong> can be cancelled" in confirm
    assert driver.status(mine[1].id) == "queued"  # a dry run changes nothing
    r = client.post(
        "/jobs/bulk-by-filter",
        data={"csrf_token": token, "action": "cancel", "status": ["queued", "succeeded"]},
    )
    assert r.status_code == 302
    assert [driver.status(j.id) for j in mine] == ["succeeded", "cancelled", "cancelled"]
    assert driver.status(theirs.id) == "queued"


def test_bulk_selected_and_detail_actions(client, alice, driver):  # type: ignore[no-untyped-def]
    jobs = [_job(driver, alice, str(i)) for i in range(2)]
    token = login(client, alice)
    r = client.post("/jobs/bulk", data={"csrf_token": token, "action": "cancel", "ids": [j.id for j in jobs]})
    assert r.status_code == 302 and all(driver.status(j.id) == "cancelled" for j in jobs)
    panel = client.post(f"/jobs/{jobs[0].id}/cancel", data={"csrf_token": token}, headers={"HX-Request": "true"})
    assert panel.status_code == 200 and 'id="job-panel"' in panel.get_data(as_text=True)
    retried = client.post(f"/jobs/{jobs[0].id}/retry", data={"csrf_token": token})
    assert retried.status_code == 302 and retried.headers["Location"] != f"/jobs/{jobs[0].id}"


def test_event_data_reads_as_text_not_python_reprs(client, alice, driver):  # type: ignore[no-untyped-def]
    job = _job(driver, alice)
    driver.event(job.id, "steps_added", steps=["transcribe-0", "render <b>"], sizes={"a": 1})
    login(client, alice)
    page = client.get(f"/jobs/{job.id}").get_data(as_text=True)
    assert "steps=transcribe-0 render &lt;b&gt;" in page and "sizes=a: 1" in page
    assert "[&#39;" not in page and "{&#39;" not in page


def test_submit_form_validation_and_idempotent_resubmit(client, alice, driver):  # type: ignore[no-untyped-def]
    token = login(client, alice)
    r = client.post("/submit/echo", data={"csrf_token": token, "idempotency_key": "k", "p_times": "abc"})
    page = r.get_data(as_text=True)
    assert r.status_code == 200 and "This field is required." in page and "Not a valid integer value." in page
    data = {"csrf_token": token, "idempotency_key": "k", "p_text": "hi", "p_times": "2"}
    first = client.post("/submit/echo", data=data)
    second = client.post("/submit/echo", data=data)  # a double-click: same job
    assert first.headers["Location"] == second.headers["Location"] and driver.count() == 1
    assert driver.payload(first.headers["Location"].rsplit("/", 1)[1]) == {"text": "hi", "times": 2}
    assert client.get("/submit/nope").status_code == 404


def test_tokens_page_shows_secret_once_and_revokes(client, alice):  # type: ignore[no-untyped-def]
    token = login(client, alice)
    created = client.post("/tokens", data={"csrf_token": token, "name": "laptop"}, follow_redirects=True).get_data(
        as_text=True
    )
    secret = created.split('id="new-token">')[1].split("<")[0]
    assert secret.startswith("tnr_")
    assert client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    listing = client.get("/tokens").get_data(as_text=True)
    assert secret not in listing and secret[:10] in listing
    token_id = listing.split('action="/tokens/')[1].split("/")[0]
    client.post(f"/tokens/{token_id}/revoke", data={"csrf_token": token})
    assert client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {secret}"}).status_code == 401


def test_creating_a_token_redirects_so_a_reload_creates_no_second_one(client, alice):  # type: ignore[no-untyped-def]
    import accounts

    token = login(client, alice)
    before = len(accounts.list_tokens(client.application.extensions["tenure"].engine, alice.user.id))
    # When the form is posted: 303 to the page itself (Post/Redirect/Get)
    posted = client.post("/tokens", data={"csrf_token": token, "name": "laptop"})
    assert posted.status_code == 303 and posted.headers["Location"] == "/tokens"
    # Then the page after the redirect shows the new secret once, and is not cached
    shown = client.get("/tokens")
    assert shown.headers["Cache-Control"] == "no-store"
    secret = shown.get_data(as_text=True).split('id="new-token">')[1].split("<")[0]
    assert secret.startswith("tnr_")
    # A reload is a GET of /tokens: no second token, and the secret is not shown again
    reloaded = client.get("/tokens").get_data(as_text=True)
    assert secret not in reloaded and 'id="new-token"' not in reloaded
    engine = client.application.extensions["tenure"].engine
    assert len(accounts.list_tokens(engine, alice.user.id)) == before + 1


def test_login_redirects_only_to_local_paths(client, alice):  # type: ignore[no-untyped-def]
    from .conftest import csrf_token

    token = csrf_token(client)
    r = client.post(
        "/login?next=https://evil.example/",
        data={"csrf_token": token, "username": "alice", "password": alice.password},
    )
    assert r.headers["Location"] == "/jobs"
    bad = client.post("/login", data={"csrf_token": csrf_token(client), "username": "alice", "password": "nope"})
    assert "Invalid user name or password" in bad.get_data(as_text=True)


def test_admin_filters_by_user_name(client, alice, bob, root, driver):  # type: ignore[no-untyped-def]
    a, b = _job(driver, alice), _job(driver, bob)
    login(client, root)
    page = client.get("/jobs?owner=bob").get_data(as_text=True)
    assert b.id[:12] in page and a.id[:12] not in page
    assert ">alice<" in client.get("/jobs").get_data(as_text=True)  # owners shown by name


def test_security_headers(client, alice):  # type: ignore[no-untyped-def]
    page = client.get("/login")
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert page.headers["X-Frame-Options"] == "DENY" and page.headers["X-Content-Type-Options"] == "nosniff"
    api = client.get("/api/v1/jobs", headers=alice.bearer)
    assert "Content-Security-Policy" not in api.headers and api.headers["X-Content-Type-Options"] == "nosniff"
