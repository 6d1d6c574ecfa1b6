"""Login sessions, re-checked credentials and live-feed connection slots, on SQLite and PostgreSQL.

Sessions and credentials are what an open live stream asks about every second (a logout, a password
change, a revoked token or a disabled user must say no); slots are the per-identity connection limit
that every web process shares through the job database.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

import accounts
from accounts import live_slots, sessions
from jobs import schema
from jobs.db import make_engine
from tests.integration.jobs.support import postgres_database


@pytest.fixture(autouse=True)
def _cheap_scrypt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accounts, "SCRYPT_N", 2**10)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.services)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'tenure.db'}"
        schema.upgrade(url)
        yield url
    else:
        with postgres_database(migrated=True) as url:
            yield url


@pytest.fixture()
def engine(url: str) -> Iterator[Engine]:
    engine = make_engine(url)
    yield engine
    engine.dispose()


def test_a_session_lives_until_logout_or_a_password_change(engine: Engine) -> None:
    user, _ = accounts.create_user(engine, "alice", "a long password 1")
    first = sessions.start_session(engine, user.id)
    second = sessions.start_session(engine, user.id)
    assert sessions.session_user(engine, first) == user == sessions.session_user(engine, second)
    with engine.connect() as conn:
        stored = {r[0] for r in conn.execute(text("SELECT id FROM login_sessions"))}
    assert first not in stored and second not in stored and len(stored) == 2  # only digests are stored
    sessions.end_session(engine, first)  # a logout ends that session, not the other one
    assert sessions.session_user(engine, first) is None and sessions.session_user(engine, second) == user
    accounts.set_password(engine, user.id, "a long password 2")  # a password change ends every older one
    assert sessions.session_user(engine, second) is None
    third = sessions.start_session(engine, user.id)
    assert sessions.session_user(engine, third) == user
    for garbage in (None, "", "x" * 500, 42):
        assert sessions.session_user(engine, garbage) is None  # type: ignore[arg-type]
        sessions.end_session(engine, garbage)  # type: ignore[arg-type]


def test_a_session_ends_with_its_lifetime_and_a_disabled_user(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    user, _ = accounts.create_user(engine, "bob", "a long password 1")
    old = sessions.start_session(engine, user.id)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE login_sessions SET created_at = created_at - :d"), {"d": sessions.SESSION_LIFETIME_MS}
        )
    assert sessions.session_user(engine, old) is None
    fresh = sessions.start_session(engine, user.id)
    with engine.connect() as conn:  # the login deleted the expired one
        assert conn.execute(text("SELECT count(*) FROM login_sessions")).scalar_one() == 1
    with engine.begin() as conn:
        conn.execute(text("UPDATE users SET disabled = :t"), {"t": True})
    assert sessions.session_user(engine, fresh) is None
    with engine.begin() as conn:
        conn.execute(text("UPDATE users SET disabled = :f"), {"f": False})
    monkeypatch.setattr(sessions, "MAX_SESSIONS_PER_USER", 3)
    clock = iter(range(sessions._now_ms() + 1, sessions._now_ms() + 1000))
    monkeypatch.setattr(sessions, "_now_ms", lambda: next(clock))  # one login per millisecond: a clear order
    many = [sessions.start_session(engine, user.id) for _ in range(5)]
    assert [sessions.session_user(engine, s) is not None for s in [fresh, *many]] == [False] * 3 + [True] * 3


def test_credentials_are_checked_again_without_their_secrets(engine: Engine) -> None:
    user, _ = accounts.create_user(engine, "carol", "a long password 1")
    other, _ = accounts.create_user(engine, "dave", "a long password 1")
    token, secret = accounts.create_token(engine, user.id, "cli")
    by_token = sessions.token_credential(user.id, secret)
    by_password = sessions.basic_credential(engine, user.id)
    by_session = sessions.session_credential(user.id, sessions.start_session(engine, user.id))
    assert by_password is not None and secret not in repr(by_token)

    def who(credential: sessions.Credential) -> accounts.User | None:
        found = sessions.credential_user(engine, credential)
        return None if found is None else found[0]

    for credential in (by_token, by_password, by_session):
        assert who(credential) == user
    # What it may do now: the role's actions (a token's: those of them it carries).
    assert sessions.credential_user(engine, by_token) == (user, token.permissions & user.permissions)
    assert sessions.credential_user(engine, by_session) == (user, user.permissions)
    # Someone else's credential never stands for this user.
    assert who(sessions.token_credential(other.id, secret)) is None
    accounts.revoke_token(engine, user.id, token.id)
    assert who(by_token) is None
    assert who(by_password) == user
    accounts.set_password(engine, user.id, "a long password 2")
    assert who(by_password) is None
    assert who(by_session) is None
    assert sessions.basic_credential(engine, 999_999) is None


def test_an_identity_holds_at_most_its_limit_of_slots_until_one_is_released(engine: Engine) -> None:
    slots = [live_slots.acquire(engine, "user:1", 2, holder="h:1") for _ in range(3)]
    assert slots[0] and slots[1] and slots[2] is None
    assert live_slots.acquire(engine, "user:2", 2, holder="h:1") is not None  # another identity
    assert live_slots.held(engine, "user:1") == 2
    live_slots.release(engine, slots[0])
    assert live_slots.acquire(engine, "user:1", 2, holder="h:2") is not None
    assert live_slots.renew(engine, slots[1]) and not live_slots.renew(engine, slots[0])


def test_a_slot_its_process_stopped_renewing_expires(engine: Engine) -> None:
    held = [live_slots.acquire(engine, "user:1", 2, holder="dead:1", ttl_ms=60_000) for _ in range(2)]
    assert live_slots.acquire(engine, "user:1", 2, holder="h:1") is None
    with engine.begin() as conn:  # the process died a minute ago: its rows were not renewed
        conn.execute(text("UPDATE live_slots SET expires_at = expires_at - 120000"))
    assert live_slots.held(engine, "user:1") == 0
    assert not live_slots.renew(engine, held[0])  # too late: the slot is no longer this connection's
    fresh = live_slots.acquire(engine, "user:1", 2, holder="h:1")
    assert fresh is not None
    with engine.connect() as conn:  # the expired rows were deleted by that acquire
        assert conn.execute(text("SELECT count(*) FROM live_slots")).scalar_one() == 1


def test_concurrent_processes_never_exceed_the_limit(url: str) -> None:
    """Eight 'processes' (one engine each) ask at once: exactly four get a slot."""
    engines = [make_engine(url) for _ in range(8)]
    start = threading.Barrier(len(engines))
    got: list[str | None] = []
    lock = threading.Lock()

    def take(engine: Engine) -> None:
        start.wait()
        slot = live_slots.acquire(engine, "user:7", 4, holder="h")
        with lock:
            got.append(slot)

    threads = [threading.Thread(target=take, args=(e,)) for e in engines]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(got) == 8 and len([s for s in got if s]) == 4
        assert live_slots.held(engines[0], "user:7") == 4
    finally:
        for e in engines:
            e.dispose()
