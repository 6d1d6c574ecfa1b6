"""A wrapper that keeps secrets out of reprs, logs and error messages."""

from __future__ import annotations

from collections.abc import Iterable

#: What a redacted secret looks like.
REDACTED = "***"


class Secret:
    """A secret string (webhook secret, SMTP password): ``repr``/``str`` never show it; ``reveal()`` does."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret itself, for the one call that needs it."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret({REDACTED!r})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """Replace every occurrence of each non-empty secret in ``text`` with :data:`REDACTED`.

    Parameters
    ----------
    text:
        A message that may have picked up a secret (e.g. from a library's exception).
    secrets:
        Secret values (and derived forms, such as a decoded key) to remove.

    Returns
    -------
    str
    """
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return text
