"""SQLiteResultBackend and SQLiteRateLimiterBackend on real SQLite files (no mocks).

Expiry is tested without sleeping: rows are aged with ``UPDATE … SET expires_at`` and store queries
take ``now``. Cross-process tests start fresh interpreters (``spawn``) on the same file.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dramatiq
import dramatiq.broker
import pytest
from dramatiq import Worker
from dramatiq.common import current_millis
from dramatiq.errors import RateLimitExceeded
from dramatiq.message import Message
from dramatiq.middleware import GroupCallbacks
from dramatiq.rate_limits import Barrier, ConcurrentRateLimiter, WindowRateLimiter
from dramatiq.results import ResultFailure, ResultMissing, Results, ResultTimeout

from broker import SQLiteBroker, SQLiteRateLimiterBackend, SQLiteResultBackend, UnsupportedDatabase
from broker.kv_store import KVStore

pytestmark = pytest.mark.timeout(60)

SPAWN = multiprocessing.get_context("spawn")


# -- helpers ---------------------------------------------------------------------------------------
def _url(path: Path) -> str:
    return f"sqlite:///{path}"


def _message(actor: str = "add") -> Message:
    return Message(queue_name="default", actor_name=actor, args=(), kwargs={}, options={})


def _row(path: Path, table: str, key: str) -> tuple | None:
    with sqlite3.connect(path) as conn:
        return conn.execute(f"SELECT value, expires_at FROM {table} WHERE key = ?", (key,)).fetchone()


def _set_expiry(path: Path, table: str, key: str, expires_at: int) -> None:
    conn = sqlite3.connect(path)
    try:
        with conn:
            assert conn.execute(f"UPDATE {table} SET expires_at = ? WHERE key = ?", (expires_at, key)).rowcount == 1
    finally:
        conn.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "kv.db"


@pytest.fixture
def results(db: Path) -> Iterator[SQLiteResultBackend]:
    backend = SQLiteResultBackend(_url(db))
    yield backend
    backend.close()


@pytest.fixture
def limiter(db: Path) -> Iterator[SQLiteRateLimiterBackend]:
    backend = SQLiteRateLimiterBackend(_url(db))
    yield backend
    backend.close()


# -- children of the cross-process tests (module level so spawn can import them) --------------------
def _child_store_result(url: str, message: Message, value: int, delay_s: float) -> None:
    time.sleep(delay_s)
    SQLiteResultBackend(url).store_result(message, value, 60_000)


def _child_incr(url: str, key: str, attempts: int, maximum: int, start: Any, out: Any) -> None:
    backend = SQLiteRateLimiterBackend(url)
    start.wait()
    out.put(sum(backend.incr(key, 1, maximum, 60_000) for _ in range(attempts)))


def _child_barrier(url: str, key: str, out: Any) -> None:
    cleared = Barrier(SQLiteRateLimiterBackend(url), key, ttl=60_000).wait(timeout=30_000)
    out.put((cleared, time.time()))


def _run_children(target: Callable[..., None], args_list: list[tuple]) -> None:
    procs = [SPAWN.Process(target=target, args=args) for args in args_list]
    for p in procs:
        p.start()
    for p in procs:
        p.join(45)
        assert p.exitcode == 0, f"child exited with {p.exitcode}"


# -- results ---------------------------------------------------------------------------------------
def test_stored_result_is_read_back_with_its_ttl(results: SQLiteResultBackend, db: Path) -> None:
    message = _message()
    before = current_millis()
    results.store_result(message, {"answer": [4, 2]}, 60_000)
    after = current_millis()

    assert results.get_result(message) == {"answer": [4, 2]}
    assert results.get_result(message, block=True, timeout=10) == {"answer": [4, 2]}
    _, expires_at = _row(db, "broker_results", results.build_message_key(message))
    assert before + 60_000 <= expires_at <= after + 60_000


def test_missing_result_raises_result_missing(results: SQLiteResultBackend) -> None:
    with pytest.raises(ResultMissing):
        results.get_result(_message())


def test_stored_exception_raises_result_failure(results: SQLiteResultBackend) -> None:
    message = _message()
    results.store_exception(message, ValueError("boom"), 60_000)

    with pytest.raises(ResultFailure, match="boom"):
        results.get_result(message)


def test_storing_again_replaces_the_result(results: SQLiteResultBackend) -> None:
    message = _message()
    results.store_result(message, 1, 60_000)
    results.store_result(message, 2, 60_000)

    assert results.get_result(message) == 2


def test_expired_result_reads_as_missing(results: SQLiteResultBackend, db: Path) -> None:
    message = _message()
    results.store_result(message, 1, 60_000)
    _set_expiry(db, "broker_results", results.build_message_key(message), current_millis() - 1)

    with pytest.raises(ResultMissing):
        results.get_result(message)
    with pytest.raises(ResultTimeout):
        results.get_result(message, block=True, timeout=20)


def test_result_expiry_boundary(results: SQLiteResultBackend) -> None:
    # A row is live while expires_at > now: pin both sides of the boundary.
    store = results.store
    with store.write() as conn:
        store.result_put(conn, "k", b"1", 1_000)
    with store.read() as conn:
        assert store.result_get(conn, "k", 999) == b"1"
        assert store.result_get(conn, "k", 1_000) is None


def test_expired_results_are_purged_opportunistically(db: Path) -> None:
    backend = SQLiteResultBackend(_url(db), purge_interval_ms=0)
    old, new = _message(), _message()
    backend.store_result(old, 1, 60_000)
    _set_expiry(db, "broker_results", backend.build_message_key(old), current_millis() - 1)

    backend.store_result(new, 2, 60_000)

    assert _row(db, "broker_results", backend.build_message_key(old)) is None
    assert backend.get_result(new) == 2
    backend.close()


def test_purges_are_spaced_by_the_interval(results: SQLiteResultBackend, db: Path) -> None:
    old = _message()
    results.store_result(old, 1, 60_000)  # the first store of a process purges and starts the interval
    key = results.build_message_key(old)
    _set_expiry(db, "broker_results", key, current_millis() - 1)

    results.store_result(_message(), 2, 60_000)
    assert _row(db, "broker_results", key) is not None  # within the interval: kept (but missing)

    assert results.purge_expired() == 1
    assert _row(db, "broker_results", key) is None


def test_blocking_get_times_out(results: SQLiteResultBackend) -> None:
    started = time.monotonic()
    with pytest.raises(ResultTimeout):
        results.get_result(_message(), block=True, timeout=150)
    assert 0.15 <= time.monotonic() - started < 1.0


def test_blocking_get_returns_result_stored_by_another_thread(results: SQLiteResultBackend, db: Path) -> None:
    message = _message()
    other = SQLiteResultBackend(_url(db))  # another instance on the same file, as Results and a caller
    timer = threading.Timer(0.1, other.store_result, args=(message, "late", 60_000))
    timer.start()
    try:
        assert results.get_result(message, block=True, timeout=10_000) == "late"
    finally:
        timer.join()
        other.close()


def test_blocking_get_returns_result_stored_by_another_process(results: SQLiteResultBackend, db: Path) -> None:
    message = _message()
    child = SPAWN.Process(target=_child_store_result, args=(_url(db), message, 42, 0.2))
    child.start()
    try:
        assert results.get_result(message, block=True, timeout=30_000) == 42
    finally:
        child.join(30)
    assert child.exitcode == 0


def test_backend_shares_the_brokers_database(tmp_path: Path) -> None:
    broker = SQLiteBroker(_url(tmp_path / "shared.db"))
    backend = SQLiteResultBackend(broker=broker)
    limiter = SQLiteRateLimiterBackend(broker=broker)
    assert backend.store.target == broker.target == limiter.store.target
    message = _message()
    backend.store_result(message, 7, 60_000)
    assert SQLiteResultBackend(_url(tmp_path / "shared.db")).get_result(message) == 7
    broker.close()


def test_unusable_configurations_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedDatabase):
        SQLiteResultBackend("sqlite:///:memory:")
    with pytest.raises(UnsupportedDatabase):
        SQLiteRateLimiterBackend(":memory:")
    with pytest.raises(ValueError):
        SQLiteResultBackend(_url(tmp_path / "x.db"), synchronous="OFF")


# -- rate limiter backend --------------------------------------------------------------------------
def test_add_sets_only_absent_or_expired_keys(limiter: SQLiteRateLimiterBackend, db: Path) -> None:
    assert limiter.add("k", 3, 60_000)
    assert not limiter.add("k", 5, 60_000)
    assert _row(db, "broker_rate_limits", "k")[0] == 3

    _set_expiry(db, "broker_rate_limits", "k", current_millis() - 1)
    assert limiter.add("k", 5, 60_000)
    assert _row(db, "broker_rate_limits", "k")[0] == 5


def test_incr_stops_at_maximum_and_resets_ttl_on_success(limiter: SQLiteRateLimiterBackend, db: Path) -> None:
    assert limiter.incr("k", 2, 3, 60_000)  # a missing key counts as 0
    _set_expiry(db, "broker_rate_limits", "k", current_millis() + 5_000)
    assert limiter.incr("k", 1, 3, 60_000)
    value, expires_at = _row(db, "broker_rate_limits", "k")
    assert value == 3 and expires_at > current_millis() + 50_000

    _set_expiry(db, "broker_rate_limits", "k", current_millis() + 5_000)
    assert not limiter.incr("k", 1, 3, 60_000)
    value, expires_at = _row(db, "broker_rate_limits", "k")
    assert value == 3 and expires_at <= current_millis() + 5_000  # a refused incr leaves the TTL alone


def test_decr_stops_at_minimum(limiter: SQLiteRateLimiterBackend, db: Path) -> None:
    assert limiter.add("k", 2, 60_000)
    assert limiter.decr("k", 1, 0, 60_000)
    assert limiter.decr("k", 1, 0, 60_000)
    assert not limiter.decr("k", 1, 0, 60_000)
    assert _row(db, "broker_rate_limits", "k")[0] == 0
    assert not limiter.decr("missing", 1, 0, 60_000)


def test_expired_counter_counts_as_zero(limiter: SQLiteRateLimiterBackend, db: Path) -> None:
    assert limiter.incr("k", 5, 5, 60_000)
    assert not limiter.incr("k", 1, 5, 60_000)
    _set_expiry(db, "broker_rate_limits", "k", current_millis() - 1)

    assert limiter.incr("k", 1, 5, 60_000)
    assert _row(db, "broker_rate_limits", "k")[0] == 1


def test_counter_expiry_boundary(limiter: SQLiteRateLimiterBackend) -> None:
    store = limiter.store
    with store.write() as conn:
        store.ratelimit_put(conn, "k", 4, 1_000)
    with store.read() as conn:
        assert store.ratelimit_get(conn, "k", 999) == 4
        assert store.ratelimit_get(conn, "k", 1_000) is None
        assert store.ratelimit_sum(conn, ["k", "k", "missing"], 999) == 4
        assert store.ratelimit_sum(conn, ["k"], 1_000) == 0
    with store.write() as conn:
        assert not KVStore.ratelimit_add(conn, "k", 1, 999, 5_000)
        assert KVStore.ratelimit_add(conn, "k", 1, 1_000, 5_000)


def test_incr_and_sum_enforces_the_total_over_the_window(limiter: SQLiteRateLimiterBackend, db: Path) -> None:
    def window() -> list[str]:
        return ["w@2", "w@1", "w@0"]

    assert limiter.incr("w@1", 2, 10, 60_000)  # an earlier bucket of the window holds 2
    assert limiter.incr_and_sum("w@2", window, 1, 3, 60_000)
    assert not limiter.incr_and_sum("w@2", window, 1, 3, 60_000)
    assert _row(db, "broker_rate_limits", "w@2")[0] == 1

    # When the earlier bucket expires, it no longer counts.
    _set_expiry(db, "broker_rate_limits", "w@1", current_millis() - 1)
    assert limiter.incr_and_sum("w@2", window, 2, 3, 60_000)
    assert not limiter.incr_and_sum("w@2", window, 1, 3, 60_000)
    assert _row(db, "broker_rate_limits", "w@2")[0] == 3

    # The bucket alone over the maximum is refused even if keys() omits it.
    assert not limiter.incr_and_sum("w@2", lambda: [], 1, 3, 60_000)


def test_wait_times_out_without_notification(limiter: SQLiteRateLimiterBackend) -> None:
    started = time.monotonic()
    assert not limiter.wait("events", 100)
    assert 0.1 <= time.monotonic() - started < 1.0


def test_wait_notify_persists_until_its_ttl(limiter: SQLiteRateLimiterBackend, db: Path) -> None:
    limiter.wait_notify("events", 60_000)

    # A party that starts waiting after the notification still sees it (as with Redis).
    assert limiter.wait("events", 0)
    assert limiter.wait("events", 1_000)

    _set_expiry(db, "broker_rate_limits", "events", current_millis() - 1)
    assert not limiter.wait("events", 0)


def test_wait_notify_wakes_a_waiting_thread(limiter: SQLiteRateLimiterBackend, db: Path) -> None:
    outcome: list[bool] = []
    waiter = threading.Thread(target=lambda: outcome.append(limiter.wait("events", 10_000)))
    waiter.start()
    notifier = SQLiteRateLimiterBackend(_url(db))
    time.sleep(0.05)  # let the waiter reach its backoff; the notification must cut it short
    notified = time.monotonic()
    notifier.wait_notify("events", 60_000)
    waiter.join(10)

    assert outcome == [True]
    assert time.monotonic() - notified < 1.0
    notifier.close()


def test_expired_keys_are_purged_opportunistically(db: Path) -> None:
    backend = SQLiteRateLimiterBackend(_url(db), purge_interval_ms=0)
    backend.add("old", 1, 60_000)
    _set_expiry(db, "broker_rate_limits", "old", current_millis() - 1)

    backend.incr("new", 1, 5, 60_000)

    assert _row(db, "broker_rate_limits", "old") is None
    assert _row(db, "broker_rate_limits", "new")[0] == 1
    backend.close()


def test_barrier_in_one_process(limiter: SQLiteRateLimiterBackend) -> None:
    barrier = Barrier(limiter, f"barrier-{uuid.uuid4()}", ttl=30_000)
    assert barrier.create(parties=2)
    assert not barrier.create(parties=10)

    assert not barrier.wait(block=False)
    assert barrier.wait(block=False)


def test_barrier_releases_blocked_threads_together(limiter: SQLiteRateLimiterBackend) -> None:
    barrier = Barrier(limiter, f"barrier-{uuid.uuid4()}", ttl=30_000)
    assert barrier.create(parties=3)
    released: list[float] = []

    def party() -> None:
        assert barrier.wait(timeout=10_000)
        released.append(time.monotonic())

    threads = [threading.Thread(target=party) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.1)  # the two parties are blocked in their backoff when the last one arrives
    assert barrier.wait(timeout=10_000)
    for t in threads:
        t.join(10)

    assert len(released) == 2
    assert max(released) - min(released) < 0.05  # woken in-process, not by their next poll


def test_concurrent_increments_across_processes_stop_exactly_at_maximum(db: Path) -> None:
    # Given four processes that each try 200 increments of one key with a maximum of 500
    processes, attempts, maximum = 4, 200, 500
    start = SPAWN.Barrier(processes)
    out = SPAWN.Queue()

    # When they run at the same time
    _run_children(_child_incr, [(_url(db), "shared", attempts, maximum, start, out) for _ in range(processes)])

    # Then exactly `maximum` increments succeeded and the counter holds exactly that
    successes = [out.get(timeout=10) for _ in range(processes)]
    assert sum(successes) == maximum
    assert _row(db, "broker_rate_limits", "shared")[0] == maximum


def test_barrier_across_processes(db: Path) -> None:
    key = f"barrier-{uuid.uuid4()}"
    backend = SQLiteRateLimiterBackend(_url(db))
    assert Barrier(backend, key, ttl=60_000).create(parties=3)
    out = SPAWN.Queue()
    children = [SPAWN.Process(target=_child_barrier, args=(_url(db), key, out)) for _ in range(2)]
    for c in children:
        c.start()

    cleared = Barrier(backend, key, ttl=60_000).wait(timeout=30_000)
    released = [time.time()]
    for _ in children:
        child_cleared, at = out.get(timeout=30)
        assert child_cleared
        released.append(at)
    for c in children:
        c.join(30)
        assert c.exitcode == 0

    assert cleared
    assert max(released) - min(released) < 1.0
    backend.close()


def test_backends_opened_before_fork_work_in_the_child(
    results: SQLiteResultBackend, limiter: SQLiteRateLimiterBackend
) -> None:
    # Given backends whose connections were opened in the parent
    message = _message()
    results.store_result(message, "parent", 60_000)
    assert limiter.incr("forked", 1, 10, 60_000)

    def child() -> None:
        results.store_result(message, "child", 60_000)
        assert limiter.incr("forked", 1, 10, 60_000)

    # When a forked child uses the same objects
    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    proc.join(30)

    # Then it opened its own connections, and the parent's still work
    assert proc.exitcode == 0
    assert results.get_result(message) == "child"
    assert not limiter.incr("forked", 9, 10, 60_000)
    assert limiter.incr("forked", 8, 10, 60_000)


# -- end to end: a real Worker on SQLiteBroker -----------------------------------------------------
@dataclass
class Stack:
    broker: SQLiteBroker
    worker: Worker
    results: SQLiteResultBackend
    limiter: SQLiteRateLimiterBackend
    db: Path

    def settle(self, *queues: str) -> None:
        for queue in queues or ("default",):
            self.broker.join(queue, timeout=30_000)
        self.worker.join()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    db = tmp_path / "e2e.db"
    broker = SQLiteBroker(_url(db), lease_ttl_ms=10_000)
    results = SQLiteResultBackend(broker=broker)
    limiter = SQLiteRateLimiterBackend(broker=broker)
    broker.add_middleware(Results(backend=results))
    broker.add_middleware(GroupCallbacks(limiter))
    previous = dramatiq.broker.global_broker
    dramatiq.set_broker(broker)  # pipeline() and group() find their broker here
    # Create the file (and switch it to WAL) before the worker's threads open connections at once:
    # on a brand-new file SQLite refuses concurrent WAL switches with "database is locked".
    results.purge_expired()
    worker = Worker(broker, worker_timeout=100, worker_threads=8)
    worker.start()
    try:
        yield Stack(broker, worker, results, limiter, db)
    finally:
        worker.stop()
        broker.close()
        results.close()
        limiter.close()
        dramatiq.broker.global_broker = previous


def test_pipeline_with_results(stack: Stack) -> None:
    @dramatiq.actor(broker=stack.broker, store_results=True)
    def add(x: int, y: int = 0) -> int:
        return x + y

    pipe = dramatiq.pipeline([add.message(1, 2), add.message(3), add.message(4)]).run()

    assert pipe.get_result(block=True, timeout=20_000) == 10
    assert list(pipe.get_results(block=True, timeout=20_000)) == [3, 6, 10]


def test_group_results(stack: Stack) -> None:
    @dramatiq.actor(broker=stack.broker, store_results=True)
    def double(x: int) -> int:
        return 2 * x

    g = dramatiq.group([double.message(i) for i in range(6)]).run()

    assert list(g.get_results(block=True, timeout=20_000)) == [0, 2, 4, 6, 8, 10]
    g.wait(timeout=1_000)


def test_group_completion_callback_runs_once_after_every_member(stack: Stack) -> None:
    finished: list[int] = []
    callbacks: list[int] = []
    done = threading.Event()

    @dramatiq.actor(broker=stack.broker)
    def member(i: int) -> None:
        time.sleep(0.02)
        finished.append(i)

    @dramatiq.actor(broker=stack.broker)
    def completed() -> None:
        callbacks.append(len(finished))
        done.set()

    g = dramatiq.group([member.message(i) for i in range(5)])
    g.add_completion_callback(completed.message())
    g.run()

    assert done.wait(20)
    stack.settle()
    assert callbacks == [5]
    assert sorted(finished) == [0, 1, 2, 3, 4]


def test_concurrent_rate_limiter_limits_concurrent_runs(stack: Stack) -> None:
    mutex = ConcurrentRateLimiter(stack.limiter, f"limit-{uuid.uuid4()}", limit=2, ttl=60_000)
    lock = threading.Lock()
    running, peak, completed = [0], [0], []

    @dramatiq.actor(broker=stack.broker, max_retries=200, min_backoff=10, max_backoff=50)
    def limited(i: int) -> None:
        with mutex.acquire():  # raises RateLimitExceeded when 2 are running: Retries re-enqueues
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.05)
            with lock:
                running[0] -= 1
                completed.append(i)

    for i in range(8):
        limited.send(i)
    stack.settle()

    assert sorted(completed) == list(range(8))
    assert 1 <= peak[0] <= 2
    assert _row(stack.db, "broker_rate_limits", mutex.key)[0] == 0  # every slot given back


def test_window_rate_limiter_limits_runs_per_window(stack: Stack) -> None:
    window = WindowRateLimiter(stack.limiter, f"window-{uuid.uuid4()}", limit=3, window=10)
    ran, refused = [], []

    @dramatiq.actor(broker=stack.broker, max_retries=0)
    def limited(i: int) -> None:
        try:
            with window.acquire():
                ran.append(i)
        except RateLimitExceeded:
            refused.append(i)

    for i in range(8):
        limited.send(i)
    stack.settle()

    assert len(ran) == 3 and len(refused) == 5
    with sqlite3.connect(stack.db) as conn:
        buckets = dict(conn.execute("SELECT key, value FROM broker_rate_limits WHERE key LIKE ?", (window.key + "@%",)))
    assert sum(buckets.values()) == 3
