"""The recording pipeline end to end through real worker processes: the DAG in the job records, fail-fast, retry."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs import retry
from tasks.domain.demo_recording import DemoRecording
from tasks.domain.notify.signing import new_secret
from tests.integration.domain.receivers import WebhookReceiver

from .conftest import OWNER, Fleet

TRANSCRIBES = ["transcribe-0", "transcribe-1", "transcribe-2"]


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


def steps(fleet: Fleet, pipeline_id: str) -> dict[str, dict]:
    rows = fleet.sql(
        "SELECT s.step, s.job_id, s.depends_on, s.reused, j.status, j.parent_job_id FROM pipeline_steps s "
        "JOIN jobs j ON j.id = s.job_id WHERE s.pipeline_job_id = :p",
        p=pipeline_id,
    )
    return {
        r.step: {"job_id": r.job_id, "deps": json.loads(r.depends_on), "reused": bool(r.reused), "status": r.status}
        | {"parent": r.parent_job_id}
        for r in rows
    }


PAYLOAD = {"channels": ["hook"], "highlight_s": 8.0, "width": 640, "height": 360}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_pipeline_runs_end_to_end_with_the_dag_in_the_job_records(
    fleet: Fleet, recording: DemoRecording, receiver: WebhookReceiver
) -> None:
    # Given the general worker type and the asr worker type, as in the Procfile
    with_hook(fleet, receiver)
    fleet.worker("main", threads=3)
    fleet.asr_worker()

    # When the pipeline runs on the generated recording
    job = fleet.wait_terminal(fleet.submit("recording_pipeline", {"folder": str(recording.folder)} | PAYLOAD).id, 150)

    # Then it succeeded, and every step is a child job of it, wired as a DAG
    assert job.status == "succeeded", job.error
    assert job.progress == 1.0
    dag = steps(fleet, job.id)
    assert set(dag) == {"import", *TRANSCRIBES, "render", "notify-hook"}
    assert all(s["status"] == "succeeded" and s["parent"] == job.id and not s["reused"] for s in dag.values())
    assert dag["import"]["deps"] == [] and all(dag[t]["deps"] == ["import"] for t in TRANSCRIBES)
    assert dag["render"]["deps"] == TRANSCRIBES and dag["notify-hook"]["deps"] == ["render"]
    assert {name: s["job_id"] for name, s in job.result["steps"].items()} == {n: s["job_id"] for n, s in dag.items()}
    # the transcribe steps ran on the asr queue, the highlight has subtitles and a thumbnail
    assert {r.queue_name for r in fleet.sql("SELECT queue_name FROM jobs WHERE kind = 'transcribe'")} == {"asr"}
    clip = job.result["clip"]
    assert Path(clip["path"]).is_file() and Path(clip["thumbnail"]).is_file() and clip["subtitle_cues"] >= 1
    [delivery] = receiver.received
    assert delivery.verified and json.loads(delivery.body)["data"]["clip_id"] == clip["clip_id"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_failed_transcribe_step_fails_fast_and_a_retry_reruns_only_what_failed(
    fleet: Fleet, recording: DemoRecording, receiver: WebhookReceiver, tmp_path: Path
) -> None:
    # Given a pipeline whose transcribe steps are queued while no asr worker runs yet
    folder = tmp_path / "rec"
    shutil.copytree(recording.folder, folder)
    with_hook(fleet, receiver)
    fleet.worker("main", threads=3)
    first = fleet.submit("recording_pipeline", {"folder": str(folder)} | PAYLOAD)
    fleet.wait(lambda: set(TRANSCRIBES) <= set(steps(fleet, first.id)), 60, "the fan-out")

    # When segment 1's file disappears before it is transcribed
    [(segment_path,)] = fleet.sql("SELECT path FROM recording_segments WHERE idx = 1")
    hidden = Path(segment_path).rename(tmp_path / "hidden.flv")
    fleet.asr_worker()
    failed = fleet.wait_terminal(first.id, 90)

    # Then the pipeline failed fast: the failing step named, nothing after it started
    assert failed.status == "failed" and "transcribe-1" in (failed.error or "")
    dag = steps(fleet, first.id)
    assert dag["transcribe-1"]["status"] == "failed"
    assert dag["transcribe-2"]["status"] in ("cancelled", "succeeded")  # cancelled unless it won the race
    assert "render" not in dag and "notify-hook" not in dag

    # When the file is back and the pipeline is retried
    hidden.rename(segment_path)
    second = retry(fleet.engine, first.id, by=OWNER, registry=fleet.registry, settings=fleet.settings)
    done = fleet.wait_terminal(second.id, 120)

    # Then only the failed/cancelled steps ran again, and the rest of the DAG completed
    assert done.status == "succeeded", done.error
    again = steps(fleet, second.id)
    assert again["import"]["reused"] and again["import"]["job_id"] == dag["import"]["job_id"]
    assert again["transcribe-0"]["reused"] and again["transcribe-0"]["job_id"] == dag["transcribe-0"]["job_id"]
    assert not again["transcribe-1"]["reused"] and again["transcribe-1"]["parent"] == second.id
    assert again["transcribe-2"]["reused"] == (dag["transcribe-2"]["status"] == "succeeded")
    assert all(s["status"] == "succeeded" for s in again.values())
    assert len(receiver.received) == 1
