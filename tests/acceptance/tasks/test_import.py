"""``import_recording`` as a job through a real worker: domain rows, warnings, idempotent re-import, failures."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tasks.domain.demo_recording import DemoRecording

from .conftest import OWNER, Fleet


@pytest.mark.timeout(90)
def test_import_commits_session_segments_and_stats_and_is_idempotent(fleet: Fleet, recording: DemoRecording) -> None:
    # Given a worker and the generated 3-segment recording (one truncated FLV, one cut XML)
    fleet.worker("w1", ("default",))

    # When it is imported twice
    first = fleet.wait_terminal(fleet.submit("import_recording", {"folder": str(recording.folder)}).id)
    second = fleet.wait_terminal(fleet.submit("import_recording", {"folder": str(recording.folder)}).id)

    # Then both succeeded with the same session, and the rows match the files
    assert first.status == "succeeded", first.error
    assert second.status == "succeeded", second.error
    assert first.result["created"] is True and second.result["created"] is False
    assert first.result["session_id"] == second.result["session_id"]
    session_id = first.result["session_id"]
    assert fleet.sql("SELECT count(*) FROM recording_sessions") == [(1,)]
    segments = fleet.sql(
        "SELECT idx, status, duration_s, offset_s FROM recording_segments WHERE session_id = :s ORDER BY idx",
        s=session_id,
    )
    assert [s.status for s in segments] == ["ok", "truncated", "ok"]
    truncated = recording.segments[1]
    assert segments[1].duration_s == pytest.approx(truncated.written_duration_s, abs=0.1)
    assert segments[2].offset_s == pytest.approx(segments[0].duration_s + segments[1].duration_s)
    stats = fleet.sql("SELECT segment_idx, comments, malformed FROM danmaku_stats ORDER BY segment_idx")
    assert [s.comments for s in stats[:2]] == [seg.comments_written for seg in recording.segments[:2]]
    # a cut file keeps its complete items (and at most the half-written one the recover parser salvages)
    cut = recording.segments[2]
    assert cut.comments_complete <= stats[2].comments < cut.comments_written
    assert [bool(s.malformed) for s in stats] == [False, False, True]
    # progress per segment, and a warning event per problem
    assert first.progress == 1.0
    warnings = {e.data["kind"] for e in fleet.events(first.id) if e.type == "import_warning"}
    assert warnings == {"truncated_segment", "malformed_danmaku"}


@pytest.mark.timeout(60)
def test_unreadable_segment_fails_the_job_naming_the_file(
    fleet: Fleet, recording: DemoRecording, tmp_path: Path
) -> None:
    # Given a copy of the recording whose last segment is garbage
    folder = tmp_path / "broken"
    shutil.copytree(recording.folder, folder)
    bad = sorted(folder.glob("*.flv"))[-1]
    bad.write_bytes(b"this is not an flv" * 100)
    fleet.worker("w1", ("default",))

    job = fleet.wait_terminal(fleet.submit("import_recording", {"folder": str(folder)}).id)

    # Then it failed at once (no retry: re-reading cannot help) and the error names the file
    assert job.status == "failed" and job.attempt == 1
    assert bad.name in (job.error or "")
    assert fleet.sql("SELECT count(*) FROM recording_sessions") == [(0,)]


@pytest.mark.timeout(90)
def test_imports_read_only_the_import_roots_and_the_owners_own_uploads(
    fleet: Fleet, recording: DemoRecording, tmp_path: Path
) -> None:
    # Given a worker whose only import root is the folder holding the generated recording
    root = recording.folder.parent
    fleet.env_extra["TENURE_IMPORT_ROOTS"] = str(root)
    uploads = fleet.output_root / "uploads"
    theirs = uploads / "someone-else" / "up1"
    mine = uploads / OWNER / "up2"
    shutil.copytree(recording.folder, theirs)
    shutil.copytree(recording.folder, mine)
    outside = tmp_path / "elsewhere"
    shutil.copytree(recording.folder, outside)
    link = root / f"link-{tmp_path.name}"
    link.symlink_to(theirs, target_is_directory=True)
    fleet.worker("w1", ("default",))

    # When imports name another owner's upload, directly, through "..", through a symlink in the root,
    # a folder outside every root, a path that does not exist, or one outside file among allowed ones
    refused = {
        "another owner's upload": {"folder": str(theirs)},
        "dot-dot out of the root": {"folder": f"{root}/../{theirs.relative_to(root.parent)}"},
        "symlink in the root": {"folder": str(link)},
        "outside every root": {"folder": str(outside)},
        "missing path": {"folder": str(tmp_path / "no-such-folder")},
        "one file outside": {"files": [str(p) for p in sorted(mine.iterdir())] + [str(next(outside.iterdir()))]},
    }
    jobs_by_case = {case: fleet.submit("import_recording", payload).id for case, payload in refused.items()}
    allowed = {
        "own upload": fleet.submit("import_recording", {"folder": str(mine)}).id,
        "import root": fleet.submit("import_recording", {"folder": str(recording.folder)}).id,
    }

    # Then each refused one failed at once, before reading anything, with the same explanation
    for case, job_id in jobs_by_case.items():
        job = fleet.wait_terminal(job_id)
        assert job.status == "failed" and job.attempt == 1, (case, job.status, job.error)
        assert "not inside an import root (TENURE_IMPORT_ROOTS) or your uploads" in (job.error or ""), (case, job.error)
        assert not [e for e in fleet.events(job_id) if e.type == "import_warning"], case
    # and the owner's own upload and the import root were imported (one session each: different folders,
    # same recorder key, so the second import updates the owner's one session)
    for case, job_id in allowed.items():
        job = fleet.wait_terminal(job_id)
        assert job.status == "succeeded", (case, job.error)
    assert fleet.sql("SELECT count(*) FROM recording_sessions WHERE owner_id = :o", o=OWNER) == [(1,)]
    link.unlink()


@pytest.mark.timeout(60)
def test_an_owner_id_that_is_not_a_plain_folder_name_cannot_reach_other_uploads(
    fleet: Fleet, recording: DemoRecording
) -> None:
    # Given an upload of owner "a_b", and a job of owner "../uploads/a_b" (an id that is no folder name)
    fleet.env_extra["TENURE_IMPORT_ROOTS"] = str(fleet.tmp / "no-root")
    theirs = fleet.output_root / "uploads" / "a_b" / "up1"
    shutil.copytree(recording.folder, theirs)
    fleet.worker("w1", ("default",))

    # When that owner imports the upload by a path through "its" uploads folder
    sneaky = "../uploads/a_b"
    job_id = fleet.submit("import_recording", {"folder": str(theirs)}, owner_id=sneaky).id

    # Then it is refused: the owner id maps to the plain folder "___uploads_a_b", not to another owner's
    job = fleet.wait_terminal(job_id, 30, owner_id=sneaky)
    assert job.status == "failed" and "not inside an import root" in (job.error or ""), job.error


@pytest.mark.timeout(90)
def test_an_upload_reference_imports_only_the_owners_own_upload(fleet: Fleet, recording: DemoRecording) -> None:
    import uuid

    # Given no import root, an upload of this owner and one of another owner, stored where the web puts them
    fleet.env_extra["TENURE_IMPORT_ROOTS"] = str(fleet.tmp / "no-root")
    mine, theirs = uuid.uuid4().hex, uuid.uuid4().hex
    shutil.copytree(recording.folder, fleet.output_root / "uploads" / OWNER / mine)
    shutil.copytree(recording.folder, fleet.output_root / "uploads" / "someone-else" / theirs)
    fleet.worker("w1", ("default",))

    # When the owner imports by reference (what POST /api/v1/uploads answers): its own upload, the other
    # owner's upload id, and something that only looks like a reference
    own = fleet.submit("import_recording", {"folder": f"upload:{mine}"}).id
    foreign = fleet.submit("import_recording", {"folder": f"upload:{theirs}"}).id
    forged = fleet.submit("import_recording", {"folder": "upload:../someone-else"}).id

    # Then its own upload is imported; the other owner's id resolves among this owner's uploads only (there
    # is none: not a directory), and the forged one is refused — no error names a server path
    assert fleet.wait_terminal(own).status == "succeeded", fleet.wait_terminal(own).error
    failed = fleet.wait_terminal(foreign)
    assert failed.status == "failed" and failed.error == f"RecordingError: {theirs}: not a directory", failed.error
    refused = fleet.wait_terminal(forged)
    assert refused.status == "failed" and "is not an upload reference" in (refused.error or ""), refused.error
    assert str(fleet.output_root) not in (failed.error or "") + (refused.error or "")
