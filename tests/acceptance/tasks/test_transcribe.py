"""``transcribe`` on the ``asr`` worker type: a stored transcript and SRT file; cancel within one segment."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from jobs import cancel
from tasks.domain.demo_recording import BUNDLED_SPEECH, DemoRecording
from tasks.domain.media.ffmpeg import ffmpeg_exe

from .conftest import OWNER, Fleet


def imported(fleet: Fleet, folder: Path) -> dict:
    job = fleet.wait_terminal(fleet.submit("import_recording", {"folder": str(folder)}).id)
    assert job.status == "succeeded", job.error
    return job.result


@pytest.mark.timeout(120)
def test_transcribe_stores_transcript_and_srt(fleet: Fleet, recording: DemoRecording) -> None:
    fleet.worker("main", ("default",))
    fleet.asr_worker()
    session = imported(fleet, recording.folder)

    job = fleet.wait_terminal(fleet.submit("transcribe", {"session_id": session["session_id"], "segment": 0}).id, 90)

    assert job.status == "succeeded", job.error
    srt = Path(job.result["srt"])
    assert srt.name == "1-segment-0.srt" and srt.parent.name == job.id and srt.is_file()
    assert "-->" in srt.read_text(encoding="utf-8")
    assert "racing game" in job.result["text"].lower()
    [(text, cues)] = fleet.sql("SELECT text, cues FROM transcripts WHERE job_id = :j", j=job.id)
    assert text == job.result["text"] and "start_s" in cues
    assert job.progress == 1.0

    # The model was loaded once in the asr process and is released when that worker shuts down
    second = fleet.wait_terminal(fleet.submit("transcribe", {"session_id": session["session_id"], "segment": 2}).id, 60)
    assert second.status == "succeeded", second.error
    fleet.stop("asr")
    assert "ASR model released (1 load(s) in this process)." in (fleet.tmp / "asr.log").read_text()


def long_speech_folder(tmp: Path, loops: int = 12) -> Path:
    """One recorder segment with the bundled speech repeated: many Whisper segments to cancel between."""
    folder = tmp / "long"
    folder.mkdir()
    out = folder / "录制-1-20260101-000000-000-long.flv"
    subprocess.run(
        [ffmpeg_exe(), "-loglevel", "error", "-f", "lavfi", "-i", "color=size=160x90:rate=5"]
        + ["-stream_loop", str(loops), "-i", str(BUNDLED_SPEECH), "-shortest"]
        + ["-c:v", "flv1", "-c:a", "aac", "-ar", "16000", str(out)],
        check=True,
    )
    return folder


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_cancel_mid_asr_stops_within_one_segment(fleet: Fleet, tmp_path: Path) -> None:
    # Given a long speech segment being transcribed
    fleet.worker("main", ("default",))
    fleet.asr_worker()
    session = imported(fleet, long_speech_folder(tmp_path))
    job_id = fleet.submit("transcribe", {"session_id": session["session_id"], "segment": 0}).id
    fleet.wait(lambda: (fleet.job(job_id).progress or 0) > 0.05, 120, "the first decoded segments")

    # When it is cancelled mid-way
    requested = time.monotonic()
    assert cancel(fleet.engine, job_id, by=OWNER).outcome.value == "requested"
    job = fleet.wait_terminal(job_id, 30)
    stopped_after_s = time.monotonic() - requested

    # Then it stopped at the next segment boundary: cancelled, no transcript, a partial count recorded
    assert job.status == "cancelled"
    stopped = fleet.event(job_id, "transcription_stopped")
    assert stopped is not None and stopped.data["segments_done"] >= 1
    assert job.progress is not None and job.progress < 0.9
    assert stopped_after_s < 10
    assert fleet.sql("SELECT count(*) FROM transcripts") == [(0,)]
    assert not list((fleet.output_root / job_id).glob("*.srt"))
