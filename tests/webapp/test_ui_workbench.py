"""The workbench pages through the Flask test client: summary and error columns, the search box, steps
grouped under their workflow, a workflow's DAG and outputs, deleting (the browser walk is in tests/e2e)."""

from __future__ import annotations

import jobs
from jobs.workflows import Step, submit_workflow

from .conftest import login

SRT = "1\n00:00:01,200 --> 00:00:03,400\nhello there\n\n2\n00:01:05,000 --> 00:01:06,500\n第二句\n"


def _workflow(driver, owner_id: str) -> tuple[jobs.JobRecord, dict[str, str]]:  # type: ignore[no-untyped-def]
    steps = [
        Step("import", "echo", {"text": "session-2026"}),
        Step("transcribe", "echo", {"text": "segment 0"}, depends_on=["import"]),
        Step("render", "echo", {"text": "highlight"}, depends_on=["transcribe"]),
    ]
    parent = submit_workflow(
        driver.engine, owner_id=owner_id, name="media", steps=steps, registry=driver.registry, settings=driver.settings
    )
    ids = {s.name: s.job.id for s in jobs.workflow_graph(driver.engine, parent.id, owner_id=owner_id).values()}
    return parent, ids


def test_list_shows_summary_and_error_and_explains_a_bad_search(client, alice, driver):  # type: ignore[no-untyped-def]
    ok = driver.submit(alice.user.owner_id, payload={"text": "/recordings/23058-session-2026"})
    bad = driver.submit(alice.user.owner_id, payload={"text": "other"})
    driver.fail(bad.id, "RuntimeError: the disk is full")
    login(client, alice)
    page = client.get("/jobs").get_data(as_text=True)
    assert "/recordings/23058-session-2026" in page and "RuntimeError: the disk is full" in page
    assert '<datalist id="q-suggestions">' in page and '<option value="status:failed">' in page
    assert '<option value="kind:echo">' in page
    found = client.get("/jobs", query_string={"q": 'kind:echo "session-2026"'}).get_data(as_text=True)
    assert ok.id in found and bad.id not in found
    wrong = client.get("/jobs", query_string={"q": "colour:red"})
    text = wrong.get_data(as_text=True)
    assert wrong.status_code == 200 and 'id="search-error"' in text and "Unknown qualifier colour:" in text
    assert ok.id not in text  # a list that ignored part of the search would mislead


def test_grouped_list_puts_steps_under_their_workflow(client, alice, driver):  # type: ignore[no-untyped-def]
    parent, ids = _workflow(driver, alice.user.owner_id)
    alone = driver.submit(alice.user.owner_id)
    login(client, alice)
    page = client.get("/jobs?group=1").get_data(as_text=True)
    rows = [line for line in page.splitlines() if line.startswith('<tr id="job-')]
    order = [line.split('"')[1].removeprefix("job-") for line in rows]
    assert order == [alone.id, parent.id, ids["import"], ids["transcribe"], ids["render"]]
    assert all('class="step"' in r for r in rows[2:]) and 'class="step"' not in rows[1]
    flat = client.get("/jobs").get_data(as_text=True)
    assert flat.count('<tr id="job-') == 5


def test_workflow_page_draws_its_dag_and_offers_outputs(client, alice, driver):  # type: ignore[no-untyped-def]
    parent, ids = _workflow(driver, alice.user.owner_id)
    driver.succeed(ids["import"])
    driver.write_file(ids["transcribe"], "1-segment-0.srt", SRT.encode())
    driver.succeed(ids["transcribe"])
    driver.write_file(ids["render"], "1-highlight.mp4", b"\x00\x00\x00\x18ftypmp42")
    driver.write_file(ids["render"], "1-highlight.jpg", b"\xff\xd8\xff")
    driver.write_file(ids["render"], "1-notes.txt", b"n")
    driver.fail(ids["render"], "RuntimeError: notify failed")
    login(client, alice)
    page = client.get(f"/jobs/{parent.id}").get_data(as_text=True)
    # the DAG: every step a node linking to its page, the failed one marked, edges between them
    for name, step_id in ids.items():
        assert f'href="/jobs/{step_id}"' in page and f'data-step="{name}"' in page
    assert 'class="node s-failed failed" data-step="render"' in page and "✕ render" in page
    assert 'data-edge="import→transcribe"' in page and 'data-edge="transcribe→render"' in page
    # the outputs of every step, a failed one's included: the clip to play and download, the transcript
    assert f'src="/jobs/{ids["render"]}/media/1-highlight.mp4"' in page and "<video" in page
    assert f'poster="/jobs/{ids["render"]}/media/1-highlight.jpg"' in page
    assert f'href="/jobs/{ids["render"]}/files/1-highlight.mp4" download' in page
    assert "<time>0:01.2–0:03.4</time> <span>hello there</span>" in page and "1:05.0–1:06.5" in page
    assert "第二句" in page and "1-notes.txt" in page
    # a step links back to its workflow
    step_page = client.get(f"/jobs/{ids['render']}").get_data(as_text=True)
    assert f'id="parent-link" href="/jobs/{parent.id}"' in step_page
    # the live partial and the inline media (videos and pictures only; never another user's)
    assert client.get(f"/jobs/{parent.id}/workflow").get_data(as_text=True).count("data-step=") == 3
    video = client.get(f"/jobs/{ids['render']}/media/1-highlight.mp4", headers={"Range": "bytes=0-3"})
    assert video.status_code == 206 and video.mimetype == "video/mp4" and video.data == b"\x00\x00\x00\x18"
    assert "attachment" not in video.headers.get("Content-Disposition", "")
    assert client.get(f"/jobs/{ids['render']}/media/1-notes.txt").status_code == 404


