"""Fixtures for the web layer: an app on a temporary SQLite file, a fake job gateway, three users."""

from __future__ import annotations

import base64
import shutil
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine

import accounts
from jobs import schema
from jobs.db import make_engine

from .fake_jobs import FakeJobs


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


@pytest.fixture(scope="session")
def migrated_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database migrated to the head revision once per test session (flaskr's conftest, one step on)."""
    path = tmp_path_factory.mktemp("template") / "tenure.db"
    schema.upgrade(f"sqlite:///{path}")
    with sqlite3.connect(path) as raw:  # everything in the main file, so a plain copy is the whole database
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw.close()
    return path


@pytest.fixture()
def database_path(tmp_path: Path, migrated_template: Path) -> Path:
    """This test's own copy of the migrated database."""
    path = tmp_path / "tenure.db"
    shutil.copyfile(migrated_template, path)
    return path


@pytest.fixture()
def web_engine(database_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{database_path}")
    yield engine
    engine.dispose()


@pytest.fixture()
def web_broker(tmp_path: Path):  # type: ignore[no-untyped-def]
    from broker import SQLiteBroker

    broker = SQLiteBroker(f"sqlite:///{tmp_path / 'broker.db'}", middleware=[])
    broker.declare_queue("default")
    yield broker
    broker.close()


@pytest.fixture()
def fake_jobs() -> FakeJobs:
    return FakeJobs()


@pytest.fixture()
def app_config(tmp_path: Path, web_engine: Engine, web_broker, fake_jobs: FakeJobs) -> dict:  # type: ignore[no-untyped-def]
    return {
        "TESTING": True,
        "SECRET_KEY": "test-secret",
        "TENURE_ENGINE": web_engine,
        "TENURE_BROKER": web_broker,
        "TENURE_JOBS": fake_jobs,
        "TENURE_SETTINGS": SimpleNamespace(output_root=str(tmp_path / "outputs")),
        "TENURE_MIGRATIONS_DIR": None,
        "LIVE_POLL_S": 0.05,
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
