"""Import of a generated recording: true durations, danmaku recovery, hostile XML refused."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tasks.domain.control import Cancelled
from tasks.domain.demo_recording import DemoRecording, flv_tags
from tasks.domain.recording.danmaku import HostileXml, comments_to_xml, parse_danmaku
from tasks.domain.recording.importer import RecordingError, UnreadableSegment, import_recording
from tasks.domain.recording.names import parse_segment_name

from .conftest import write

BOMB = """<?xml version="1.0"?>
<!DOCTYPE i [
 <!ENTITY a "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa">
 <!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">
 <!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">
 <!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">
 <!ENTITY e "&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;">
 <!ENTITY f "&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;">
 <!ENTITY g "&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;">
]>
<i><d p="1.0,1,25,16777215,0,0,1,0">&g;</d><d p="2.0,1,25,16777215,0,0,1,0">hi</d></i>
"""
XXE = """<?xml version="1.0"?>
<!DOCTYPE i [<!ENTITY x SYSTEM "file:///etc/hostname">]>
<i><d p="1.0,1,25,16777215,0,0,1,0">&x;</d></i>
"""


def test_import_generated_recording_with_truncated_flv_and_malformed_xml(recording: DemoRecording) -> None:
    # Given the issue-4 fixture: 3 segments, #1 truncated FLV, #2 cut XML
    reports: list[tuple[float, str]] = []

    # When
    session = import_recording(recording.folder, progress=lambda f, m: reports.append((f, m)))

    # Then: one session, segments in order, true durations
    assert session.room_id == recording.room_id
    assert session.title == recording.title
    assert [s.path for s in session.segments] == [s.flv for s in recording.segments]
    for got, made in zip(session.segments, recording.segments, strict=True):
        assert got.duration_s == pytest.approx(made.written_duration_s, abs=0.1), got.path.name
        assert got.started_at == made.started_at
    truncated = session.segments[1]
    assert truncated.status == "truncated"
    assert truncated.header_duration_s == pytest.approx(6.0, abs=0.1)  # the header lies
    assert truncated.duration_s < 4.0
    assert [s.status for s in (session.segments[0], session.segments[2])] == ["ok", "ok"]
    # The session timeline is the concatenation of the true durations.
    assert session.segments[2].offset_s == pytest.approx(session.segments[0].duration_s + truncated.duration_s)
    assert session.duration_s == pytest.approx(sum(s.duration_s for s in session.segments))

    # Danmaku: complete files counted fully, the cut one as far as it parses
    first, _, cut = (s.danmaku for s in session.segments)
    assert first is not None and cut is not None
    assert first.stats.comments == recording.segments[0].comments_written and not first.malformed
    assert cut.malformed
    assert recording.segments[2].comments_complete <= cut.stats.comments < recording.segments[2].comments_written
    assert session.danmaku.comments == sum(s.danmaku.stats.comments for s in session.segments if s.danmaku)
    assert session.danmaku.superchats == 3 and session.danmaku.gifts == 9

    # Warnings: one per problem, naming the file
    kinds = {(w.kind, w.file) for w in session.warnings}
    assert kinds == {
        ("truncated_segment", recording.segments[1].flv.name),
        ("malformed_danmaku", recording.segments[2].xml.name),
    }
    assert [round(f, 3) for f, _ in reports] == [0.333, 0.667, 1.0]


def test_reimport_is_idempotent(recording: DemoRecording) -> None:
    assert import_recording(recording.folder).key == import_recording(recording.folder).key


def test_import_of_uploaded_files_equals_folder_import(recording: DemoRecording) -> None:
    files = [s.flv for s in reversed(recording.segments)]
    by_files = import_recording(files)
    by_folder = import_recording(recording.folder)
    assert by_files.key == by_folder.key
    assert [s.duration_s for s in by_files.segments] == [s.duration_s for s in by_folder.segments]


def test_truncated_flv_true_duration_measured_independently(recording: DemoRecording) -> None:
    """The generator's own FLV tag parse agrees with the PyAV demux scan within 0.1 s."""
    seg = recording.segments[1]
    last_ts = max(ts for _, kind, ts, _ in flv_tags(seg.flv.read_bytes()) if kind in (8, 9)) / 1000
    assert last_ts < seg.written_duration_s <= last_ts + 0.1


def test_unreadable_segment_fails_naming_the_file(recording: DemoRecording, tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    for seg in recording.segments[:2]:
        shutil.copy(seg.flv, folder / seg.flv.name)
    bad = folder / recording.segments[1].flv.name
    bad.write_bytes(b"this is not a video at all" * 10)
    with pytest.raises(UnreadableSegment, match="录制-23058-20261128-214915-056"):
        import_recording(folder)


def test_import_is_cancellable_between_segments(recording: DemoRecording) -> None:
    calls = iter([False, True])
    with pytest.raises(Cancelled):
        import_recording(recording.folder, should_stop=lambda: next(calls))


def test_empty_folder_and_mixed_rooms_are_refused(recording: DemoRecording, tmp_path: Path) -> None:
    with pytest.raises(RecordingError, match="no recorder segments"):
        import_recording(tmp_path)
    other = tmp_path / recording.segments[0].flv.name.replace("23058", "999")
    shutil.copy(recording.segments[0].flv, other)
    with pytest.raises(RecordingError, match="several rooms"):
        import_recording([recording.segments[0].flv, other])


def test_xml_bomb_is_rejected_quickly_with_a_clear_error(tmp_path: Path) -> None:
    path = write(tmp_path / "bomb.xml", BOMB)
    started = time.perf_counter()
    with pytest.raises(HostileXml, match=r"bomb\.xml: refused danmaku XML with entity expansion"):
        parse_danmaku(path)
    assert time.perf_counter() - started < 2.0


def test_external_entity_is_rejected_and_never_read(tmp_path: Path) -> None:
    path = write(tmp_path / "xxe.xml", XXE)
    with pytest.raises(HostileXml, match="declares entities x"):
        parse_danmaku(path)


def test_bomb_next_to_a_segment_fails_the_import(recording: DemoRecording, tmp_path: Path) -> None:
    seg = recording.segments[0]
    shutil.copy(seg.flv, tmp_path / seg.flv.name)
    write(tmp_path / seg.xml.name, BOMB)
    with pytest.raises(HostileXml):
        import_recording(tmp_path)


def test_danmaku_escaping_survives_and_reserialises(recording: DemoRecording, tmp_path: Path) -> None:
    parsed = parse_danmaku(recording.segments[0].xml)
    assert parsed.info is not None and parsed.info.title == recording.title
    assert {"user&b", "<b>粗体</b>"} & {c.user for c in parsed.comments}
    again = parse_danmaku(write(tmp_path / "again.xml", comments_to_xml(parsed.comments)))
    assert [c.text for c in again.comments] == [c.text for c in parsed.comments]
    assert not again.malformed


def test_segment_name_parsing() -> None:
    name = parse_segment_name("录制-23058-20221218-214909-056-哔哩哔哩-音悦台.flv")
    assert name is not None
    assert (name.room_id, name.title) == (23058, "哔哩哔哩-音悦台")
    assert name.started_at.isoformat() == "2022-12-18T21:49:09.056000+08:00"
    assert parse_segment_name("random.flv") is None
    assert parse_segment_name("录制-1-20221318-214909-056-x.flv") is None  # month 13
