"""The media workbench in a real browser (issue 19, items 1–3): a recording pipeline watched live on its
workflow page (the DAG's nodes change as steps finish), its clip played in the page and its transcript
read, the steps grouped under their workflow, a qualifier search that finds the import by its folder,
the charts' windows (1 h, 24 h, 7 d) and breakdowns with the value of the hovered bar, and every new page
within 390 px. Real gunicorn, a real dramatiq worker running the real import, ASR and render actors,
Debian's Chromium.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.domain.demo_recording import make_recording

from .browsing import Session, _wait_until
from .conftest import Deployment

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FOLDER_NAME = "23058-session-2026-workbench"
TERMINAL = ("succeeded", "failed", "cancelled", "interrupted")
#: How long :func:`finished_pipeline` waits for a pipeline it runs itself, in seconds.
PIPELINE_WAIT_S = 180
#: pytest-timeout for the tests that use it: that wait and the test's own pages (the default 120 s would kill
#: a test on a loaded machine while its fixture still waits).
FINISHED_PIPELINE_TIMEOUT_S = PIPELINE_WAIT_S + 60
#: How long the graph test watches each of its two phases, in seconds.
PHASE_WAIT_S = 120
#: Installed in the workflow's page: appends each new value of the workflow's progress bar to
#: ``window.shownProgress`` as the live feed swaps the panel in, once the DAG has its three steps.
RECORD_PROGRESS_JS = """() => {
  window.shownProgress = [];
  const record = () => {
    const bar = document.querySelector("#job-panel .progress-line progress");
    if (!bar || bar.getAttribute("value") === null) return;
    if (document.querySelectorAll("svg.dag a.node").length !== 3) return;
    const value = parseFloat(bar.getAttribute("value"));
    const shown = window.shownProgress;
    if (shown.length === 0 || shown[shown.length - 1] !== value) shown.push(value);
  };
  new MutationObserver(record).observe(document.body, {
    subtree: true, childList: true, attributes: true, attributeFilter: ["value"],
  });
}"""


@pytest.fixture(scope="module")
def pipeline(deployment: Deployment) -> Iterator[dict]:  # type: ignore[type-arg]
    """A one-segment recording under the deployment's import root (short, so the pipeline takes seconds)."""
    folder = Path(deployment.env["TENURE_IMPORT_ROOTS"]) / FOLDER_NAME
    make_recording(folder, segments=1, seconds=5.0, comments_per_segment=10)
    # 1280×720, not smaller: the graph test needs the render to report progress the page can show before it
    # finishes. At 480×270 the render took 0.65 s on a quiet machine, its one mid-render report (0.95 at 0.53 s)
    # was followed by the completion 0.12 s later, and the page once showed none; at 1280×720 (1.2–1.3 s) a
    # report at ~0.6 s stands for ~0.6 s.
    payload = {"folder": str(folder), "highlight_s": 4.0, "width": 1280, "height": 720, "danmaku": True}
    yield {"folder": folder, "payload": payload}


@pytest.fixture()
def finished_pipeline(deployment: Deployment, pipeline) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """A succeeded pipeline of the folder: the graph test's, or — when this module's tests run without it
    first (another order, a fresh deployment) — one run here."""
    found = deployment.api("GET", "/api/v1/jobs?q=kind:recording_pipeline+status:succeeded", who="user")["items"]
    if found:
        return found[0]
    for queue in ("default", "render"):  # as the graph test leaves them, even if it stopped half-way
        deployment.api("POST", f"/api/v1/queues/{queue}/resume")
    job = deployment.submit("recording_pipeline", pipeline["payload"])
    return deployment.wait_job(job["id"], lambda j: j["status"] in TERMINAL, timeout_s=PIPELINE_WAIT_S)


def _dag_states(page) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return dict(page.locator("svg.dag a.node").evaluate_all("els => els.map(e => [e.dataset.step, e.dataset.status])"))


