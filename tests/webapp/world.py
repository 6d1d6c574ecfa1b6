"""What the permission probe and the audit tests act on: people of every built-in role, and fresh objects
of each kind an action needs (jobs in a given state, dead letters, a schedule, tokens, users, roles).

Everything is made through the real layers on the test's own database file; only a dead letter and an
unclean worker exit are written with SQL (the states a crashed or failing worker leaves behind, which no
test should wait a lease for).
"""

from __future__ import annotations

import itertools
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dramatiq
from flask import Flask
from flask.testing import FlaskClient

import accounts
import jobs
from broker import SQLiteBroker

from .conftest import Person
from .jobdriver import JobDriver

#: The one schedule of the web tests (a plain periodic actor on the test's broker).
SCHEDULE = "probe_tick"
_names = itertools.count(1)


def unique(prefix: str) -> str:
    return f"{prefix}{next(_names)}"


@dataclass
class Caller(Person):
    """Someone calling the app: a user of a role with a password and a token (maybe a scoped one)."""

    permissions: frozenset[str] = frozenset()
    #: A logged-in test client (UI pages), made on first use.
    session: FlaskClient | None = None
    csrf: str = ""

    @property
    def name(self) -> str:
        return self.user.username

    def may(self, *actions: str) -> bool:
        return all(a in ("public", "authenticated") or a in self.permissions for a in actions)


@dataclass
class World:
    app: Flask
    driver: JobDriver
    broker: SQLiteBroker
    database: Path
    callers: dict[str, Caller] = field(default_factory=dict)

    @property
    def engine(self) -> Any:
        return self.driver.engine

    # -- people -----------------------------------------------------------------------------------------
    def person(self, role: str, *, token_actions: frozenset[str] | None = None, name: str | None = None) -> Caller:
        user, password = accounts.create_user(self.engine, name or unique(role), role=role)
        token, secret = accounts.create_token(self.engine, user.id, "probe", token_actions)
        allowed = token.permissions & user.permissions
        return Caller(user, password, secret, allowed if token_actions is not None else user.permissions)

    def login(self, caller: Caller) -> FlaskClient:
        """*caller*'s logged-in browser session (the same one on every call)."""
        if caller.session is None:
            client = self.app.test_client()
            page = client.get("/login").get_data(as_text=True)
            token = re.search(r'name="csrf-token" content="([^"]+)"', page).group(1)  # type: ignore[union-attr]
            r = client.post(
                "/login", data={"username": caller.user.username, "password": caller.password, "csrf_token": token}
            )
            assert r.status_code == 302, r.get_data(as_text=True)[:300]
            assert client.get("/api/v1/me").get_json()["name"] == caller.user.username
            page = client.get("/login").get_data(as_text=True)  # the new session's CSRF token
            caller.csrf = re.search(r'name="csrf-token" content="([^"]+)"', page).group(1)  # type: ignore[union-attr]
            caller.session = client
        return caller.session

    # -- jobs -------------------------------------------------------------------------------------------
    def job(self, owner: Caller, state: str = "queued", **kwargs: Any) -> str:
        """A job of *owner*'s in *state*: queued, delayed (queued with a wait), running, failed, succeeded."""
        if state == "delayed":
            return jobs.submit(
                self.engine,
                owner_id=owner.user.owner_id,
                kind="echo",
                payload={"text": "later"},
                delay=3600,
                registry=self.driver.registry,
                settings=self.driver.settings,
            ).id
        job_id = self.driver.submit(owner.user.owner_id, **kwargs).id
        if state == "running":
            self.driver.start(job_id)
        elif state == "failed":
            self.driver.fail(job_id)
        elif state == "succeeded":
            self.driver.succeed(job_id, {"ok": True})
            self.driver.submit(owner.user.owner_id)  # the newest live-feed entry is another job's: it may go
        return job_id

    # -- broker -----------------------------------------------------------------------------------------
    def _sql(self, statement: str, params: tuple[Any, ...]) -> int:
        with sqlite3.connect(self.database) as conn:
            cursor = conn.execute(statement, params)
            return int(cursor.lastrowid or 0)

    def dead_letter(self, queue: str = "default") -> int:
        """A message of *queue* that died (as a worker's nack leaves it)."""
        message = dramatiq.Message(queue_name=queue, actor_name="echo", args=(), kwargs={}, options={})
        self.broker.enqueue(message)
        now = int(time.time() * 1000)
        with sqlite3.connect(self.database) as conn:
            (row_id,) = conn.execute(
                "SELECT id FROM broker_messages WHERE message_id = ?", (message.message_id,)
            ).fetchone()
            conn.execute(
                "UPDATE broker_messages SET state = 2, dead_at = ?, dead_reason = 'boom' WHERE id = ?", (now, row_id)
            )
        return int(row_id)

    def dead_count(self) -> int:
        with sqlite3.connect(self.database) as conn:
            return int(conn.execute("SELECT count(*) FROM broker_messages WHERE state = 2").fetchone()[0])

    def unclean_exit(self) -> str:
        """A worker process that ended without closing the broker (as the next process finds it)."""
        owner = unique("crashed-")
        now = int(time.time() * 1000)
        self._sql(
            "INSERT INTO broker_unclean_exits (owner, host, pid, started_at, last_heartbeat_at, detected_at) "
            "VALUES (?, 'h', 1, ?, ?, ?)",
            (owner, now - 60_000, now - 30_000, now),
        )
        return owner

    def unclean_count(self) -> int:
        with sqlite3.connect(self.database) as conn:
            return int(conn.execute("SELECT count(*) FROM broker_unclean_exits").fetchone()[0])

    def paused(self, queue: str = "default") -> bool:
        with sqlite3.connect(self.database) as conn:
            row = conn.execute("SELECT paused FROM broker_queues WHERE name = ?", (queue,)).fetchone()
        return bool(row and row[0])

    # -- schedules --------------------------------------------------------------------------------------
    def fires(self) -> int:
        with sqlite3.connect(self.database) as conn:
            return int(
                conn.execute("SELECT count(*) FROM schedule_fires WHERE schedule = ?", (SCHEDULE,)).fetchone()[0]
            )

    def schedule_paused(self) -> bool:
        with sqlite3.connect(self.database) as conn:
            row = conn.execute("SELECT paused FROM schedules WHERE name = ?", (SCHEDULE,)).fetchone()
        return bool(row and row[0])

    # -- audit ------------------------------------------------------------------------------------------
    def audit_rows(self, action: str | None = None) -> list[dict[str, Any]]:
        with sqlite3.connect(self.database) as conn:
            conn.row_factory = sqlite3.Row
            query = "SELECT * FROM audit_log" + (" WHERE action = ?" if action else "") + " ORDER BY id"
            return [dict(r) for r in conn.execute(query, (action,) if action else ())]


def declare_schedule(broker: SQLiteBroker, engine: Any) -> None:
    """One hourly schedule on the test's broker, its scheduler on the test's database."""
    from tasks.scheduling import configure, every, install

    install(broker)
    dramatiq.actor(lambda: None, actor_name=SCHEDULE, queue_name="default", broker=broker, periodic=every(seconds=3600))
    configure(broker, engine=engine)
