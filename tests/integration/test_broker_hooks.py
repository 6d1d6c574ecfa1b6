"""Middleware hooks on Tenure's brokers (:mod:`broker.hooks`): Dramatiq's calls, order and error handling,
without the calls to middleware that do not define a hook."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from dramatiq.broker import Broker
from dramatiq.message import Message
from dramatiq.middleware import Middleware, MiddlewareError

from broker import SQLiteBroker
from broker.hooks import HookDispatch
from broker.postgres import PostgresBroker
from broker.rabbitmq import TimestampedRabbitmqBroker
from broker.redis_heartbeat import HeartbeatRedisBroker
from broker.redis_wakeup import WakingRedisBroker

QUEUE = "hooks"


class Watched(Middleware):
    """Records every lookup of a hook on it, whether it defines the hook or not."""

    def __init__(self, name: str, calls: list[str], lookups: list[str]) -> None:
        self.name, self.calls, self.lookups = name, calls, lookups

    def __getattribute__(self, attr: str) -> Any:
        if attr.startswith(("before_", "after_")):
            object.__getattribute__(self, "lookups").append(f"{object.__getattribute__(self, 'name')}.{attr}")
        return object.__getattribute__(self, attr)


class Enqueues(Watched):
    def before_enqueue(self, broker: Any, message: Message, delay: int | None) -> None:
        self.calls.append(f"{self.name}.before_enqueue")

    def after_enqueue(self, broker: Any, message: Message, delay: int | None) -> None:
        self.calls.append(f"{self.name}.after_enqueue")


class Refuses(Middleware):
    def before_enqueue(self, broker: Any, message: Message, delay: int | None) -> None:
        raise MiddlewareError("refused")


class Breaks(Middleware):
    def after_enqueue(self, broker: Any, message: Message, delay: int | None) -> None:
        raise RuntimeError("broken hook")


@pytest.fixture()
def broker(sqlite_url: str) -> Iterator[SQLiteBroker]:
    b = SQLiteBroker(sqlite_url, middleware=[])
    b.declare_queue(QUEUE)
    yield b
    b.close()


def _message() -> Message:
    return Message(queue_name=QUEUE, actor_name="noop", args=(), kwargs={}, options={})


def test_a_hook_is_called_on_the_middleware_that_define_it_in_dramatiqs_order_and_never_looked_up_on_others(
    broker: SQLiteBroker,
) -> None:
    calls: list[str] = []
    lookups: list[str] = []
    for m in (Enqueues("a", calls, lookups), Watched("idle", calls, lookups), Enqueues("b", calls, lookups)):
        broker.add_middleware(m)
    lookups.clear()  # add_middleware calls a new middleware's declare hooks itself, as Dramatiq's does

    broker.enqueue(_message())
    broker.enqueue(_message())

    # before_* first to last, after_* last to first, as Dramatiq's Broker
    assert calls == ["a.before_enqueue", "b.before_enqueue", "b.after_enqueue", "a.after_enqueue"] * 2
    assert not [hook for hook in lookups if hook.startswith("idle.")]


def test_a_middleware_list_changed_after_the_first_signal_is_dispatched_anew(broker: SQLiteBroker) -> None:
    calls: list[str] = []
    lookups: list[str] = []
    idle = Watched("idle", calls, lookups)
    broker.add_middleware(idle)
    broker.enqueue(_message())

    broker.add_middleware(Enqueues("late", calls, lookups))
    broker.enqueue(_message())
    assert calls == ["late.before_enqueue", "late.after_enqueue"]

    # A hook given to an instance is seen once the list changes again, here in place (not through add_middleware)
    calls.clear()
    idle.after_enqueue = lambda *args: calls.append("idle.after_enqueue")  # type: ignore[method-assign]
    broker.middleware.remove(broker.middleware[-1])
    broker.enqueue(_message())
    assert calls == ["idle.after_enqueue"]


def test_a_middleware_error_stops_the_signal_and_any_other_failure_is_logged_and_passed(
    broker: SQLiteBroker, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    broker.add_middleware(Breaks())
    broker.add_middleware(Enqueues("after", calls, []))
    with caplog.at_level(logging.CRITICAL):
        broker.enqueue(_message())
    assert calls == ["after.before_enqueue", "after.after_enqueue"]
    assert "Unexpected failure in after_enqueue of" in caplog.text

    broker.add_middleware(Refuses(), before=Breaks)
    with pytest.raises(MiddlewareError, match="refused"):
        broker.enqueue(_message())


@pytest.mark.parametrize(
    "broker_class",
    [SQLiteBroker, PostgresBroker, HeartbeatRedisBroker, WakingRedisBroker, TimestampedRabbitmqBroker],
)
def test_every_broker_tenure_builds_dispatches_hooks_this_way(broker_class: type) -> None:
    mro = broker_class.__mro__
    assert HookDispatch in mro and mro.index(HookDispatch) < mro.index(Broker)
