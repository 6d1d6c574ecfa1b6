"""One field against another in a kind's payload schema: ``after`` (an end after its start) and ``check``.

The same schema validates every submit (API, UI, Python), so a refusal here is the API's 422 reason; the
browser-side check of the same rules is tested in tests/e2e/test_browser.py.
"""

from __future__ import annotations

import pytest

from jobs import payloads
from tasks import import_recording, pipeline, render_clip, transcribe

WINDOW = payloads.schema(
    "Window",
    start_s=payloads.field("number", "Start", unit="s", minimum=0, default=0.0),
    end_s=payloads.field("number", "End", unit="s", nullable=True, after="start_s"),
    count=payloads.field("integer", "Count", minimum=1, maximum=9, after="start_s"),
)


@pytest.mark.parametrize(
    ("payload", "problems"),
    [
        ({"start_s": 1.5, "end_s": 2}, {}),
        ({"start_s": 2, "end_s": 2}, {"end_s": ["Must be after Start (2 s)."]}),
        ({"start_s": 2.5, "end_s": 1}, {"end_s": ["Must be after Start (2.5 s)."]}),
        ({"end_s": 0}, {"end_s": ["Must be after Start (0 s)."]}),  # the start's default counts
        ({"end_s": None}, {}),  # no end: nothing to order
        (
            {"start_s": 3, "end_s": 1, "count": 2},
            {"end_s": ["Must be after Start (3 s)."], "count": ["Must be after Start (3 s)."]},
        ),
        ({"start_s": -1, "end_s": -2}, {"start_s": ["Must be at least 0."]}),  # the schema first, then the order
    ],
)
def test_after_orders_two_fields(payload, problems) -> None:  # type: ignore[no-untyped-def]
    assert WINDOW.problems(payload) == problems


def test_after_is_stated_in_the_json_schema_and_the_form_fields() -> None:
    doc = WINDOW.json_schema()
    assert doc["properties"]["end_s"]["x-after"] == "start_s"
    assert doc["x-rules"] == ["End comes after Start.", "Count comes after Start."]
    assert doc["description"] == "Also: End comes after Start. Also: Count comes after Start."
    assert {f.name: f.after for f in WINDOW.fields()} == {"start_s": None, "end_s": "start_s", "count": "start_s"}


@pytest.mark.parametrize(
    "properties",
    [
        {"end_s": payloads.field("number", "End", after="start_s")},  # no such field
        {
            "start_s": payloads.field("string", "Start"),
            "end_s": payloads.field("number", "End", after="start_s"),
        },  # not a number
    ],
)
def test_after_must_name_a_number_field_of_the_schema(properties) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="both must be number fields"):
        payloads.schema("Bad", **properties)


def test_the_media_kinds_refuse_an_end_at_or_before_the_start() -> None:
    assert render_clip.PAYLOAD.problems({"session_id": "s", "start_s": 10, "end_s": 10}) == {
        "end_s": ["Must be after Start (10 s)."]
    }
    assert render_clip.PAYLOAD.problems({"session_id": "s", "start_s": 10, "end_s": 10.5}) == {}
    assert pipeline.PAYLOAD.problems({"folder": "f", "start_s": 30, "end_s": 20}) == {
        "end_s": ["Must be after Clip start (30 s)."]
    }
    assert transcribe.PAYLOAD.problems({"session_id": "s", "segment": 0, "start_s": 5, "end_s": 5}) == {
        "end_s": ["Must be after From (5 s)."]
    }
    assert transcribe.PAYLOAD.problems({"session_id": "s", "segment": 0, "end_s": None}) == {}  # to its end


def test_the_media_kinds_checks_of_what_json_schema_cannot_say() -> None:
    """``check``: the rules beyond an ordering (both ends of a window or neither; a folder or files)."""
    assert pipeline.PAYLOAD.problems({"folder": "f", "start_s": 3}) == {
        "end_s": ["Give both a start and an end, or neither."]
    }
    assert pipeline.PAYLOAD.problems({"folder": "f", "end_s": 3}) == {
        "end_s": ["Give both a start and an end, or neither."]
    }
    assert pipeline.PAYLOAD.problems({"folder": "f"}) == {}
    both = {"folder": "f", "files": ["a.flv"]}
    assert import_recording.PAYLOAD.problems(both) == {"folder": ["Give either a folder or a list of files."]}
    assert import_recording.PAYLOAD.problems({}) == {"folder": ["Give either a folder or a list of files."]}
    assert import_recording.PAYLOAD.problems({"files": ["a.flv"]}) == {}
    # and the OpenAPI document states each of them in words
    assert pipeline.PAYLOAD.json_schema()["x-rules"] == [
        "Clip end comes after Clip start.",
        "give both a clip start and a clip end, or neither.",
    ]
