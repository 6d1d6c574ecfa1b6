"""Pure job-layer logic: error hygiene, backoff, the status enum, request digests."""

from __future__ import annotations

import pytest

from jobs.enqueue import request_digest
from jobs.errors import MAX_ERROR_CHARS, JobTimeout, public_error, redact
from jobs.registry import default_backoff
from jobs.status import RETRYABLE_STATUSES, TERMINAL_STATUSES, JobStatus


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("connect to postgresql://app:hunter2@db/x failed", "hunter2"),
        ("bad password=hunter2 given", "hunter2"),
        ("api_key: 'abc123def'", "abc123def"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9abcdef", "eyJhbGciOiJIUzI1NiJ9abcdef"),
        ("token " + "a" * 48, "a" * 48),
    ],
)
def test_redact_masks_secrets(text: str, secret: str) -> None:
    assert secret not in redact(text)


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("password: hunter2 rejected", "hunter2"),
        ("db password: correcthorse", "correcthorse"),
        ("X-Api-Key: abcdef", "abcdef"),
        ("auth_token2=abc", "abc"),
        ("token:opensesame", "opensesame"),
    ],
)
def test_redact_masks_key_value_secrets(text: str, secret: str) -> None:
    assert secret not in redact(text)


@pytest.mark.parametrize(
    "text",
    [
        # A message naming a thing whose name holds a secret word, then saying what is wrong with it.
        "session-2026: not a directory",
        "/etc/passwd: not inside an import root (TENURE_IMPORT_ROOTS) or your uploads",
        "tokens: not a directory",
        "password: must have at least 10 characters",
        "auth failed for user bob",
    ],
)
def test_redact_keeps_ordinary_words(text: str) -> None:
    assert redact(text) == text


def test_redaction_keeps_the_reasons_of_import_errors() -> None:
    # The two reasons issue 16 found garbled ("session-2026: *** a directory" reversed nothing, but
    # "/etc/passwd: *** inside an import root" reversed the message).
    class RecordingError(Exception):
        pass

    folder = RecordingError("session-2026: not a directory")
    assert public_error(folder) == "RecordingError: session-2026: not a directory"
    outside = RecordingError("/etc/passwd: not inside an import root (TENURE_IMPORT_ROOTS) or your uploads")
    assert "not inside an import root" in public_error(outside)
    assert redact("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9abcdef") == "Authorization: Bearer ***"


def test_public_error_is_truncated_and_typed() -> None:
    text = public_error(RuntimeError("word " * 1000))
    assert text.startswith("RuntimeError: ")
    assert len(text) == MAX_ERROR_CHARS
    assert public_error(JobTimeout()) == "JobTimeout: Job timed out."


def test_backoff_grows_to_a_cap_with_jitter() -> None:
    for attempt, base in [(1, 2), (2, 4), (4, 16), (5, 30), (12, 30)]:
        values = [default_backoff(attempt) for _ in range(50)]
        assert all(0.8 * base <= v <= 1.2 * base for v in values)
        assert len(set(values)) > 1


def test_statuses() -> None:
    assert {s.value for s in JobStatus} == {"queued", "running", "succeeded", "failed", "cancelled", "interrupted"}
    assert JobStatus.SUCCEEDED.terminal and not JobStatus.RUNNING.terminal
    assert RETRYABLE_STATUSES < TERMINAL_STATUSES
    assert JobStatus.SUCCEEDED not in RETRYABLE_STATUSES


def test_request_digest_is_canonical() -> None:
    a = request_digest("k", {"a": 1, "b": [1, 2]}, ("rec", "1"))
    b = request_digest("k", {"b": [1, 2], "a": 1}, ("rec", "1"))
    assert a == b
    assert a != request_digest("k", {"a": 2, "b": [1, 2]}, ("rec", "1"))
    assert a != request_digest("other", {"a": 1, "b": [1, 2]}, ("rec", "1"))


def test_an_error_type_naming_a_secret_word_does_not_mask_the_message() -> None:
    class SessionNotFound(Exception):
        pass

    assert public_error(SessionNotFound("no recording session 12ab")) == "SessionNotFound: no recording session 12ab"
    assert public_error(SessionNotFound("session=12ab expired")) == "SessionNotFound: session=*** expired"
    assert public_error(SessionNotFound("")) == "SessionNotFound"