def test_media_and_workflow_of_another_user_are_missing(client, alice, bob, driver):  # type: ignore[no-untyped-def]
    parent, ids = _workflow(driver, alice.user.owner_id)
    driver.write_file(ids["import"], "1-clip.mp4", b"x")
    driver.succeed(ids["import"])
    login(client, bob)
    assert client.get(f"/jobs/{ids['import']}/media/1-clip.mp4").status_code == 404
    assert client.get(f"/jobs/{parent.id}/workflow").status_code == 404


def test_delete_from_the_job_page(client, alice, driver):  # type: ignore[no-untyped-def]
    job = driver.submit(alice.user.owner_id)
    running = driver.submit(alice.user.owner_id)
    driver.succeed(job.id)
    driver.start(running.id)  # the newest live-feed entry belongs to another job
    token = login(client, alice)
    page = client.get(f"/jobs/{job.id}").get_data(as_text=True)
    assert 'id="delete-btn"' in page
    assert 'id="delete-btn"' not in client.get(f"/jobs/{running.id}").get_data(as_text=True)
    refused = client.post(f"/jobs/{running.id}/delete", data={"csrf_token": token}, headers={"HX-Request": "true"})
    assert refused.status_code == 200 and "only finished jobs can be deleted" in refused.get_data(as_text=True)
    r = client.post(f"/jobs/{job.id}/delete", data={"csrf_token": token})
    assert r.status_code == 302 and r.headers["Location"] == "/jobs"
    assert f"Deleted job {job.id}." in client.get("/jobs").get_data(as_text=True)
    assert client.get(f"/jobs/{job.id}").status_code == 404


def test_charts_window_and_breakdown(client, root, driver):  # type: ignore[no-untyped-def]
    done = driver.submit(root.user.owner_id, payload={"text": "a"})
    driver.succeed(done.id)
    failed = driver.submit(root.user.owner_id, kind="sleep", payload={"seconds": 1})
    driver.fail(failed.id)
    login(client, root)
    page = client.get("/ops?window=24h&group=kind").get_data(as_text=True)
    assert "Last 24 hours, by kind" in page and "Throughput: finished jobs per hour" in page
    assert '<option value="24h" selected>' in page and '<option value="kind" selected>' in page
    # one series per kind, and every bar names its value on hover
    assert "<title>" in page and " echo: 1</title></rect>" in page and " sleep: 1</title></rect>" in page
    week = client.get("/ops?window=7d&group=queue").get_data(as_text=True)
    assert "per 6 hours" in week and "slow: 1" in week
    default = client.get("/ops?window=bogus&group=colour")  # unknown choices fall back, never a 500
    assert default.status_code == 200 and "Last hour" in default.get_data(as_text=True)
    api = client.get("/api/v1/activity?window=24h&group_by=queue", headers=root.bearer)
    assert api.status_code == 200
    assert {b["group"] for b in api.json if b["succeeded"] or b["failed"]} == {"default", "slow"}
    assert client.get("/api/v1/activity?window=2w", headers=root.bearer).status_code == 422


def test_a_long_legend_wraps_and_stays_on_the_chart() -> None:
    import re

    from webapp.ui.charts import PAD, WIDTH, bar_chart

    names = [f"queue-number-{i}" for i in range(12)]
    svg = bar_chart("t", ["a"], [(n, f"g{i % 8}", [1]) for i, n in enumerate(names)])
    xs = [float(x) for x in re.findall(r'<rect class="g\d" x="([\d.]+)" y="(?:4|16)"', svg)]
    assert xs and max(xs) < WIDTH - PAD and "more</text>" in svg  # two rows, then "+N more"
    assert set(re.findall(r'<rect class="g\d" x="[\d.]+" y="(\d+)" width="9"', svg)) == {"4", "16"}
