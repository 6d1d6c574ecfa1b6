"""Shared set-up for job-layer tests: a migrated database, a broker, a private kind registry.

``sqlite``: one SQLite file holds jobs and messages (transactional enqueue).
``postgres``: jobs on a fresh PostgreSQL database, messages on Redis via the outbox + relay.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sqlite3
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.broker import Broker
from sqlalchemy import Engine, create_engine, text

import jobs
from broker import SQLiteBroker
from jobs import schema
from jobs.context import JobContext
from jobs.db import make_engine
from jobs.execution.binding import JobMiddleware
from jobs.lifecycle import observers
from jobs.registry import Registry
from jobs.store import JobRow, job_get
from settings.environment import Settings

PG_ADMIN_URL = os.environ.get("TENURE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("TENURE_TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
#: The backend whose jobs and messages share one PostgreSQL database (``broker.postgres.PostgresBroker``).
PGBROKER = "postgres+pgbroker"


def _database_url(name: str) -> str:
    return PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"


@functools.cache
def _postgres_template() -> str:
    """A PostgreSQL database at the head revision, made once per test process and dropped when it exits."""
    name = f"tenure_test_template_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    schema.upgrade(_database_url(name))  # (disposes its engine: a template must have no session open)

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    atexit.register(drop)
    return name


@functools.cache
def _sqlite_template() -> Path:
    """A SQLite file at the head revision, made once per test process and deleted when it exits."""
    path = Path(tempfile.mkdtemp(prefix="tenure-template-")) / "tenure.db"
    schema.upgrade(f"sqlite:///{path}")
    with closing(sqlite3.connect(path)) as raw:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the one file a copy takes
    atexit.register(shutil.rmtree, path.parent, ignore_errors=True)
    return path


def copy_of_template(path: Path) -> Path:
    """*path*, a new SQLite file at the head revision: a copy of this process's migrated template."""
    shutil.copyfile(_sqlite_template(), path)
    return path


@contextmanager
def postgres_database(*, migrated: bool = False) -> Iterator[str]:
    """A fresh PostgreSQL database for one test, dropped afterwards; yields its URL. *migrated*: at the head
    revision already, a copy of :func:`_postgres_template` (~60 ms, where migrating takes ~300 ms)."""
    name = f"tenure_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    template = f' TEMPLATE "{_postgres_template()}"' if migrated else ""
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"{template}'))
    try:
        yield _database_url(name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@dataclass
class JobEnv:
    backend: str
    url: str
    broker_url: str
    engine: Engine
    settings: Settings
    broker: Broker
    registry: Registry
    mw: JobMiddleware
    tmp_path: Path
    extra_middleware: list[JobMiddleware] = field(default_factory=list)

    def submit(self, kind: str, *, owner_id: str = "u1", **kwargs: Any) -> jobs.JobRecord:
        return jobs.submit(
            self.engine, owner_id=owner_id, kind=kind, registry=self.registry, settings=self.settings, **kwargs
        )

    def worker(self) -> JobMiddleware:
        """Another worker identity (as if in another process) on the same database."""
        mw = JobMiddleware(self.settings, engine=self.engine, registry=self.registry, check_schema=False)
        mw.worker.broker = self.broker
        self.extra_middleware.append(mw)
        return mw

    def claim(self, job_id: str, mw: JobMiddleware | None = None) -> JobContext | None:
        return (mw or self.mw).claimer.claim(self.broker, job_id)

    def row(self, job_id: str) -> JobRow:
        with self.engine.connect() as conn:
            row = job_get(conn, job_id)
            conn.rollback()
        assert row is not None
        return row

    def sql(self, statement: str, **params: Any) -> Any:
        with self.engine.begin() as conn:
            return (
                conn.execute(text(statement), params).fetchall()
                if statement.lstrip().upper().startswith("SELECT")
                else conn.execute(text(statement), params).rowcount
            )

    def age_lease(self, job_id: str) -> None:
        """Make the job's running lease expired, as if its worker stopped heartbeating long ago."""
        assert self.sql("UPDATE jobs SET lease_expires_at = 1 WHERE id = :id AND status = 'running'", id=job_id) == 1

    def declare(self, name: str, fn: Any, **policy: Any) -> Any:
        return self.registry.kind(name, broker=self.broker, **policy)(fn)


@contextmanager
def observed() -> Iterator[list[dict[str, Any]]]:
    """The lifecycle events told while the block runs (what monitoring counts), as their fields."""
    seen: list[dict[str, Any]] = []
    observers.append(seen.append)
    try:
        yield seen
    finally:
        observers.remove(seen.append)


@contextmanager
def job_env(backend: str, tmp_path: Path, **settings_overrides: Any) -> Iterator[JobEnv]:
    with migrated_database(backend, tmp_path) as (url, broker_url):
        settings = Settings(
            database_url=url,
            broker_url=broker_url,
            job_lease_ttl_s=settings_overrides.pop("job_lease_ttl_s", 30.0),
            output_root=str(tmp_path / "outputs"),
            **settings_overrides,
        )
        if backend == "sqlite":
            broker: Broker = SQLiteBroker(url, middleware=[])
        else:
            from dramatiq.brokers.redis import RedisBroker

            broker = RedisBroker(url=broker_url, namespace=f"tenure-test-{uuid.uuid4().hex[:8]}", middleware=[])
        previous = dramatiq.get_broker() if _has_global_broker() else None
        dramatiq.set_broker(broker)
        engine = make_engine(url)
        registry = Registry()
        mw = JobMiddleware(settings, engine=engine, registry=registry, check_schema=False)
        mw.worker.broker = broker
        env = JobEnv(backend, url, broker_url, engine, settings, broker, registry, mw, tmp_path)
        try:
            yield env
        finally:
            if backend != "sqlite":
                broker.flush_all()
            broker.close()
            engine.dispose()
            if previous is not None:
                dramatiq.set_broker(previous)


def _has_global_broker() -> bool:
    return dramatiq.broker.global_broker is not None


@contextmanager
def migrated_database(backend: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A fresh database at the head revision (a copy of this process's migrated template), and its broker URL."""
    if backend == "sqlite":
        url = f"sqlite:///{copy_of_template(tmp_path / 'tenure.db')}"
        yield url, url
    elif backend == PGBROKER:
        with postgres_database(migrated=True) as url:
            yield url, url
    else:
        with postgres_database(migrated=True) as url:
            yield url, REDIS_URL
