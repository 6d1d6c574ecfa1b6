"""The recording pipeline end to end through real worker processes: a workflow of the job layer whose DAG
is in the job records (``parent_job_id``, ``job_dependencies``), extended by its steps as they complete;
fail-fast; a workflow retry that re-runs only what did not succeed."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import jobs
from tasks.domain.demo_recording import DemoRecording
from tasks.domain.notify.signing import new_secret
from tests.integration.domain.receivers import WebhookReceiver

from .conftest import OWNER, Fleet

TRANSCRIBES = ("transcribe-0", "transcribe-1", "transcribe-2")


@pytest.fixture()
def receiver() -> Iterator[WebhookReceiver]:
    r = WebhookReceiver(new_secret().reveal()).start()
    try:
        yield r
    finally:
        r.stop()


def with_hook(fleet: Fleet, receiver: WebhookReceiver) -> None:
    path = fleet.tmp / "channels.json"
    path.write_text(json.dumps({"hook": {"type": "webhook", "url": receiver.url("/h"), "secret": receiver.secret}}))
    fleet.env_extra["TENURE_NOTIFY_CHANNELS"] = str(path)


def graph(fleet: Fleet, pipeline_id: str) -> dict[str, jobs.StepView]:
    return jobs.workflow_graph(fleet.engine, pipeline_id, owner_id=OWNER)


def edges(fleet: Fleet, pipeline_id: str) -> set[tuple[str, str]]:
    """The DAG as the job records hold it: (step, step it depends on), by step name."""
    rows = fleet.sql(
        "SELECT c.config AS c_config, p.config AS p_config FROM job_dependencies d "
        "JOIN jobs c ON c.id = d.job_id JOIN jobs p ON p.id = d.depends_on_job_id WHERE c.parent_job_id = :p",
        p=pipeline_id,
    )
    return {(json.loads(r.c_config)["workflow_step"], json.loads(r.p_config)["workflow_step"]) for r in rows}


PAYLOAD = {"channels": ["hook"], "highlight_s": 8.0, "width": 640, "height": 360}
FULL_DAG = {
    *((t, "import") for t in TRANSCRIBES),
    *(("render", t) for t in TRANSCRIBES),
    ("notify-hook", "render"),
}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_pipeline_runs_end_to_end_with_the_dag_in_the_job_records(
    fleet: Fleet, recording: DemoRecording, receiver: WebhookReceiver
) -> None:
    # Given the general worker type and the asr worker type, as in the Procfile
    with_hook(fleet, receiver)
    fleet.worker("main", threads=3)
    fleet.asr_worker()

    # When the pipeline is submitted on the generated recording (a workflow: no worker runs the pipeline itself)
    submitted = fleet.submit("recording_pipeline", {"folder": str(recording.folder)} | PAYLOAD)
    assert submitted.status == "running" and graph(fleet, submitted.id)["import"].job.kind == "import_recording"
    job = fleet.wait_terminal(submitted.id, 150)

    # Then it succeeded, and every step is a child job of it, wired as a DAG in the job records
    assert job.status == "succeeded", job.error
    assert job.progress == 1.0
    dag = graph(fleet, job.id)
    assert set(dag) == {"import", *TRANSCRIBES, "render", "notify-hook"}
    assert all(s.job.status == "succeeded" and s.job.parent_job_id == job.id and not s.reused for s in dag.values())
    assert edges(fleet, job.id) == FULL_DAG
    assert dag["import"].depends_on == () and dag["render"].depends_on == TRANSCRIBES
    assert job.result == {"steps": {name: s.job.id for name, s in dag.items()}}
    # the DAG grew as its steps completed: import added the fan-out and the render, render the notification
    extended = [e.data for e in fleet.events(job.id) if e.type == "workflow_extended"]
    assert extended == [
        {"by": "import", "steps": [*TRANSCRIBES, "render"]},
        {"by": "render", "steps": ["notify-hook"]},
    ]
    # the transcribe steps ran on the asr queue; the parent had no message and no worker (driven by its steps,
    # not polling): it is listed under the "workflow" pseudo-queue, which no broker queue and no consumer has
    assert {r.queue_name for r in fleet.sql("SELECT queue_name FROM jobs WHERE kind = 'transcribe'")} == {"asr"}
    [(queue, worker)] = fleet.sql("SELECT queue_name, worker_id FROM jobs WHERE id = :id", id=job.id)
    assert (queue, worker) == ("workflow", None)
    clip = dag["render"].job.result
    assert Path(clip["path"]).is_file() and Path(clip["thumbnail"]).is_file() and clip["subtitle_cues"] >= 1
    [delivery] = receiver.received
    data = json.loads(delivery.body)["data"]
    assert delivery.verified and data["clip_id"] == clip["clip_id"] and data["pipeline_job_id"] == job.id


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_failed_transcribe_step_fails_fast_and_a_workflow_retry_reruns_only_what_failed(
    fleet: Fleet, recording: DemoRecording, receiver: WebhookReceiver, tmp_path: Path
) -> None:
    # Given a pipeline whose transcribe steps are queued while no asr worker runs yet
    folder = tmp_path / "rec"
    shutil.copytree(recording.folder, folder)
    with_hook(fleet, receiver)
    fleet.worker("main", threads=3)
    first = fleet.submit("recording_pipeline", {"folder": str(folder)} | PAYLOAD)
    fleet.wait(lambda: set(TRANSCRIBES) <= set(graph(fleet, first.id)), 60, "the fan-out")

    # When segment 1's file disappears before it is transcribed
    [(segment_path,)] = fleet.sql("SELECT path FROM recording_segments WHERE idx = 1")
    hidden = Path(segment_path).rename(tmp_path / "hidden.flv")
    fleet.asr_worker()
    failed = fleet.wait_terminal(first.id, 90)

    # Then the pipeline failed fast: the failing step named, the steps after it cancelled, none ran
    assert failed.status == "failed" and "step transcribe-1 failed" in (failed.error or "")
    fleet.wait(lambda: all(s.job.terminal for s in graph(fleet, first.id).values()), 30, "every step to stop")
    dag = graph(fleet, first.id)
    assert dag["transcribe-1"].job.status == "failed"
    assert dag["transcribe-2"].job.status in ("cancelled", "succeeded")  # cancelled unless it won the race
    assert dag["render"].job.status == "cancelled" and dag["render"].job.attempt == 0
    assert "notify-hook" not in dag  # the render never ran, so it never added its notification

    # When the file is back and the workflow is retried
    hidden.rename(segment_path)
    second = jobs.retry(fleet.engine, first.id, by=OWNER, registry=fleet.registry, settings=fleet.settings)
    done = fleet.wait_terminal(second.id, 120)

    # Then only the failed/cancelled steps ran again, and the rest of the DAG completed
    assert done.status == "succeeded", done.error
    assert done.retry_of_job_id == first.id
    again = graph(fleet, second.id)
    assert again["import"].reused and again["import"].job.id == dag["import"].job.id
    assert again["transcribe-0"].reused and again["transcribe-0"].job.id == dag["transcribe-0"].job.id
    assert not again["transcribe-1"].reused and again["transcribe-1"].job.parent_job_id == second.id
    assert again["transcribe-2"].reused == (dag["transcribe-2"].job.status == "succeeded")
    assert not again["render"].reused and not again["notify-hook"].reused
    assert all(s.job.status == "succeeded" for s in again.values())
    assert again["render"].depends_on == TRANSCRIBES and again["notify-hook"].depends_on == ("render",)
    [delivery] = receiver.received
    assert json.loads(delivery.body)["data"]["pipeline_job_id"] == second.id
