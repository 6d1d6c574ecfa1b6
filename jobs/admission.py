"""Admission: whether a queued job gets its broker message now, or waits for it in the job store.

A queued job starts only through its message, so admission decides what starts next by deciding which
jobs have one. A job **waits** (``jobs.held``, no message, holding no worker thread) when

- ``concurrency``: its concurrency key has ``limit`` jobs running or admitted to start;
- ``rate``: its rate key used its starts of the last period (one waiting job of the key then waits in the
  broker, delayed until a start leaves the period, to wake the others: no polling);
- ``queue``: fair share is on and its queue already has ``fair_share.window`` jobs ready in the broker.

and it is **admitted** (its message written in the same transaction: :func:`jobs.publish.publish_in_transaction`)
when what it waits on frees up, in the transaction that frees it:

- a claim takes an admitted job out of its queue's window (:func:`after_claims`);
- a running job of a key stops running, or an admitted one is cancelled (:func:`released`).

Waiting jobs are admitted **in rotation across owners**: the owner with the fewest jobs admitted or
running there (divided by its weight) goes next, and an owner's own jobs go highest priority first, then
oldest. The broker's FIFO therefore never holds more than the window of any one owner's backlog, and a
newcomer's jobs start within about a window's worth of starts.

The claim re-checks a keyed job's limits under the key's lock (:func:`claim_refusal`; on PostgreSQL a
transaction-scoped advisory lock, on SQLite its single writer), so a limit holds whatever order messages
arrive in (a retry's delayed message, a duplicate delivery, two admissions racing); a refused claim makes
the job wait again, and a release takes the same lock, so it sees that job. Admission at submit takes no
lock — a transaction submitting jobs of several keys would deadlock with another taking them in another
order —: an admission two transactions race into only costs a refused claim, and a job it makes wait is
released once more after its transaction commits (:func:`_recheck_after_commit`). The resync's
:func:`sweep` re-admits whatever a crash between two of these steps could leave waiting. What is applied
comes from :mod:`jobs.admission_policy`.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from sqlalchemy import Engine

from . import admission_store as store
from . import db
from .admission_policy import Policy, policy
from .admission_store import CONCURRENCY, QUEUE, RATE, STEPS, HeldJob
from .db import Tx
from .limits import key_value, limit_name, owner_keyed
from .publish import Publication, publish_in_transaction, resolve_broker
from .store import now_ms

logger = logging.getLogger(__name__)

#: Owners weighed per pick (a queue with more owners waiting serves the first ones by name first).
MAX_OWNERS = 1000
#: Waiting jobs read per owner at a time while picking.
PAGE = 16
#: A claim refills its queue's window once an eighth of it is free (its queries then serve several claims).
REFILL_PARTS = 8
#: At most so many jobs admitted by one release or refill that has no limit to respect (fair share just
#: switched off, a limit no kind declares any more); the sweep admits the rest.
UNBOUNDED_BATCH = 500


@dataclass(frozen=True, slots=True)
class Verdict:
    """What admission decided for one job: wait (``held``, ``on``) or go (its message's ``delay_ms``)."""

    held: str | None = None
    on: str | None = None
    delay_ms: int = 0


def verdict(
    tx: Tx, job: HeldJob, *, now: int, delay_ms: int, rules: Policy, fair: bool = True, counted: bool = False
) -> Verdict:
    """Whether *job* may have its message now, counting every other job (never itself).

    *fair*: apply the queue's fair-share window (False when the window itself is admitting it).
    *counted*: the job's row is queued and not waiting (requeued, recovered, run now), so the counts of
    admitted jobs include it: it is taken off them."""
    conn = tx.conn
    due = delay_ms <= 0
    # Whether the job's own row is in the counts of admitted jobs that are due, and in those of all.
    self_due = int(counted and job.run_after <= now)
    self_any = int(counted)
    key = job.concurrency_key
    window_full: bool | None = None  # asked with the key's count when nothing between can change `due`
    if key is not None and due:
        limit = rules.concurrency_limit(key)
        if limit is not None:
            if fair and rules.fair_share and job.rate_key is None:
                running, admitted, window_full = store.key_active_and_window_full(
                    conn, key, job.queue_name, now, rules.window, self_due
                )
            else:
                running, admitted = store.key_active(conn, key, now)
            if running + admitted - self_due >= limit:
                _recheck_after_commit(tx, CONCURRENCY, key)
                return Verdict(CONCURRENCY, key)
    rate_key = job.rate_key
    if rate_key is not None:
        rate = rules.rate(rate_key)
        if rate is not None:
            starts, period_ms = rate
            recent = store.rate_starts_since(conn, rate_key, now - period_ms)
            admitted = store.rate_admitted(conn, rate_key) - self_any
            if len(recent) + admitted >= starts:
                if admitted:
                    _recheck_after_commit(tx, RATE, rate_key)
                    return Verdict(RATE, rate_key)
                # Nobody of this key is admitted to wake the waiting ones: this job waits in the broker
                # until the start that fills the period leaves it.
                free_at = recent[len(recent) - starts] + period_ms if len(recent) >= starts else now
                delay_ms = max(delay_ms, free_at - now)
                due = delay_ms <= 0
    if fair and due and rules.fair_share:
        queue = job.queue_name
        if window_full is None:
            window_full = store.queue_window_full(conn, queue, now, rules.window, self_due)
        if window_full:
            _recheck_after_commit(tx, QUEUE, queue)
            return Verdict(QUEUE, queue)
    return Verdict(delay_ms=max(0, delay_ms))


def admit(
    tx: Tx,
    job: HeldJob,
    *,
    now: int,
    delay_ms: int,
    broker: Any = None,
    rules: Policy | None = None,
    fair: bool = True,
    waiting: tuple[str, str] | None = None,
    ahead: bool = False,
) -> bool:
    """Give queued *job*, which has no message (requeued, recovered, a workflow step whose dependencies
    succeeded, a waiting job whose turn may have come), its message now, or make it wait. True when its
    message was written. *waiting*: what the job waits on now (None: it does not wait). *ahead*: see
    :func:`publish`."""
    rules = rules or policy(tx.conn)
    decided = verdict(tx, job, now=now, delay_ms=delay_ms, rules=rules, fair=fair, counted=waiting is None)
    if decided.held is None:
        if waiting is not None and not store.unhold(tx.conn, job.id, now):
            return False  # no longer waiting: cancelled, or admitted by another transaction
        publish(tx, job, decided.delay_ms, now, broker, ahead=ahead)
        return True
    if (decided.held, decided.on) != waiting:
        assert decided.on is not None
        store.hold(tx.conn, job.id, decided.held, decided.on, now)
    return False


def claim_refusal(tx: Tx, job_id: str, keys: Sequence[str | None], *, now: int) -> Verdict | None:
    """Whether a claim of the job with ``(concurrency key, rate key)`` *keys* must wait instead (None: it may
    run). Takes the keys' locks, which the claim keeps until it commits."""
    key, rate_key = keys
    conn = tx.conn
    if key is not None and concurrency_room(tx, key) == 0:
        return Verdict(CONCURRENCY, key)
    if rate_key is not None:
        store.lock_key(conn, rate_key)
        rate = policy(conn).rate(rate_key)
        if rate is not None and len(store.rate_starts_since(conn, rate_key, now - rate[1])) >= rate[0]:
            return Verdict(RATE, rate_key)
    return None


def concurrency_room(tx: Tx, key: str) -> int | None:
    """How many more jobs of concurrency *key* may start now (None: the key has no limit). Takes the key's
    lock, which the claims that use the room keep until they commit."""
    store.lock_key(tx.conn, key)
    limit = policy(tx.conn).concurrency_limit(key)
    return None if limit is None else max(0, limit - store.key_running(tx.conn, key))


def claim_refused(tx: Tx, job_id: str, refusal: Verdict, *, now: int) -> None:
    """A claimed message whose job must wait (:func:`claim_refusal`): the job waits for its key."""
    assert refusal.held is not None and refusal.on is not None
    if store.hold(tx.conn, job_id, refusal.held, refusal.on, now) and refusal.held == RATE:
        _wake_rate(tx, refusal.on, now, policy(tx.conn))


def started(tx: Tx, rate_key: str | None, *, now: int) -> None:
    """A claimed job started: count a rate-limited start."""
    if rate_key is not None:
        store.rate_start_insert(tx.conn, rate_key, now)


def after_claims(tx: Tx, queues: Iterable[str], rate_keys: Iterable[str], *, now: int) -> None:
    """Claims took admitted jobs out of *queues*' windows (and started jobs of *rate_keys*): admit waiting ones."""
    rules: Policy | None = None
    for queue in set(queues):
        rules = rules or policy(tx.conn)
        # In chunks of an eighth of the window: one refill's queries serve several claims.
        _refill(tx, queue, now, rules, least=rules.window // REFILL_PARTS)
    for rate_key in set(rate_keys):
        rules = rules or policy(tx.conn)
        _wake_rate(tx, rate_key, now, rules)


def released(tx: Tx, *, queue: str | None, concurrency_key: str | None, rate_key: str | None, now: int) -> None:
    """Capacity came back: a running job of *concurrency_key* stopped running, or an admitted job (of
    *queue*, and its keys) was cancelled or failed before starting. Admit what waits on it."""
    if queue is None and concurrency_key is None and rate_key is None:
        return
    rules = policy(tx.conn)
    if concurrency_key is not None:
        _release_key(tx, concurrency_key, now, rules)
    if rate_key is not None:
        _wake_rate(tx, rate_key, now, rules)
    if queue is not None:
        _refill(tx, queue, now, rules)


def sweep(tx: Tx, *, now: int) -> int:
    """Admit whatever waits although it could go (a crash between a release and its admissions, a limit
    raised, fair share switched off): every waiting group is released once. Returns the groups visited."""
    rules = policy(tx.conn)
    groups = store.held_counts(tx.conn)
    for held, on, _count in groups:
        if held == CONCURRENCY:
            _release_key(tx, on, now, rules)
        elif held == RATE:
            _wake_rate(tx, on, now, rules)
        elif held == QUEUE:
            _refill(tx, on, now, rules)
        # STEPS: a workflow admits a step when its last dependency succeeds (jobs.transitions).
    return len(groups)


def admit_waiting(engine: Engine, broker: Any = None) -> int:
    """:func:`sweep` in a transaction of its own (the resync's step)."""
    with db.write(engine) as tx:
        tx.broker = broker
        return sweep(tx, now=now_ms())


def waiting_detail(conn: Any, held: str, on: str, *, now: int, rules: Policy | None = None) -> dict[str, Any]:
    """What a waiting job waits for, for people: the limit's name and key, what is in use and the limit."""
    rules = rules or policy(conn)
    if held == CONCURRENCY:
        running = store.key_running(conn, on)
        return {
            "reason": CONCURRENCY,
            "limit_name": limit_name(on),
            "key": key_value(on),
            "key_is_owner": owner_keyed(limit_name(on)),
            "running": running,
            "limit": rules.concurrency_limit(on),
        }
    if held == RATE:
        rate = rules.rate(on)
        recent = store.rate_starts_since(conn, on, now - rate[1]) if rate else []
        return {
            "reason": RATE,
            "limit_name": limit_name(on),
            "key": key_value(on),
            "key_is_owner": owner_keyed(limit_name(on)),
            "started": len(recent),
            "starts": rate[0] if rate else None,
            "period_s": rate[1] / 1000 if rate else None,
        }
    if held == STEPS:
        return {"reason": STEPS, "workflow": on}
    return {"reason": "fair_share", "queue": on, "window": rules.window}


@dataclass(frozen=True, slots=True)
class LimitUsage:
    """One declared limit across its keys: what runs (or started in the period) under it, what waits."""

    name: str
    #: ``concurrency`` or ``rate``.
    type: str
    #: The limit per key (a concurrency limit, or a rate's starts per ``period_s``).
    limit: int
    period_s: float | None
    #: Running jobs (concurrency) or starts in the last period (rate), over all keys.
    in_use: int
    waiting: int
    #: Keys at their limit now.
    keys_at_limit: int


@dataclass(frozen=True, slots=True)
class AdmissionUsage:
    """What waits for admission, per queue and reason, and every declared limit's use."""

    #: ``(queue, reason, jobs)``; reasons: ``fair_share``, ``concurrency``, ``rate``, ``steps``.
    waiting: tuple[tuple[str, str, int], ...]
    limits: tuple[LimitUsage, ...]
    fair_share: bool
    window: int


def usage(conn: Any, *, now: int) -> AdmissionUsage:
    """:class:`AdmissionUsage` now (for the Queues page, the API and the metrics: bounded by what runs
    and waits, never by the job table)."""
    rules = policy(conn)
    waiting_keys: dict[str, int] = {}
    for held, on, count in store.held_counts(conn):
        if held in (CONCURRENCY, RATE):
            waiting_keys[f"{held}:{on}"] = count
    found: list[LimitUsage] = []
    running = store.running_by_key(conn)
    for name, limit in sorted(rules.concurrency.items()):
        keys = {k: n for k, n in running.items() if limit_name(k) == name}
        waits = sum(
            n for k, n in waiting_keys.items() if k.startswith(f"{CONCURRENCY}:") and limit_name(k[12:]) == name
        )
        found.append(
            LimitUsage(
                name, CONCURRENCY, limit, None, sum(keys.values()), waits, sum(n >= limit for n in keys.values())
            )
        )
    longest = max((period for _, period in rules.rates.values()), default=0)
    starts = store.rate_starts_by_key(conn, now - longest) if longest else []
    for name, (allowed, period_ms) in sorted(rules.rates.items()):
        per_key: dict[str, int] = {}
        for key, at in starts:
            if limit_name(key) == name and at > now - period_ms:
                per_key[key] = per_key.get(key, 0) + 1
        waits = sum(n for k, n in waiting_keys.items() if k.startswith(f"{RATE}:") and limit_name(k[5:]) == name)
        found.append(
            LimitUsage(
                name, RATE, allowed, period_ms / 1000, sum(per_key.values()), waits,
                sum(n >= allowed for n in per_key.values()),
            )
        )  # fmt: skip
    waiting = tuple(
        (queue, "fair_share" if held == QUEUE else held, count)
        for queue, held, count in sorted(store.waiting_by_queue(conn))
    )
    return AdmissionUsage(waiting, tuple(found), rules.fair_share, rules.window)


def describe(detail: dict[str, Any]) -> str:
    """A waiting job's line: ``waiting: concurrency key render_clip.owner=bob, 2/2 running``."""
    if detail["reason"] == CONCURRENCY:
        return (
            f"waiting: concurrency key {detail['limit_name']}={detail['key']}, "
            f"{detail['running']}/{detail['limit'] if detail['limit'] is not None else '—'} running"
        )
    if detail["reason"] == RATE:
        return (
            f"waiting: rate key {detail['limit_name']}={detail['key']}, {detail['started']}/{detail['starts']} "
            f"started in {detail['period_s']:g} s"
        )
    if detail["reason"] == STEPS:
        return "waiting for the workflow steps it depends on"
    return f"waiting for its turn in queue {detail['queue']} (fair share)"


# -- internals -------------------------------------------------------------------------------------------
def publish(tx: Tx, job: HeldJob, delay_ms: int, now: int, broker: Any = None, *, ahead: bool = False) -> None:
    """Write the message of admitted *job* (its verdict said go); *ahead*: before the queue's other ready
    jobs of its priority (its owner is behind its fair share)."""
    publish_in_transaction(
        tx.conn,  # type: ignore[arg-type]
        broker or tx.broker or resolve_broker(None),
        [Publication.of(job, delay_ms=delay_ms, ahead=ahead)],
        now=now,
    )


def _refill(tx: Tx, queue: str, now: int, rules: Policy, *, least: int = 1) -> None:
    """Admit waiting jobs of *queue* into the free places of its window, if at least *least* are free."""
    conn = tx.conn
    room = store.queue_window_room(conn, queue, now, rules.window)
    if room is None:
        return  # nobody waits for this window
    free = room if rules.fair_share else UNBOUNDED_BATCH
    if free < max(1, least):
        return
    picked = _pick(tx, QUEUE, queue, free, rules, store.queue_inflight)
    # A job without limits goes as soon as the window has room for it, and one with a concurrency key
    # (and no rate key) if its key has room: those are admitted in one statement, each key counted once.
    unlimited = [job for job, _ in picked if job.rate_key is None]
    keyed, waits = _by_keys_room(conn, [job for job in unlimited if job.concurrency_key is not None], now, rules)
    plain = [job.id for job in unlimited if job.concurrency_key is None]
    unheld = store.unhold_many(conn, QUEUE, queue, plain + keyed, now)
    for key in sorted(set(waits.values())):
        _recheck_after_commit(tx, CONCURRENCY, key)
    # In the order picked (the broker delivers them first in, first out), in one statement, then the
    # rate-keyed ones; a job whose owner is behind its share goes before the window's other jobs: a newcomer
    # does not wait behind a flood's window.
    going = [
        Publication.of(job, delay_ms=job.run_after - now, ahead=ahead) for job, ahead in picked if job.id in unheld
    ]
    if going:
        publish_in_transaction(conn, tx.broker or resolve_broker(None), going, now=now)
    for job, ahead in picked:
        if job.id in waits:
            store.hold(conn, job.id, CONCURRENCY, waits[job.id], now)
        elif job.rate_key is not None:  # never among the unheld
            admit(
                tx,
                job,
                now=now,
                delay_ms=job.run_after - now,
                rules=rules,
                fair=False,
                waiting=(QUEUE, queue),
                ahead=ahead,
            )


def _by_keys_room(conn: Any, jobs: list[HeldJob], now: int, rules: Policy) -> tuple[list[str], dict[str, str]]:
    """Of *jobs* (each with a concurrency key), in order: the ids of those their key has room for, and the
    others with the key they wait for. What :func:`verdict` decides one job at a time, each key counted
    once: a delayed job goes without counting (its message waits in the broker), a due one takes a place."""
    going: list[str] = []
    waits: dict[str, str] = {}
    for key in sorted({job.concurrency_key for job in jobs if job.concurrency_key is not None}):
        limit = rules.concurrency_limit(key)
        room = None if limit is None else limit - sum(store.key_active(conn, key, now))
        for job in jobs:
            if job.concurrency_key != key:
                continue
            if room is None or job.run_after > now:
                going.append(job.id)
            elif room > 0:
                room -= 1
                going.append(job.id)
            else:
                waits[job.id] = key
    return going, waits


def _release_key(tx: Tx, key: str, now: int, rules: Policy) -> None:
    conn = tx.conn
    store.lock_key(conn, key)  # against a claim refused meanwhile (it holds the lock until it commits)
    if not store.held_exists(conn, CONCURRENCY, key):
        return
    limit = rules.concurrency_limit(key)
    if limit is None:
        free = UNBOUNDED_BATCH
    else:
        running, admitted = store.key_active(conn, key, now)
        free = limit - running - admitted
    if free <= 0:
        return
    for job, _ in _pick(tx, CONCURRENCY, key, free, rules, store.key_inflight):
        admit(tx, job, now=now, delay_ms=job.run_after - now, rules=rules, waiting=(CONCURRENCY, key))


def _wake_rate(tx: Tx, rate_key: str, now: int, rules: Policy) -> None:
    conn = tx.conn
    store.lock_key(conn, rate_key)
    if not store.held_exists(conn, RATE, rate_key):
        return
    rate = rules.rate(rate_key)
    if rate is None:
        wanted = UNBOUNDED_BATCH
    else:
        starts, period_ms = rate
        admitted = store.rate_admitted(conn, rate_key)
        free = starts - len(store.rate_starts_since(conn, rate_key, now - period_ms)) - admitted
        # With no start free and none admitted, one waiting job is admitted delayed, to wake the others.
        wanted = free if free > 0 else (1 if admitted == 0 else 0)
    if wanted <= 0:
        return
    for job, _ in _pick(tx, RATE, rate_key, wanted, rules, store.rate_key_admitted_by_owner):
        admit(tx, job, now=now, delay_ms=job.run_after - now, rules=rules, waiting=(RATE, rate_key))


_rechecks_lock = threading.Lock()
#: Per PostgreSQL engine, the ``(held, key)`` groups that transactions made jobs wait on without the key's
#: lock, to release once they have committed (:func:`_recheck_after_commit`).
_rechecks: dict[Any, set[tuple[str, str]]] = {}


def _recheck_after_commit(tx: Tx, held: str, key: str) -> None:
    """A job waits on *key* (a concurrency or rate key, or a queue's window), decided without the key's
    lock (a submit, a recovery): on PostgreSQL a transaction releasing the key at the same time — or,
    for a window, the last claims of the jobs in it — may not have seen it. Once this transaction has
    committed, the key is released once more (under its lock; a window is refilled), so the job is not
    left waiting for a release that already happened. (SQLite's single writer never interleaves them.)"""
    conn = tx.conn
    if isinstance(conn, sqlite3.Connection) or conn.dialect.name != "postgresql":
        return
    engine, broker = conn.engine, tx.broker
    with _rechecks_lock:
        _rechecks.setdefault(engine, set()).add((held, key))
    tx.after_commit(partial(_recheck, engine, broker))


def _recheck(engine: Engine, broker: Any) -> None:
    with _rechecks_lock:
        groups = _rechecks.pop(engine, set())
    for held, key in groups:  # one transaction per key: never two keys' locks at once
        if held == QUEUE and not _window_has_room(engine, key):
            continue
        with db.write(engine) as tx:
            tx.broker = broker
            if held == CONCURRENCY:
                _release_key(tx, key, now_ms(), policy(tx.conn))
            elif held == RATE:
                _wake_rate(tx, key, now_ms(), policy(tx.conn))
            else:
                _refill(tx, key, now_ms(), policy(tx.conn))


def _window_has_room(engine: Engine, queue: str) -> bool:
    """Whether a refill of *queue*'s window would admit a job now: one read outside any transaction,
    as a flooded queue's window is full at nearly every recheck (a write transaction would cost two more
    round trips to learn it). When it finds room, the refill reads the room again in its own transaction."""
    with db.autocommit(engine) as conn:
        rules = policy(conn)
        room = store.queue_window_room(conn, queue, now_ms(), rules.window)
    return room is not None and (room > 0 or not rules.fair_share)  # as :func:`_refill` decides


def _pick(
    tx: Tx,
    held: str,
    on: str,
    n: int,
    rules: Policy,
    inflight: Callable[[Any, str, Sequence[str]], dict[str, int]],
) -> list[tuple[HeldJob, bool]]:
    """Up to *n* jobs waiting on *on*, in rotation across their owners: each next one is the top job of
    the owner with the fewest jobs in flight there per unit of weight (ties: by owner), and whether that
    owner had fewer than another waiting owner (it is behind its share)."""
    conn = tx.conn
    owners = store.held_owners(conn, held, on, MAX_OWNERS)
    if not owners:
        return []
    if len(owners) == 1:
        return [(job, False) for job in store.held_next(conn, held, on, owners[0], n)]
    counts = inflight(conn, on, owners)
    pages: dict[str, list[HeldJob]] = {}
    last: dict[str, HeldJob] = {}
    live = list(owners)
    picked: list[tuple[HeldJob, bool]] = []
    while len(picked) < n and live:
        share = {o: counts.get(o, 0) / rules.weight(o) for o in live}
        owner = min(live, key=lambda o: (share[o], o))
        page = pages.get(owner)
        if not page:
            page = pages[owner] = store.held_next(conn, held, on, owner, min(PAGE, n - len(picked)), last.get(owner))
            if not page:
                live.remove(owner)
                continue
        last[owner] = job = page.pop(0)
        picked.append((job, share[owner] < max(share.values())))
        counts[owner] = counts.get(owner, 0) + 1
    return picked
