"""The actors' tables: migration == models, idempotent session upsert, transcript replace, channels, cleanup, CLI."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine

from jobs.db import make_engine
from jobs.registry import BACKOFF_CAP_S
from jobs.schema import head_revisions, upgrade
from tasks import store
from tasks.channels import ChannelError, EmailChannel, WebhookChannel, parse_channels
from tasks.domain.demo_recording import DemoRecording, make_recording
from tasks.domain.recording.importer import import_recording
from tasks.models import metadata
from tasks.outputs import clean_partial_outputs
from tasks.runtime import hinted_backoff
from tenure_cli import main


@pytest.fixture(scope="module")
def small_recording(tmp_path_factory: pytest.TempPathFactory) -> DemoRecording:
    return make_recording(tmp_path_factory.mktemp("rec") / "r", segments=2, seconds=2.0, speech=False)


@pytest.fixture()
def engine(sqlite_url: str) -> Iterator[Engine]:
    upgrade(sqlite_url)
    e = make_engine(sqlite_url)
    try:
        yield e
    finally:
        e.dispose()


def test_one_head_and_migration_equals_models(engine: Engine) -> None:
    # One head (later revisions chain after 0004, which merged the accounts and schedules branches)
    heads = head_revisions()
    assert len(heads) == 1 and min(heads) >= "0004", heads
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn,
            opts={"compare_type": True, "include_object": lambda o, n, t, r, c: t != "table" or n in metadata.tables},
        )
        assert compare_metadata(ctx, metadata) == []


def test_session_upsert_is_idempotent_and_replaces_segments(engine: Engine, small_recording: DemoRecording) -> None:
    imported = import_recording(small_recording.folder)
    with engine.begin() as conn:
        first, created = store.session_upsert(conn, owner_id="u1", imported=imported, folder="f", job_id="j1")
    with engine.begin() as conn:
        again, created_again = store.session_upsert(conn, owner_id="u1", imported=imported, folder="f", job_id="j2")
        other, _ = store.session_upsert(conn, owner_id="u2", imported=imported, folder="f", job_id="j3")
    assert created and not created_again and first == again and other != first
    with engine.connect() as conn:
        assert [s.idx for s in store.segment_list(conn, first, owner_id="u1")] == [0, 1]
        # another owner's session reads as empty, like a missing one
        assert store.segment_list(conn, first, owner_id="u2") == []
        assert store.segment_list(conn, other, owner_id="u1") == []
        assert len(store.danmaku_stats_list(conn, first)) == 2
        session = store.session_get(conn, first)
    assert session is not None and session.import_job_id == "j2" and session.segment_count == 2


def test_transcript_upsert_replaces_the_same_range(engine: Engine, small_recording: DemoRecording) -> None:
    imported = import_recording(small_recording.folder)
    with engine.begin() as conn:
        sid, _ = store.session_upsert(conn, owner_id="u1", imported=imported, folder="f", job_id="j1")
        args = {"session_id": sid, "segment_idx": 0, "start_ms": 0, "end_ms": 2000, "language": "en"}
        a = store.transcript_upsert(conn, **args, text="old", cues=[], srt_path="a.srt", job_id="t1")
        b = store.transcript_upsert(
            conn, **args, text="new", cues=[{"start_s": 0, "end_s": 1, "text": "new"}], srt_path="b.srt", job_id="t2"
        )
    assert a == b
    with engine.connect() as conn:
        [row] = store.transcript_list(conn, sid)
    assert row.text == "new" and row.cues[0]["text"] == "new" and row.job_id == "t2"


def test_channels_parse_and_errors_never_show_secrets() -> None:
    channels = parse_channels(
        {
            "hook": {"type": "webhook", "url": "https://h.example/x", "secret": "whsec_c2VjcmV0c2VjcmV0"},
            "mail": {"type": "email", "host": "smtp.example", "password": "pw-123456", "sender": "a@x", "to": ["b@x"]},
        }
    )
    assert isinstance(channels["hook"], WebhookChannel) and channels["hook"].endpoint.breaker_key == "hook"
    assert isinstance(channels["mail"], EmailChannel) and "pw-123456" not in repr(channels["mail"])
    with pytest.raises(ChannelError, match="missing field 'url'") as err:
        parse_channels({"hook": {"type": "webhook", "secret": "whsec_c2VjcmV0c2VjcmV0"}})
    assert "whsec_" not in str(err.value)


def test_hinted_backoff_outside_a_job_is_the_default() -> None:
    assert 0 < hinted_backoff(1) <= 2 * 1.2 and hinted_backoff(10) <= BACKOFF_CAP_S * 1.2


def test_partials_of_unknown_or_finished_jobs_are_removed(engine: Engine, tmp_path: Path) -> None:
    partial = tmp_path / "out" / "nosuchjob" / ".1-clip.mp4.partial-abcd1234"
    partial.mkdir(parents=True)
    (partial / "clip.mp4").write_bytes(b"x")
    kept = tmp_path / "out" / "nosuchjob" / "1-clip.mp4"
    kept.write_bytes(b"x")
    assert clean_partial_outputs(engine, tmp_path / "out") == 1
    assert not partial.exists() and kept.exists()


def test_cli_make_recording(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "make-recording", str(tmp_path / "rec"), "--segments", "2", "--seconds", "1.5"]) == 0
    assert len(list((tmp_path / "rec").glob("*.flv"))) == 2 and len(list((tmp_path / "rec").glob("*.xml"))) == 2
    assert "recording of room" in capsys.readouterr().out


def test_cli_make_recording_of_another_room(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A second demo recording of another room imports as its own session (a session is room + start time)
    assert (
        main(["demo", "make-recording", str(tmp_path / "rec"), "--segments", "1", "--seconds", "1", "--room", "4242"])
        == 0
    )
    assert "recording of room 4242" in capsys.readouterr().out
    assert import_recording(tmp_path / "rec").room_id == 4242
