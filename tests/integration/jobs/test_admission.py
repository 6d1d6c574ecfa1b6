"""Admission on SQLite and PostgreSQL: concurrency and rate limits per key, fair share across owners.

The broker is stood in for by reading the messages the job layer wrote, in the order a FIFO broker
delivers them (SQLite: the broker's rows; PostgreSQL: the outbox the relay publishes in order), and
each is handed to the worker's real claim with the options it carries. Real worker processes, real
brokers and SIGKILLs are the acceptance tests' (tests/acceptance/jobs/test_admission_workers.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from dramatiq.message import Message
from sqlalchemy import event
from sqlalchemy.orm import Session

import jobs
from jobs import admission_policy, admission_store, db
from jobs.lifecycle import AfterCommitBuffer
from jobs.limits import ConcurrencyLimit, RateLimit
from jobs.publish import JOB_ID_OPTION, LIMITS_OPTION
from jobs.queries import JobFilter
from settings import runtime

from .support import JobEnv


class Messages:
    """The job messages written so far, in the order the broker delivers them (the SQLite broker: higher
    ``broker_priority`` first, then FIFO; the outbox the relay publishes to Redis: FIFO), each once."""

    def __init__(self, env: JobEnv) -> None:
        self.env = env
        self.delivered: set[int] = set()

    def pending(self) -> list[tuple[int, Message]]:
        if self.env.backend == "sqlite":
            rows = self.env.sql(
                "SELECT id, body, eta FROM broker_messages WHERE state IN (0, 3) ORDER BY priority, eta, id"
            )
        else:
            rows = self.env.sql("SELECT id, body, eta FROM outbox ORDER BY eta, id")
        now = jobs.store.now_ms()
        return [(r[0], Message.decode(bytes(r[1]))) for r in rows if r[0] not in self.delivered and r[2] <= now]

    def job_ids(self) -> list[str]:
        return [m.options[JOB_ID_OPTION] for _, m in self.pending()]

    def deliver_next(self) -> tuple[str, Any] | None:
        """Deliver the oldest due message to the worker's claim: (job id, its context or None)."""
        found = self.pending()
        if not found:
            return None
        row_id, message = found[0]
        self.delivered.add(row_id)
        limits = tuple(message.options.get(LIMITS_OPTION) or (None, None))
        ctx = self.env.mw.claimer.claim(self.env.broker, message.options[JOB_ID_OPTION], message.queue_name, limits)
        return message.options[JOB_ID_OPTION], ctx


def _save(env: JobEnv, values: dict[str, Any]) -> None:
    current = runtime.get_settings(env.engine, env.settings)
    runtime.put_settings(env.engine, values, by="test", expected_revision=current["revision"], settings=env.settings)
    admission_policy.forget()