@pytest.mark.timeout(2 * PHASE_WAIT_S + 60)  # two watched phases, then the clip and the transcript
def test_pipeline_graph_updates_live_and_its_clip_plays(browser, deployment: Deployment, pipeline) -> None:  # type: ignore[no-untyped-def]
    s = Session(browser, deployment, "user")
    page = s.page
    # Given the pipeline's page open while its import waits (its queue and the render's paused, so the
    # page is open before each of them starts, however fast the machine)
    for queue in ("default", "render"):
        deployment.api("POST", f"/api/v1/queues/{queue}/pause")
    job = deployment.submit("recording_pipeline", pipeline["payload"])
    page.goto(f"{deployment.base_url}/jobs/{job['id']}")
    page.wait_for_selector('svg.dag a.node[data-step="import"]')
    assert _dag_states(page) == {"import": "queued"}
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url) if frame == page.main_frame else None)
    # What the page showed, from the state asserted above: the import may start before the first look below
    seen: dict[str, list[str]] = {"import": ["queued"]}
    # Every progress value the page shows once the whole DAG is known (the import adds the other steps), recorded
    # by the page itself on each swap: a loop sampling it would miss a value shown between two of its looks
    page.evaluate(RECORD_PROGRESS_JS)

    def watch(until, timeout_s: float = PHASE_WAIT_S) -> None:  # type: ignore[no-untyped-def]
        """Record every node's status until *until*."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = _dag_states(page)
            for name, status in states.items():
                if not seen.get(name) or seen[name][-1] != status:
                    seen.setdefault(name, []).append(status)
            if until(states):
                return
            assert time.monotonic() < deadline, f"the page never got there: {seen}"
            time.sleep(0.1)

    try:
        # When the import runs, the graph grows live: the transcription it added runs, the render waits
        deployment.api("POST", "/api/v1/queues/default/resume")
        watch(lambda st: st.get("transcribe-0") == "succeeded" and st.get("render") == "queued")
        # When the render's queue resumes, the render runs and the workflow finishes, all without a reload
        deployment.api("POST", "/api/v1/queues/render/resume")
        watch(
            lambda st: (
                st.get("render") == "succeeded"
                and page.locator("#job-panel .summary .status").inner_text() == "succeeded"
            )
        )
    finally:  # the other tests need the queues
        for queue in ("default", "render"):
            deployment.api("POST", f"/api/v1/queues/{queue}/resume")
    progress: list[float] = page.evaluate("window.shownProgress")
    assert navigations == [], navigations
    assert seen["import"][0] == "queued" and seen["import"][-1] == "succeeded", seen
    assert seen["render"][0] == "queued" and seen["render"][-1] == "succeeded", seen
    assert set(seen) == {"import", "transcribe-0", "render"}
    # the workflow's progress moved while its steps ran, not only when one finished (k of 3 done): once
    # the import's extension shows (it drops from the import's own 0.95 when two more steps join) it only grows
    after_import = progress[next(i for i, p in enumerate(progress) if p < 0.9) :]
    assert after_import == sorted(after_import) and after_import[-1] == 1.0, progress
    assert any(p not in (0.3333, 0.6667, 1.0) for p in after_import), progress
    # every node links to its step, the steps to their workflow, edges drawn
    assert page.locator('svg.dag path.edge[data-edge="import→transcribe-0"]').count() == 1
    render_href = page.locator('svg.dag a.node[data-step="render"]').get_attribute("href")
    s.shot("workflow")

    # Then the clip plays in the page and downloads; the transcript reads with its timestamps
    video = page.locator("video.clip").first
    video.evaluate("v => { v.muted = true; return v.play(); }")
    _wait_until(lambda: video.evaluate("v => v.readyState") >= 2, 20)
    assert video.evaluate("v => v.duration") > 0
    download = page.locator(".output a.button[download]").first
    assert page.request.get(deployment.base_url + (download.get_attribute("href") or "")).status == 200
    transcript = page.locator("details.transcript")
    assert transcript.count() == 1
    lines = transcript.locator("ol.cues li time").all_inner_texts()
    assert all("–" in t for t in lines)  # 0:01.2–0:03.4
    page.goto(deployment.base_url + (render_href or ""))
    assert page.locator("#parent-link").get_attribute("href") == f"/jobs/{job['id']}"
    s.close()


@pytest.mark.timeout(FINISHED_PIPELINE_TIMEOUT_S)
def test_search_finds_the_import_by_its_folder_and_groups_steps(  # type: ignore[no-untyped-def]
    browser, deployment: Deployment, finished_pipeline
) -> None:
    assert finished_pipeline["status"] == "succeeded"
    imports = deployment.api("GET", "/api/v1/jobs?q=kind:import_recording", who="user")["items"]
    assert imports, "the pipeline imported the folder"
    s = Session(browser, deployment, "user")
    page = s.page
    page.goto(f"{deployment.base_url}/jobs")
    deployment.submit("e2e_echo", {"text": "unrelated"})
    # the qualifier search, typed into the one box (suggestions offered by its datalist)
    assert page.locator("#q-suggestions option[value='kind:import_recording']").count() == 1
    page.locator("#q").press_sequentially('kind:import_recording "session-2026"')
    rows = page.locator("#job-table tbody tr[id^=job-]")
    _wait_until(lambda: rows.count() == 1 and "import_recording" in rows.first.inner_text())
    assert rows.first.get_attribute("id") == f"job-{imports[0]['id']}"
    assert FOLDER_NAME in rows.first.locator("td.summary").inner_text()
    page.locator("#q").blur()  # no caret in the screenshot
    s.shot("jobs-search")
    # an unknown qualifier is explained, not a 500
    page.fill("#q", "colour:red")
    page.click("form.filters button[type=submit]")
    page.wait_for_selector("#search-error")
    assert "Unknown qualifier colour:" in page.inner_text("#search-error")
    # the steps under their workflow
    page.goto(f"{deployment.base_url}/jobs?group=1")
    parent = page.locator("#job-table tbody tr:not(.step)").filter(has_text=FOLDER_NAME).first
    parent_id = (parent.get_attribute("id") or "").removeprefix("job-")
    steps = page.locator(f"#job-{parent_id} ~ tr.step")
    assert steps.count() >= 3
    s.shot("jobs-grouped")
    s.close()


@pytest.mark.timeout(FINISHED_PIPELINE_TIMEOUT_S)
def test_charts_by_window_and_kind(browser, deployment: Deployment, finished_pipeline) -> None:  # type: ignore[no-untyped-def]
    s = Session(browser, deployment, "admin")
    page = s.page
    page.goto(f"{deployment.base_url}/ops")
    for window, group, heading in (
        ("1h", "queue", "Last hour, by queue"),
        ("7d", "", "Last 7 days"),
        ("24h", "kind", "Last 24 hours, by kind"),
    ):
        page.select_option("#chart-window", window)
        page.select_option("#chart-group", group)
        page.click("#chart-form button[type=submit]")
        page.wait_for_url(f"**/ops?window={window}&group={group}")
        assert page.inner_text("section.charts h2") == heading
        titles = page.locator("svg.chart rect title").all_text_contents()
        expected = {
            "queue": ("render:", "default:"),
            "kind": ("render_clip:", "import_recording:"),
            "": ("succeeded:",),
        }[group]
        assert all(any(e in t for t in titles) for e in expected), (window, titles)
        # Hovering a bar: the element under the pointer carries its value (the SVG <title> the browser shows)
        counted = page.locator("svg.chart rect").evaluate_all(
            "els => els.map((e, i) => /: [1-9]/.test(e.textContent) ? i : -1).filter(i => i >= 0)"
        )
        assert counted, (window, titles)
        page.locator("svg.chart rect").nth(counted[0]).hover()
        hovered = page.locator("svg.chart rect:hover > title")
        assert hovered.count() == 1 and re.search(r": [1-9]\d*$", hovered.text_content() or ""), hovered.count()
    s.shot("ops-charts-by-kind")
    s.close()


PAGES_390 = ("/jobs?group=1", "/jobs?q=colour:red", "/jobs/{pipeline}", "/jobs/{step}", "/ops?window=7d&group=queue")


@pytest.mark.timeout(FINISHED_PIPELINE_TIMEOUT_S)
def test_new_pages_fit_390px(browser, deployment: Deployment, finished_pipeline) -> None:  # type: ignore[no-untyped-def]
    parent = deployment.api("GET", "/api/v1/jobs?q=kind:recording_pipeline+status:succeeded")["items"][0]
    step = deployment.api("GET", f"/api/v1/jobs?parent={parent['id']}&q=kind:render_clip")["items"][0]
    s = Session(browser, deployment, "admin", width=390, height=844)
    page = s.page
    for path in PAGES_390:
        page.goto(deployment.base_url + path.format(pipeline=parent["id"], step=step["id"]))
        assert page.locator("html").evaluate("el => el.scrollWidth") <= 390, path
        right = page.locator("main button, main input:not([type=hidden]), main select, main a.button").evaluate_all(
            "els => Math.max(0, ...els.map(e => e.getBoundingClientRect().right))"
        )
        assert right <= 390, (path, right)
    page.goto(f"{deployment.base_url}/jobs/{parent['id']}")
    s.shot("mobile-workflow")
    s.close()
