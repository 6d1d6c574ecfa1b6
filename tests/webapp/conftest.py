"""Fixtures for the web layer: the real app and job layer on a migrated SQLite file per test, three users."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine

import accounts
from broker import SQLiteBroker
from jobs.db import make_engine
from jobs.registry import Registry
from settings.environment import Settings
from tests.integration.jobs.support import copy_of_template

from .jobdriver import JobDriver, declare_kinds


@pytest.fixture(autouse=True)
def _cheap_scrypt(monkeypatch: pytest.MonkeyPatch) -> None:
    # Hashes are self-describing, so a lower cost only makes the tests' hashing cheaper.
    monkeypatch.setattr(accounts, "SCRYPT_N", 2**10)


@dataclass
class Person:
    user: accounts.User
    password: str
    token: str

    @property
    def bearer(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def basic(self) -> dict[str, str]:
        raw = base64.b64encode(f"{self.user.username}:{self.password}".encode()).decode()
        return {"Authorization": f"Basic {raw}"}


@pytest.fixture()
def database_path(tmp_path: Path) -> Path:
    """This test's own copy of the migrated database (flaskr's conftest, one step on)."""
    return copy_of_template(tmp_path / "tenure.db")


@pytest.fixture()
def web_engine(database_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{database_path}")
    yield engine
    engine.dispose()


@pytest.fixture()
def web_broker(database_path: Path) -> Iterator[SQLiteBroker]:
    """The SQLite broker on the test's database file (jobs and their messages commit together)."""
    broker = SQLiteBroker(f"sqlite:///{database_path}", middleware=[])
    for queue in ("default", "slow"):
        broker.declare_queue(queue)
    yield broker
    broker.close()


@pytest.fixture()
def web_settings(tmp_path: Path, database_path: Path) -> Settings:
    url = f"sqlite:///{database_path}"
    return Settings(database_url=url, broker_url=url, output_root=str(tmp_path / "outputs"))


@pytest.fixture()
def kinds(web_broker: SQLiteBroker) -> Registry:
    """The web tests' job kinds (echo, sleep), declared on the test's broker."""
    registry = Registry()
    declare_kinds(registry, web_broker)
    return registry


@pytest.fixture()
def driver(web_engine: Engine, web_broker: SQLiteBroker, kinds: Registry, web_settings: Settings) -> JobDriver:
    return JobDriver(web_engine, web_broker, kinds, web_settings, Path(web_settings.output_root))


@pytest.fixture()
def app_config(web_engine: Engine, web_broker: SQLiteBroker, kinds: Registry, web_settings: Settings) -> dict:  # type: ignore[type-arg]
    return {
        "TESTING": True,
        "SECRET_KEY": "test-secret",
        "TENURE_ENGINE": web_engine,
        "TENURE_BROKER": web_broker,
        "TENURE_REGISTRY": kinds,
        "TENURE_SETTINGS": web_settings,
        "TASKS_APP": "",
        "LIVE_POLL_S": 0.05,
        "PASSWORD_SCRYPT_N": 2**10,  # as _cheap_scrypt: the app sets its cost when it is built
    }


@pytest.fixture()
def app(app_config: dict) -> Flask:
    from webapp import create_app

    return create_app(app_config)


@pytest.fixture()
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def _person(engine: Engine, name: str, role: str) -> Person:
    user, password = accounts.create_user(engine, name, role=role)
    _, token = accounts.create_token(engine, user.id, "tests")
    return Person(user, password, token)


@pytest.fixture()
def alice(web_engine: Engine) -> Person:
    return _person(web_engine, "alice", "user")


@pytest.fixture()
def bob(web_engine: Engine) -> Person:
    return _person(web_engine, "bob", "user")


@pytest.fixture()
def root(web_engine: Engine) -> Person:
    return _person(web_engine, "root", "admin")


def csrf_token(client: FlaskClient, path: str = "/login") -> str:
    """The session's CSRF token, read from a page's ``<meta name="csrf-token">``."""
    import re

    page = client.get(path).get_data(as_text=True)
    match = re.search(r'name="csrf-token" content="([^"]+)"', page)
    assert match, "no csrf meta tag"
    return match.group(1)


def without_csrf_token(page: bytes) -> bytes:
    """*page* with its CSRF token replaced by a placeholder.

    The token is signed with the current second (itsdangerous' timed serializer), so two requests
    straddling a second boundary carry different tokens whatever they asked for; everything else on
    the page must still match byte for byte.
    """
    import re

    match = re.search(rb'name="csrf-token" content="([^"]+)"', page)
    return page if match is None else page.replace(match.group(1), b"CSRF-TOKEN")


def login(client: FlaskClient, person: Person) -> str:
    """Log *person* in through the form; returns the new session's CSRF token."""
    token = csrf_token(client)
    r = client.post("/login", data={"username": person.user.username, "password": person.password, "csrf_token": token})
    assert r.status_code == 302, r.get_data(as_text=True)[:300]
    return csrf_token(client, "/tokens")


def newest_first(driver: JobDriver, ids: list[str]) -> list[str]:
    """*ids* in the order job lists show them: newest first (by ``created_at``, then id)."""
    records = [driver.job(i) for i in ids]
    return [r.id for r in sorted(records, key=lambda r: (r.created_at, r.id), reverse=True)]


#: The scoped token of the permission tests: an operator's token carrying some of the operator's actions.
SCOPED_TOKEN = frozenset({"jobs.read_own", "jobs.cancel", "metrics.read", "queues.pause"})


@pytest.fixture()
def world(app: Flask, driver: JobDriver, web_broker: SQLiteBroker, database_path: Path):  # type: ignore[no-untyped-def]
    """A person of every built-in role, an operator's scoped token, and the schedule (tests/webapp/world.py)."""
    from .world import World, declare_schedule

    declare_schedule(web_broker, driver.engine)
    w = World(app, driver, web_broker, database_path)
    for role in ("viewer", "user", "operator", "admin"):
        w.callers[role] = w.person(role)
    w.callers["scoped"] = w.person("operator", token_actions=SCOPED_TOKEN)
    return w