@contextmanager
def _statements(env: JobEnv) -> Iterator[list[str]]:
    """The SQL the job layer's engine runs while the block runs."""
    statements: list[str] = []

    def record(*args: Any) -> None:
        statements.append(args[2])

    event.listen(env.engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(env.engine, "before_cursor_execute", record)


def _held(env: JobEnv, job_id: str) -> tuple[str | None, str | None]:
    row = env.row(job_id)
    return row.held, row.held_on


def test_a_concurrency_limit_admits_up_to_its_limit_and_the_next_one_as_each_stops(env: JobEnv) -> None:
    env.declare("limited", lambda ctx: None, concurrency=ConcurrencyLimit("limited.owner", limit=2))
    ids = [env.submit("limited").id for _ in range(5)]
    other = env.submit("limited", owner_id="u2").id
    messages = Messages(env)
    # Two of u1's have messages; the rest wait for u1's key; u2's key is another key.
    assert sorted(messages.job_ids()) == sorted([ids[0], ids[1], other])
    assert [_held(env, i) for i in ids[2:]] == [("concurrency", "limited.owner=u1")] * 3
    assert jobs.get_job(env.engine, ids[2], owner_id="u1").waiting == {
        "reason": "concurrency",
        "limit_name": "limited.owner",
        "key": "u1",
        "key_is_owner": True,
        "running": 0,
        "limit": 2,
    }
    first = messages.deliver_next()
    second = messages.deliver_next()
    assert first is not None and second is not None and first[1] is not None and second[1] is not None
    assert jobs.get_job(env.engine, ids[2], owner_id="u1").waiting["running"] == 2  # type: ignore[index]
    # When one stops running, exactly one waiting job gets its message (any of them: they were submitted
    # in the same millisecond).
    env.mw.runner(first[1])
    admitted = [i for i in ids[2:] if env.row(i).held is None]
    assert len(admitted) == 1 and admitted[0] in messages.job_ids()
    env.mw.runner(second[1])
    assert sum(env.row(i).held is None for i in ids[2:]) == 2


def test_a_cancelled_admitted_job_gives_its_place_to_a_waiting_one(env: JobEnv) -> None:
    env.declare("limited", lambda ctx: None, concurrency=ConcurrencyLimit("limited.owner", limit=1))
    first, waiting = env.submit("limited").id, env.submit("limited").id
    assert _held(env, waiting) == ("concurrency", "limited.owner=u1")
    assert jobs.cancel(env.engine, first, by="u1").outcome == jobs.CancelOutcome.CANCELLED
    assert _held(env, waiting) == (None, None)
    # A waiting job cancelled holds nothing: its cancel frees nobody's place.
    third = env.submit("limited").id
    assert _held(env, third) == ("concurrency", "limited.owner=u1")
    assert jobs.cancel(env.engine, third, by="u1").outcome == jobs.CancelOutcome.CANCELLED
    assert env.row(third).held is None and env.row(third).status == "cancelled"


def test_a_claim_over_the_limit_waits_for_the_key_instead_of_running(env: JobEnv) -> None:
    env.declare("limited", lambda ctx: None, concurrency=ConcurrencyLimit("limited.owner", limit=1))
    running = env.submit("limited").id
    messages = Messages(env)
    _, ctx = messages.deliver_next()  # type: ignore[misc]
    assert ctx is not None and ctx.job_id == running
    # A delayed job is admitted without counting (its message waits in the broker); when it comes due
    # the key is still full, so its claim makes it wait rather than run.
    delayed = env.submit("limited", delay=0.2).id
    assert env.row(delayed).held is None
    time.sleep(0.25)
    assert messages.deliver_next() == (delayed, None)
    assert _held(env, delayed) == ("concurrency", "limited.owner=u1")
    env.mw.runner(ctx)
    assert env.row(delayed).held is None
    job_id, ctx2 = messages.deliver_next()  # type: ignore[misc]
    assert job_id == delayed and ctx2 is not None


def test_a_limit_raised_at_run_time_admits_more_at_the_next_sweep(env: JobEnv) -> None:
    env.declare("limited", lambda ctx: None, concurrency=ConcurrencyLimit("limited.owner", limit=1))
    ids = [env.submit("limited").id for _ in range(4)]
    assert [env.row(i).held for i in ids] == [None, "concurrency", "concurrency", "concurrency"]
    _save(env, {"concurrency.limited.owner.limit": 3})
    assert jobs.admission.admit_waiting(env.engine, env.broker) == 1
    # Two more admitted (submitted in the same millisecond, any two of the three waiting ones).
    assert sorted(env.row(i).held or "" for i in ids) == ["", "", "", "concurrency"]


def test_a_rate_limit_starts_at_most_its_starts_per_period_without_polling(env: JobEnv) -> None:
    env.declare("rated", lambda ctx: None, rate=RateLimit("rated.owner", starts=2, per_s=1.0))
    ids = [env.submit("rated").id for _ in range(5)]
    messages = Messages(env)
    assert [env.row(i).held for i in ids] == [None, None, "rate", "rate", "rate"]
    started: list[str] = []

    def deliver_all() -> None:
        while (found := messages.deliver_next()) is not None:
            job_id, ctx = found
            if ctx is not None:
                started.append(job_id)
                env.mw.runner(ctx)

    deliver_all()
    assert started == ids[:2]
    # The two starts fill the period: one waiting job is admitted delayed until a start leaves it,
    # the others wait without a message.
    assert sorted(env.row(i).held or "" for i in ids[2:]) == ["", "rate", "rate"]
    deadline = time.monotonic() + 10
    while len(started) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
        deliver_all()
    assert sorted(started) == sorted(ids)
    # Never more than 2 starts in any 1-second window (the starts the database recorded).
    times = sorted(env.row(i).started_at or 0 for i in ids)
    assert all(times[i + 2] - times[i] >= 1000 for i in range(len(times) - 2)), times


def _drain_in_order(env: JobEnv, messages: Messages, limit: int) -> list[str]:
    """Deliver and run messages in FIFO order; the owners of the jobs started, in order."""
    owners: list[str] = []
    while len(owners) < limit and (found := messages.deliver_next()) is not None:
        _, ctx = found
        if ctx is not None:
            owners.append(ctx.owner_id)
            env.mw.runner(ctx)
    return owners


@pytest.mark.parametrize("limited", [False, True], ids=["plain", "with-a-concurrency-key"])
def test_fair_share_starts_a_newcomers_jobs_in_rotation_with_a_flood(env: JobEnv, limited: bool) -> None:
    # A key whose limit is never reached still takes the keyed path through admission
    limit = {"concurrency": ConcurrencyLimit("plain.owner", limit=1000)} if limited else {}
    env.declare("plain", lambda ctx: None, **limit)
    _save(env, {"fair_share.window": 4})
    for _ in range(40):
        env.submit("plain", owner_id="flood")
    messages = Messages(env)
    assert len(messages.job_ids()) == 4  # the window; the other 36 wait in the job store
    for _ in range(5):
        env.submit("plain", owner_id="late")
    owners = _drain_in_order(env, messages, 45)
    assert len(owners) == 45
    last_late = max(i for i, o in enumerate(owners) if o == "late")
    assert owners.count("late") == 5
    if env.backend == "sqlite":
        # Behind its share, the newcomer's jobs go before the flood's admitted ones (broker priority).
        assert last_late <= 1 + 5, owners
    else:
        # Redis's FIFO: the newcomer waits behind the window already admitted, then alternates with the flood.
        assert last_late <= 4 + 2 * 5, owners


@pytest.mark.services
def test_a_submit_held_by_a_window_emptied_before_it_committed_is_admitted_at_its_commit(
    postgres_env: JobEnv,
) -> None:
    """A submit sees the window full and makes its jobs wait; before it commits, the window's jobs are
    claimed and run, and their refills find nothing waiting (the submit's rows are not visible yet). No
    claim is left to admit them: the submit's own commit must."""
    env = postgres_env
    env.declare("plain", lambda ctx: None)
    _save(env, {"fair_share.window": 2})
    for _ in range(2):
        env.submit("plain", owner_id="first")
    messages = Messages(env)
    with Session(env.engine) as session, session.begin():
        late = [
            jobs.submit(session, owner_id="late", kind="plain", registry=env.registry, settings=env.settings).id
            for _ in range(3)
        ]
        assert _drain_in_order(env, messages, 2) == ["first", "first"]  # the window empties meanwhile
        assert messages.job_ids() == []
    # Then the commit refills the window: two of the three go, the third waits behind them
    assert sorted(_held(env, i)[0] or "admitted" for i in late) == ["admitted", "admitted", "queue"]
    assert _drain_in_order(env, messages, 3) == ["late", "late", "late"]


@pytest.mark.services
def test_a_postgres_submit_held_by_a_full_window_looks_again_after_its_commit_without_a_transaction(
    postgres_env: JobEnv,
) -> None:
    """The recheck after a held submit's commit (see the test above) first reads the window's room outside
    any transaction: under a flood the window is full at nearly every recheck, and a write transaction only
    to learn that costs two more round trips."""
    env = postgres_env
    env.declare("plain", lambda ctx: None)
    _save(env, {"fair_share.window": 1})
    env.submit("plain")
    begun: list[bool] = []  # per transaction SQLAlchemy begins: whether it is one on the server

    def count(conn: Any) -> None:
        begun.append(not conn.connection.driver_connection.autocommit)

    event.listen(env.engine, "begin", count)
    try:
        with _statements(env) as statements:
            held = env.submit("plain").id
    finally:
        event.remove(env.engine, "begin", count)
    assert _held(env, held) == ("queue", env.row(held).queue_name)
    assert begun.count(True) == 1  # the submit's own
    room_reads = [s for s in statements if s.startswith("SELECT CASE WHEN EXISTS") and "THEN 1 WHEN" not in s]
    assert len(room_reads) == 1  # the recheck's, after the commit


def test_a_window_refill_counts_each_key_once_and_the_jobs_past_its_room_wait_for_it(
    env: JobEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.declare("plain", lambda ctx: None)
    env.declare("keyed", lambda ctx: None, concurrency=ConcurrencyLimit("keyed.owner", limit=1))
    _save(env, {"fair_share.window": 2})
    for _ in range(2):
        env.submit("plain", owner_id="first")
    first, second = (env.submit("keyed", owner_id="u2").id for _ in range(2))
    assert [_held(env, i)[0] for i in (first, second)] == ["queue", "queue"]  # the window is full
    counted: list[str] = []
    key_active = admission_store.key_active
    monkeypatch.setattr(
        admission_store, "key_active", lambda conn, key, now: counted.append(key) or key_active(conn, key, now)
    )
    # A wider window: its refill picks both, the key has room for one
    _save(env, {"fair_share.window": 4})
    jobs.admission.admit_waiting(env.engine, env.broker)
    # The older goes; two submits in one millisecond are ordered by id, so either may be the older
    admitted, waiting = (first, second) if _held(env, first) == (None, None) else (second, first)
    if env.row(first).created_at != env.row(second).created_at:
        assert admitted == first
    assert (_held(env, admitted), _held(env, waiting)) == ((None, None), ("concurrency", "keyed.owner=u2"))
    # once for both (on PostgreSQL once more after the commit: the recheck of a key decided without its lock)
    assert counted == ["keyed.owner=u2"] * (1 if env.backend == "sqlite" else 2)
    assert admitted in Messages(env).job_ids() and waiting not in Messages(env).job_ids()


def test_a_submit_asks_whether_its_queues_window_is_full_in_one_statement(env: JobEnv) -> None:
    env.declare("plain", lambda ctx: None)
    _save(env, {"fair_share.window": 2})
    with _statements(env) as statements:
        ids = [env.submit("plain").id for _ in range(4)]
    # Room for two; then the window is full; then jobs wait for it already
    assert [_held(env, i)[0] for i in ids] == [None, None, "queue", "queue"]
    # One read per submit (on PostgreSQL a job held without the queue's lock also has the window looked at
    # again after its commit); no separate probe or count
    asked = [s for s in statements if s.startswith("SELECT CASE WHEN EXISTS (SELECT 1 FROM jobs WHERE held")]
    assert len([s for s in asked if "THEN 1 WHEN" in s]) == 4
    assert not [
        s for s in statements if s.startswith(("SELECT 1 FROM jobs WHERE held", "SELECT count(*) FROM (SELECT"))
    ]


def test_a_keyed_submit_asks_its_keys_count_and_its_queues_window_in_one_statement(env: JobEnv) -> None:
    env.declare("keyed", lambda ctx: None, concurrency=ConcurrencyLimit("keyed.owner", limit=2))
    _save(env, {"fair_share.window": 3})
    with _statements(env) as statements:
        ids = [env.submit("keyed", owner_id=owner).id for owner in ("a", "a", "a", "b", "b")]
    # a's third job is past its key's limit; b's second finds the window full (a's two and b's first)
    queue = env.row(ids[0]).queue_name
    assert [_held(env, i) for i in ids] == [
        (None, None), (None, None), ("concurrency", "keyed.owner=a"), (None, None), ("queue", queue)
    ]  # fmt: skip
    # One statement per submit reads both (on PostgreSQL the jobs held without their key's lock are looked at
    # again after their commit, by the release's own statements); no window statement of its own
    both = [s for s in statements if "concurrency_key = " in s and "THEN 1 WHEN" in s]
    assert len(both) == 5
    assert not [s for s in statements if s.startswith("SELECT CASE WHEN EXISTS") and "THEN 1 WHEN" in s]


def test_a_window_refill_reads_its_room_and_writes_its_messages_in_one_statement_each_in_the_order_it_picked(
    env: JobEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.declare("plain", lambda ctx: None)
    _save(env, {"fair_share.window": 2})
    flood = [env.submit("plain", owner_id="flood").id for _ in range(4)]
    newcomer = [env.submit("plain", owner_id="newcomer").id for _ in range(2)]
    assert [_held(env, i)[0] for i in flood + newcomer] == [None, None] + ["queue"] * 4
    _save(env, {"fair_share.window": 6})
    # The refill a claim makes, in its transaction: on SQLite the broker's own (the ack writer's), on
    # PostgreSQL + Redis a job transaction writing the outbox.
    inserts: list[int] = []
    statements: list[str] = []
    if env.backend == "sqlite":
        store = env.broker.store
        insert_many = store.message_insert_many
        monkeypatch.setattr(store, "message_insert", lambda *a, **k: pytest.fail("a message inserted alone"))
        monkeypatch.setattr(
            store, "message_insert_many", lambda conn, rows: inserts.append(len(rows)) or insert_many(conn, rows)
        )
        transaction = store.write()
    else:
        transaction = env.engine.begin()
    with transaction as conn:
        if env.backend == "sqlite":
            conn.set_trace_callback(statements.append)
        else:
            event.listen(conn, "before_cursor_execute", lambda *args: statements.append(args[2]))
        tx = db.Tx(conn, AfterCommitBuffer())
        tx.broker = env.broker
        try:
            jobs.admission.after_claims(tx, ["default"], [], now=jobs.store.now_ms())
        finally:
            if env.backend == "sqlite":
                conn.set_trace_callback(None)
    tx.pending.run()
    if env.backend == "sqlite":
        assert inserts == [4]
    else:
        assert [s.count("), (") + 1 for s in statements if s.startswith("INSERT INTO outbox")] == [4]
    # Whether jobs wait for the window and how much room it has: one statement
    window_reads = [s for s in statements if "count(*) FROM (SELECT 1 FROM jobs WHERE queue_name" in s]
    assert len(window_reads) == 1 and "EXISTS (SELECT 1 FROM jobs WHERE held" in window_reads[0]
    assert not [s for s in statements if s.startswith("SELECT 1 FROM jobs WHERE held")]
    # Picked in rotation: the newcomer's two (behind their owner's share), then the flood's next two (an
    # owner's jobs of one millisecond go in id order). The SQLite broker delivers the newcomer's ahead of the
    # flood's window; the outbox is first in, first out.
    owners = ["n" if i in newcomer else "f" for i in Messages(env).job_ids()]
    assert "".join(owners) == ("nnffff" if env.backend == "sqlite" else "ffnnff")
    assert [_held(env, i)[0] for i in flood + newcomer] == [None] * 6


def test_fair_share_weights_give_owners_their_shares(env: JobEnv) -> None:
    env.declare("plain", lambda ctx: None)
    _save(env, {"fair_share.window": 8, "owners.heavy.weight": 3})
    for _ in range(40):
        env.submit("plain", owner_id="light")
        env.submit("plain", owner_id="heavy")
    owners = _drain_in_order(env, Messages(env), 48)
    # The window holds the owners' jobs 3:1 once it has turned over, so they start 3:1.
    settled = owners[16:48]
    assert 22 <= settled.count("heavy") <= 26


def test_fair_share_off_admits_everything_at_once(env: JobEnv) -> None:
    env.declare("plain", lambda ctx: None)
    _save(env, {"fair_share.window": 2})
    ids = [env.submit("plain").id for _ in range(6)]
    assert sum(env.row(i).held == "queue" for i in ids) == 4
    _save(env, {"fair_share.enabled": False})
    jobs.admission.admit_waiting(env.engine, env.broker)
    assert [env.row(i).held for i in ids] == [None] * 6
    assert env.row(env.submit("plain").id).held is None


def test_priorities_order_an_owners_waiting_jobs(env: JobEnv) -> None:
    env.declare("plain", lambda ctx: None)
    _save(env, {"fair_share.window": 1})
    first = env.submit("plain").id
    low = env.submit("plain").id
    high = env.submit("plain", priority=5).id
    messages = Messages(env)
    starts: list[str] = []
    while (found := messages.deliver_next()) is not None:
        if found[1] is not None:
            starts.append(found[0])
            env.mw.runner(found[1])
    assert starts == [first, high, low]


@pytest.mark.parametrize("outcome", ["fails", "requeued", "lease lost"])
def test_every_way_a_run_stops_gives_the_key_back(env: JobEnv, outcome: str) -> None:
    calls = {"n": 0}

    def flaky(ctx: Any) -> None:
        calls["n"] += 1
        raise RuntimeError("boom")

    attempts = 2 if outcome == "requeued" else 1
    env.declare(
        "limited",
        flaky,
        concurrency=ConcurrencyLimit("limited.owner", limit=1),
        max_attempts=attempts,
        backoff=lambda n: 30.0,
        safe_to_rerun=True,
    )
    first, waiting = env.submit("limited").id, env.submit("limited").id
    messages = Messages(env)
    _, ctx = messages.deliver_next()  # type: ignore[misc]
    assert ctx is not None and env.row(waiting).held == "concurrency"
    if outcome == "lease lost":
        env.age_lease(first)
        jobs.recover_expired(env.engine, broker=env.broker)
    else:
        env.mw.runner(ctx)
    expected = {"fails": "failed", "requeued": "queued", "lease lost": "failed"}[outcome]
    assert env.row(first).status == expected
    assert env.row(waiting).held is None


def test_a_workflow_step_waits_for_its_dependencies_then_for_admission(env: JobEnv) -> None:
    from jobs.workflows import Step

    env.declare("a", lambda ctx: None)
    env.declare("b", lambda ctx: None)

    @env.registry.workflow("pair")
    def pair(request: Any) -> list[Step]:
        return [Step("a", "a"), Step("b", "b", depends_on=("a",))]

    parent = env.submit("pair").id
    steps = {s.kind: s for s in jobs.list_jobs(env.engine, owner_id="u1", where=JobFilter(parent_job_id=parent))}
    assert _held(env, steps["b"].id) == ("steps", parent)
    assert env.row(steps["a"].id).held is None
    messages = Messages(env)
    _drain_in_order(env, messages, 2)
    assert env.row(steps["b"].id).status == "succeeded"
    assert env.row(parent).status == "succeeded"
