"""A dead letter's preview shows what identifies a message and why it died, never what it carries."""

from __future__ import annotations

import json

from dramatiq import Message

from webapp.dead_letters import MAX_ARG_CHARS, MAX_ARGS, preview


def _body(*args: object, options: dict | None = None, **kwargs: object) -> bytes:
    return Message(queue_name="q", actor_name="a", args=args, kwargs=kwargs, options=options or {}).encode()


def test_identifiers_and_the_last_traceback_line_are_shown_redacted() -> None:
    traceback = (
        'Traceback (most recent call last):\n  File "/srv/app/tasks.py", line 3, in fetch\n'
        "    connect(url)\nConnectionError: could not reach postgres://app:hunter2@db/x\n"
    )
    shown = preview(
        _body(
            options={"tenure_job_id": "job-1", "retries": 2, "traceback": traceback, "tenure_schedule": {"name": "n"}}
        )
    )
    assert shown["decoded"] and shown["job_id"] == "job-1" and shown["schedule"] == "n" and shown["retries"] == 2
    assert shown["error"] == "ConnectionError: could not reach postgres://app:***@db/x"
    text = json.dumps(shown, default=str, ensure_ascii=False)
    assert "tasks.py" not in text and "hunter2" not in text
    assert shown["enqueued_at"] is not None


def test_arguments_are_redacted_truncated_and_containers_show_only_their_shape() -> None:
    long_token = "x" * 60
    shown = preview(
        _body(
            "录制 session",
            "postgres://bob:s3cret@db/media",
            {"password": "hunter2"},
            ["a", "b"],
            "word " * 100,
            long_token,
            *range(10),
            api_token="abc",
            Password="pw",
            note="token=abc123",
            count=3,
        )
    )
    args, kwargs = shown["args"], shown["kwargs"]
    assert args[:4] == ['"录制 session"', '"postgres://bob:***@db/media"', "{object of 1 key(s)}", "[list of 2]"]
    assert len(args[4]) == MAX_ARG_CHARS + 2 and args[4].endswith('…"')
    assert args[5] == '"***"'  # a long opaque string is more likely a key than prose
    assert len(args) == MAX_ARGS + 1 and args[-1] == "… 8 more"
    assert kwargs == {"api_token": "***", "Password": "***", "note": '"token=***"', "count": "3"}
    text = json.dumps(shown, default=str, ensure_ascii=False)
    for secret in ("s3cret", "hunter2", "abc123", long_token, '"abc"', '"pw"'):
        assert secret not in text


def test_an_undecodable_body_shows_nothing_of_it() -> None:
    shown = preview(b"\x00not json postgres://u:hunter2@h")
    assert shown["decoded"] is False and shown["args"] == [] and shown["kwargs"] == {} and shown["error"] is None
