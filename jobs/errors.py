"""The job layer's errors (a class docstring is its default message) and error-text hygiene."""

from __future__ import annotations

import re


class JobError(Exception):
    """A job-layer error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (type(self).__doc__ or "").strip())


class UnknownKind(JobError, LookupError):
    """No job kind is registered under this name."""


class JobNotFound(JobError, LookupError):
    """No such job (or it belongs to another owner)."""


class PayloadInvalid(JobError, ValueError):
    """The payload does not fit the kind's schema."""

    def __init__(self, problems: dict[str, list[str]]) -> None:
        super().__init__(
            "the payload does not fit this kind: " + "; ".join(f"{k}: {' '.join(v)}" for k, v in problems.items())
        )
        #: Field → reasons (``payload`` for the whole document).
        self.problems = problems


class IdempotencyConflict(JobError):
    """This idempotency key was already used for a different request."""


class StaleAttempt(JobError):
    """This execution is no longer the job's current attempt; the write changed nothing."""


class JobCancelled(JobError):
    """The job was cancelled; the execution must stop."""


class JobTimeout(JobError):
    """Job timed out."""


class JobNotRetryable(JobError):
    """Only failed, cancelled or interrupted jobs can be retried."""


class JobStillExiting(JobNotRetryable):
    """The job timed out but its execution is still exiting (its thread has not stopped); retry it once it
    has exited."""


class JobNotDeletable(JobError):
    """Only finished jobs that no other job refers to can be deleted."""


class CursorExpired(JobError):
    """Events after this change cursor were deleted by retention: resync from ``head``."""

    def __init__(self, head: str) -> None:
        super().__init__(f"cursor expired; head is {head}")
        self.head = head


class SchemaMismatch(JobError):
    """The database schema is not at the revision this version of Tenure expects."""


#: Longest error text stored on a job.
MAX_ERROR_CHARS = 500

#: Words naming a secret in ``key=value`` / ``key: value`` text.
_SECRET_WORD = r"(?:password|passwd|pwd|secret|token|api[_-]?key|apikey|auth|credential|session)"

_SECRET_PATTERNS = [
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 ***"),
    # credentials inside URLs: scheme://user:password@host
    (re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)([^/\s:@]+):([^/\s@]+)@"), r"\1\2:***@"),
    # key=value: an assignment whose key names a secret (PGPASSWORD=…, session=…, auth_token2=…)
    (
        re.compile(rf"(?i)\b([\w-]*{_SECRET_WORD}[\w-]*)(\s*=\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&]+)"),
        r"\1\2***",
    ),
    # key: value — also how messages name a thing before saying what is wrong with it
    # ("session-2026: not a directory", "/etc/passwd: not inside an import root"). So the key is a word
    # of letters (no digits, not part of a path or file name), and a plain word followed by more text is
    # the message, not a value; a quoted value, one with digits or symbols, or a last word is masked.
    (
        re.compile(
            rf"(?i)(?<![\w./\\-])([A-Za-z_-]*{_SECRET_WORD}[A-Za-z_-]*)(\s*:\s*)"
            r"(\"[^\"]*\"|'[^']*'|(?![A-Za-z]+\s+\S)[^\s,;&]+)"
        ),
        r"\1\2***",
    ),
    # long opaque tokens (hex/base64-ish runs) are more likely keys than prose
    (re.compile(r"\b[A-Za-z0-9_-]{40,}\b"), "***"),
]


def redact(text: str) -> str:
    """Mask credentials and token-like strings in *text*."""
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def public_error(exc: BaseException | str, limit: int = MAX_ERROR_CHARS) -> str:
    """The text stored for an error: type and message, secret-free, at most *limit* characters.

    Tracebacks are logged, not stored: they carry paths and argument values.
    """
    if isinstance(exc, str):
        text = redact(" ".join(exc.split()))
    else:
        # Only the message is redacted: a type name like "SessionNotFound" followed by ": " would read as
        # a secret's key and mask the message's first word.
        message = redact(" ".join(str(exc).split()))
        text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text
