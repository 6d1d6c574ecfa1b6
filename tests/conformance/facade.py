"""Thin test facades over Tenure's brokers with the StubBroker-only helpers Dramatiq's tests use.

Dramatiq's generic tests are written against ``StubBroker``: they call ``join(queue, fail_fast=…)``
and read ``dead_letters``. This facade adds exactly those, recording dead letters in-process when
the consumer nacks, and uses a proxy class that also inherits ``_StubMessageProxy`` so exceptions
stay on nacked messages (what ``fail_fast`` re-raises and what the leak tests patch).
"""

from __future__ import annotations

from collections import defaultdict

from dramatiq.brokers.stub import _StubMessageProxy
from dramatiq.common import q_name

from broker import SQLiteBroker
from broker.consumer import SQLiteMessageProxy
from broker.postgres import PostgresBroker, PostgresMessageProxy


class _FacadeProxy(SQLiteMessageProxy, _StubMessageProxy):
    pass


class _PostgresFacadeProxy(PostgresMessageProxy, _StubMessageProxy):
    pass


class _StubHelpers:
    """``join(…, fail_fast=…)`` and ``dead_letters``, over any broker with ``_settle(message, dead=…)``."""

    def __init__(self, *args, fail_fast_default: bool = True, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.fail_fast_default = fail_fast_default
        self.dead_letters_by_queue: defaultdict[str, list] = defaultdict(list)

    @property
    def dead_letters(self) -> list:
        return [m for messages in self.dead_letters_by_queue.values() for m in messages]

    def _settle(self, message, *, dead: bool) -> None:  # type: ignore[no-untyped-def,override]
        if dead:
            self.dead_letters_by_queue[q_name(message.queue_name)].append(message)
        super()._settle(message, dead=dead)

    def flush_all(self) -> None:
        super().flush_all()
        for letters in self.dead_letters_by_queue.values():
            letters.clear()

    def join(self, queue_name: str, *, timeout: int | None = None, fail_fast: bool | None = None) -> None:
        super().join(queue_name, timeout=timeout)  # type: ignore[misc]
        should_fail_fast = self.fail_fast_default if fail_fast is None else fail_fast
        if should_fail_fast:
            for message in self.dead_letters_by_queue[q_name(queue_name)]:
                raise (message._exception or Exception("Message failed with unknown error")) from None


class SQLiteTestBroker(_StubHelpers, SQLiteBroker):
    proxy_class = _FacadeProxy


class PostgresTestBroker(_StubHelpers, PostgresBroker):
    proxy_class = _PostgresFacadeProxy
