"""The Attempts table in the API and on the job page: each attempt's outcome, and a retry refused (409,
with the reason) while a timed-out attempt's thread is still exiting. The stuck thread itself, in a real
worker process, is tests/acceptance/jobs/test_stuck_thread.py; a lost lease under `make run` is
tests/acceptance/operations/test_procfile.py."""

from __future__ import annotations

from jobs.execution.completer import TIMED_OUT, Failed, Retry

from .conftest import login


def _attempts(client, person, job_id):  # type: ignore[no-untyped-def]
    r = client.get(f"/api/v1/jobs/{job_id}/attempts", headers=person.bearer)
    assert r.status_code == 200, r.json
    return [(a["attempt"], a["outcome"], a["next"]) for a in r.json["items"]]


def test_each_attempt_ends_with_what_happened(client, alice, bob, driver):  # type: ignore[no-untyped-def]
    # Given a job that failed once (retried), then succeeded, and one that timed out
    job = driver.submit(alice.user.owner_id)
    driver.worker.runner.record(driver.start(job.id), Retry("RuntimeError: flaky", 0.0))
    driver._contexts.pop(job.id)  # attempt 1 ended: the next start is a new claim
    driver.succeed(job.id, "ok")
    timed_out = driver.submit(alice.user.owner_id)
    driver.worker.runner.record(driver.start(timed_out.id), Failed(TIMED_OUT))

    # Then the API and the page show each attempt's outcome and what came next
    assert _attempts(client, alice, job.id) == [(1, "failed", "retry scheduled"), (2, "succeeded", None)]
    assert _attempts(client, alice, timed_out.id) == [(1, "timed out", None)]
    login(client, alice)
    page = client.get(f"/jobs/{job.id}").get_data(as_text=True)
    assert '<td data-label="Outcome" class="outcome">failed</td><td data-label="Then">retry scheduled</td>' in page
    # ... and another owner's job is not found
    assert client.get(f"/api/v1/jobs/{job.id}/attempts", headers=bob.bearer).status_code == 404


def test_a_retry_answers_409_while_the_timed_out_thread_is_still_exiting(client, alice, driver):  # type: ignore[no-untyped-def]
    # Given a running job whose thread did not stop after its timeout (the keeper's own step)
    job = driver.submit(alice.user.owner_id)
    ctx = driver.start(job.id)
    driver.worker.keeper._fail_overdue(ctx)
    assert ctx.exiting

    # Then it is failed and still exiting: the retry is refused with that reason, the UI offers none
    r = client.get(f"/api/v1/jobs/{job.id}", headers=alice.bearer)
    assert (r.json["status"], r.json["still_exiting"], r.json["can_retry"]) == ("failed", True, False)
    (listed,) = client.get("/api/v1/jobs", headers=alice.bearer).json["items"]
    assert (listed["still_exiting"], listed["can_retry"]) == (True, False)
    assert _attempts(client, alice, job.id) == [(1, "timed out — still exiting", None)]
    r = client.post(f"/api/v1/jobs/{job.id}/retry", headers=alice.bearer)
    assert r.status_code == 409 and "still exiting" in r.json["error"]["message"], r.json
    login(client, alice)
    page = client.get(f"/jobs/{job.id}").get_data(as_text=True)
    assert "timed out — still exiting" in page and 'id="retry-btn"' not in page
    assert '<span class="muted" id="still-exiting">Timed out — still exiting: its thread has not stopped yet' in page

    # When the thread returns (what the runner does after the actor's call)
    driver.worker.runner._exited(ctx)

    # Then the attempt reads "timed out" and the retry is made
    assert _attempts(client, alice, job.id) == [(1, "timed out", None)]
    (listed,) = client.get("/api/v1/jobs", headers=alice.bearer).json["items"]
    assert (listed["still_exiting"], listed["can_retry"]) == (False, True)
    r = client.post(f"/api/v1/jobs/{job.id}/retry", headers=alice.bearer)
    assert r.status_code == 201 and r.json["retry_of_job_id"] == job.id, r.json
