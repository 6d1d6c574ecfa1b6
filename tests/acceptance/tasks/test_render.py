"""``render_clip`` through real workers: a playable clip; cancel kills ffmpeg; SIGKILL → a new attempt's file."""

from __future__ import annotations

from pathlib import Path

import av
import pytest

from jobs import cancel
from tasks.domain.demo_recording import DemoRecording
from tasks.outputs import clean_partial_outputs

from .conftest import OWNER, Fleet, ffmpeg_alive, worker_pid


def session_of(fleet: Fleet, recording: DemoRecording) -> dict:
    job = fleet.wait_terminal(fleet.submit("import_recording", {"folder": str(recording.folder)}).id)
    assert job.status == "succeeded", job.error
    return job.result


def probe_duration(path: Path) -> float:
    with av.open(str(path)) as c:
        assert c.streams.video and c.streams.audio
        return c.duration / av.time_base


@pytest.mark.timeout(120)
def test_render_across_segments_with_overlays_and_thumbnail(fleet: Fleet, recording: DemoRecording) -> None:
    fleet.worker("main", ("default", "render"))
    session = session_of(fleet, recording)
    start, end = 4.0, session["segments"][2]["offset_s"] + 1.5  # crosses both boundaries

    job = fleet.wait_terminal(
        fleet.submit(
            "render_clip",
            {"session_id": session["session_id"], "start_s": start, "end_s": end, "danmaku": True}
            | {"width": 640, "height": 360},
        ).id,
        90,
    )

    assert job.status == "succeeded", job.error
    clip, thumb = Path(job.result["path"]), Path(job.result["thumbnail"])
    assert clip.name == "1-clip.mp4" and thumb.name == "1-clip.jpg" and clip.parent.name == job.id
    assert probe_duration(clip) == pytest.approx(end - start, abs=0.1)
    assert thumb.stat().st_size > 1000 and job.result["danmaku_comments"] > 0
    [(path, attempt)] = fleet.sql("SELECT path, attempt FROM clips WHERE job_id = :j", j=job.id)
    assert path == str(clip) and attempt == 1
    assert sorted(p.name for p in clip.parent.iterdir()) == ["1-clip.jpg", "1-clip.mp4"]  # no scratch left
    assert fleet.event(job.id, "ffmpeg_started") is not None and job.progress == 1.0


def wait_ffmpeg(fleet: Fleet, job_id: str) -> int:
    event = fleet.wait(lambda: fleet.event(job_id, "ffmpeg_started"), 60, "ffmpeg to start")
    fleet.wait(lambda: (fleet.job(job_id).progress or 0) > 0.02, 60, "encoding progress")
    return int(event.data["pid"])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_cancel_mid_render_kills_ffmpeg_and_leaves_no_file(fleet: Fleet, recording: DemoRecording) -> None:
    # Given a full-length 720p render in progress
    fleet.worker("main", ("default", "render"))
    session = session_of(fleet, recording)
    payload = {"session_id": session["session_id"], "start_s": 0.0, "end_s": session["duration_s"], "danmaku": True}
    job_id = fleet.submit("render_clip", payload).id
    pid = wait_ffmpeg(fleet, job_id)

    # When it is cancelled
    assert cancel(fleet.engine, job_id, by=OWNER).outcome.value == "requested"
    job = fleet.wait_terminal(job_id, 30)

    # Then ffmpeg is gone and nothing of the attempt is left on disk
    assert job.status == "cancelled"
    assert not ffmpeg_alive(pid)
    job_dir = fleet.output_root / job_id
    assert not job_dir.exists() or list(job_dir.iterdir()) == []
    assert fleet.sql("SELECT count(*) FROM clips") == [(0,)]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_sigkill_mid_render_retries_on_another_worker_with_a_new_file(fleet: Fleet, recording: DemoRecording) -> None:
    # Given two render workers and a render running on one of them
    fleet.worker("w1", ("default", "render"))
    fleet.worker("w2", ("render",))
    session = session_of(fleet, recording)
    payload = {"session_id": session["session_id"], "start_s": 1.0, "end_s": session["duration_s"] - 1.0}
    job_id = fleet.submit("render_clip", payload | {"width": 640, "height": 360}).id
    ffmpeg_pid = wait_ffmpeg(fleet, job_id)
    victim = worker_pid(fleet.job(job_id), fleet)

    # When that worker process is SIGKILLed mid-render
    fleet.sigkill_worker_process(victim)
    job_dir = fleet.output_root / job_id
    partials = fleet.wait(lambda: list(job_dir.glob(".1-clip.mp4.partial-*")), 5, "the killed attempt's scratch")
    fleet.wait(lambda: not ffmpeg_alive(ffmpeg_pid), 10, "ffmpeg to die with its worker")

    # Then the job is retried on the other worker, which writes its own attempt's files
    job = fleet.wait_terminal(job_id, 90)
    assert job.status == "succeeded", job.error
    assert job.attempt == 2 and not Path(f"/proc/{victim}").exists()
    assert Path(job.result["path"]).name == "2-clip.mp4" and Path(job.result["thumbnail"]).name == "2-clip.jpg"
    assert not (job_dir / "1-clip.mp4").exists()
    assert all(str(p) not in str(job.result) for p in partials)  # the old partial is never referenced

    # And the resync's cleanup removes the old partial, keeping the published files
    assert clean_partial_outputs(fleet.engine, fleet.output_root) == 1
    assert sorted(p.name for p in job_dir.iterdir()) == ["2-clip.jpg", "2-clip.mp4"]


@pytest.mark.timeout(120)
def test_another_owners_session_is_neither_rendered_nor_transcribed(fleet: Fleet, recording: DemoRecording) -> None:
    # Given the owner's imported session, and another owner who learnt its id
    fleet.worker("main", ("default", "render", "asr"))
    session_id = session_of(fleet, recording)["session_id"]
    intruder = "someone-else"

    # When they submit a render of it and a transcription of one of its segments
    render = fleet.submit("render_clip", {"session_id": session_id, "start_s": 0.0, "end_s": 2.0}, owner_id=intruder).id
    transcribe = fleet.submit("transcribe", {"session_id": session_id, "segment": 0}, owner_id=intruder).id

    # Then both fail as for a missing session: nothing rendered, transcribed or written
    rendered, transcribed = (fleet.wait_terminal(j, owner_id=intruder) for j in (render, transcribe))
    assert rendered.status == "failed" and f"no recording session {session_id}" in (rendered.error or "")
    assert transcribed.status == "failed" and "has no segment 0" in (transcribed.error or "")
    assert fleet.sql("SELECT count(*) FROM clips") == [(0,)]
    assert fleet.sql("SELECT count(*) FROM transcripts") == [(0,)]
    assert not (fleet.output_root / render).exists() and not (fleet.output_root / transcribe).exists()
