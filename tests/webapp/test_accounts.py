"""Accounts: users, password hashing, API tokens and the ``tenure users`` CLI."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from sqlalchemy import Engine

import accounts
import tenure_cli
from accounts.store import metadata
from jobs import schema
from jobs.db import make_engine


@pytest.fixture()
def engine(database_path: Path) -> Engine:
    """A migrated database: the built-in roles are rows its revisions wrote."""
    eng = make_engine(f"sqlite:///{database_path}")
    yield eng
    eng.dispose()


def test_create_and_authenticate(engine: Engine) -> None:
    user, password = accounts.create_user(engine, "alice", role="user")
    assert len(password) >= accounts.MIN_PASSWORD_LENGTH
    assert accounts.authenticate(engine, "alice", password) == user
    assert accounts.authenticate(engine, "alice", password + "x") is None
    assert accounts.authenticate(engine, "nobody", password) is None
    assert not user.is_admin and user.owner_id == str(user.id)


def test_refusals(engine: Engine) -> None:
    accounts.create_user(engine, "bob", "correct horse battery")
    with pytest.raises(accounts.UserExists):
        accounts.create_user(engine, "bob", "another long password")
    with pytest.raises(accounts.InvalidUsername):
        accounts.create_user(engine, "bad name", "another long password")
    with pytest.raises(accounts.WeakPassword):
        accounts.create_user(engine, "carol", "short")
    with pytest.raises(ValueError):
        accounts.create_user(engine, "dave", "another long password", role="root")


def test_password_hash_is_salted_scrypt(engine: Engine) -> None:
    first, second = accounts.hash_password("same password"), accounts.hash_password("same password")
    assert first != second and first.startswith("scrypt$")
    assert accounts.verify_password("same password", first)
    assert not accounts.verify_password("same password", "garbage")


def test_the_web_process_sets_the_scrypt_cost_of_new_hashes_within_bounds(
    app_config: dict,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[type-arg]
) -> None:
    from webapp import create_app

    monkeypatch.setattr(accounts, "SCRYPT_N", accounts.SCRYPT_N)  # restored after the test
    create_app({**app_config, "PASSWORD_SCRYPT_N": 2**12})
    new = accounts.hash_password("a long enough password")
    assert new.startswith("scrypt$4096$8$1$") and accounts.verify_password("a long enough password", new)
    for wrong in (1000, 2**9, 2**21):
        with pytest.raises(ValueError, match="power of two from 1024 to 1048576"):
            accounts.set_scrypt_cost(wrong)
        with pytest.raises(RuntimeError, match="TENURE_WEB_PASSWORD_SCRYPT_N"):
            create_app({**app_config, "PASSWORD_SCRYPT_N": wrong})
    assert accounts.SCRYPT_N == 2**12  # a refused cost changes nothing


def test_tokens_hashed_shown_once_revocable(engine: Engine) -> None:
    user, _ = accounts.create_user(engine, "erin")
    other, _ = accounts.create_user(engine, "frank")
    token, secret = accounts.create_token(engine, user.id, "ci")
    assert secret.startswith("tnr_") and token.prefix == secret[:10]
    with engine.connect() as conn:
        stored = conn.exec_driver_sql("SELECT token_hash FROM api_tokens").scalar_one()
    assert secret not in stored
    assert accounts.authenticate_token(engine, secret, touch=True) == user
    assert accounts.list_tokens(engine, user.id)[0].last_used_at is not None
    with pytest.raises(accounts.TokenNotFound):
        accounts.revoke_token(engine, other.id, token.id)  # not theirs
    accounts.revoke_token(engine, user.id, token.id)
    assert accounts.authenticate_token(engine, secret) is None
    with pytest.raises(accounts.TokenNotFound):
        accounts.revoke_token(engine, user.id, token.id)
    assert accounts.authenticate_token(engine, "not-a-token") is None


def test_ensure_admin_once(engine: Engine) -> None:
    created = accounts.ensure_admin(engine)
    assert created is not None
    user, password = created
    assert user.is_admin and accounts.authenticate(engine, "admin", password) == user
    assert accounts.ensure_admin(engine) is None


def test_cli_users(engine: Engine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TENURE_DATABASE_URL", str(engine.url))
    assert tenure_cli.main(["users", "create", "grace", "--admin"]) == 0
    out = capsys.readouterr().out
    password = out.split("password (shown once): ")[1].strip()
    assert accounts.authenticate(engine, "grace", password).is_admin
    assert tenure_cli.main(["users", "ensure-admin"]) == 0
    assert "an admin account exists" in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO("a typed long password\n"))
    assert tenure_cli.main(["users", "create", "heidi", "--password-stdin"]) == 0
    assert "a typed long password" not in capsys.readouterr().out
    assert accounts.authenticate(engine, "heidi", "a typed long password") is not None
    assert tenure_cli.main(["users", "create", "heidi", "--password-stdin"]) == 1


def test_cli_set_password(engine: Engine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Given an admin whose password was lost
    monkeypatch.setenv("TENURE_DATABASE_URL", str(engine.url))
    created = accounts.ensure_admin(engine)
    assert created is not None
    old = created[1]

    # When the operator sets a new one (generated, printed once), then a typed one
    assert tenure_cli.main(["users", "set-password", "admin"]) == 0
    generated = capsys.readouterr().out.split("password (shown once): ")[1].strip()
    assert accounts.authenticate(engine, "admin", generated) is not None
    assert accounts.authenticate(engine, "admin", old) is None
    monkeypatch.setattr("sys.stdin", io.StringIO("another long password\n"))
    assert tenure_cli.main(["users", "set-password", "admin", "--password-stdin"]) == 0
    assert "another long password" not in capsys.readouterr().out

    # Then only the latest works; an unknown user or a short password changes nothing
    assert accounts.authenticate(engine, "admin", "another long password") is not None
    assert tenure_cli.main(["users", "set-password", "nobody"]) == 1
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    assert tenure_cli.main(["users", "set-password", "admin", "--password-stdin"]) == 1
    assert accounts.authenticate(engine, "admin", "another long password") is not None


def test_migrations_create_the_accounts_tables(tmp_path: Path) -> None:
    """Replaying the migrations gives the accounts and audit tables exactly as the models declare them."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import inspect

    import accounts.audit_store  # noqa: F401  (its table is part of the metadata)
    import accounts.session_store  # noqa: F401  (so are the login sessions' and the live slots')
    import accounts.slot_store  # noqa: F401

    url = f"sqlite:///{tmp_path / 'm.db'}"
    schema.upgrade(url)
    tables = set(metadata.tables)
    assert tables == {"roles", "role_permissions", "users", "api_tokens", "audit_log", "login_sessions", "live_slots"}
    engine = make_engine(url)
    try:
        with engine.connect() as conn:

            def only_accounts(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
                table = name if type_ == "table" else getattr(getattr(obj, "table", None), "name", None)
                return table in tables

            ctx = MigrationContext.configure(conn, opts={"compare_type": True, "include_object": only_accounts})
            assert compare_metadata(ctx, metadata) == []
            checks = {c["name"] for t in tables for c in inspect(conn).get_check_constraints(t)}
        assert checks == {"ck_api_tokens_revoked_after_created", "ck_audit_log_outcome_known"}
        user, _ = accounts.create_user(engine, "ivan", role="admin")
        assert accounts.create_token(engine, user.id, "t")[0].active
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.services)])
def test_revision_0017_keeps_every_user_and_token(tmp_path: Path, backend: str) -> None:
    """Users of revision 0016's ``admin``/``user`` CHECK get the built-in roles of those names, and their
    tokens keep working with every action of their role (on SQLite the users table is rebuilt: its
    tokens, which cascade on delete, must survive that)."""
    from contextlib import nullcontext

    from alembic import command
    from sqlalchemy import text

    from jobs.schema import alembic_config
    from tests.integration.jobs.support import postgres_database

    with postgres_database() if backend == "postgres" else nullcontext(f"sqlite:///{tmp_path / 'm.db'}") as url:
        command.upgrade(alembic_config(url), "0016")
        engine = make_engine(url)
        try:
            secrets = {}
            with engine.begin() as conn:
                for name, role in (("old-admin", "admin"), ("old-user", "user")):
                    conn.execute(
                        text(
                            "INSERT INTO users (username, password_hash, role, disabled, created_at) "
                            "VALUES (:n, :h, :r, false, 1)"
                        ),
                        {"n": name, "h": accounts.hash_password("a long password"), "r": role},
                    )
                    secret = f"tnr_{name}-{'x' * 30}"
                    conn.execute(
                        text(
                            "INSERT INTO api_tokens (user_id, name, prefix, token_hash, created_at) "
                            "SELECT id, 'old', :p, :h, 1 FROM users WHERE username = :n"
                        ),
                        {"p": secret[:10], "h": accounts._token_hash(secret), "n": name},
                    )
                    secrets[name] = secret
            command.upgrade(alembic_config(url), "head")
            for name, role in (("old-admin", "admin"), ("old-user", "user")):
                found = accounts.token_identity(engine, secrets[name])
                assert found is not None and found.user.role == role
                assert found.permissions == accounts.permissions.BUILTIN_ROLES[role][1]
                assert accounts.authenticate(engine, name, "a long password") is not None
            assert {r.name: r.permissions for r in accounts.list_roles(engine)} == {
                name: actions for name, (_, actions) in accounts.permissions.BUILTIN_ROLES.items()
            }
            # The audit log takes rows and pages them on this database too
            from accounts import audit

            for n in range(3):
                audit.record_alone(engine, audit.Entry("queue.pause", actor_name="old-admin", target=f"q{n}"))
            first = audit.page(engine, audit.AuditFilter(actor="old-admin"), limit=2)
            rest = audit.page(engine, audit.AuditFilter(actor="old-admin"), cursor=first.next_cursor, limit=2)
            assert [r.target for r in first.items + rest.items] == ["q2", "q1", "q0"] and rest.next_cursor is None
        finally:
            engine.dispose()


def test_roles_and_their_guards(engine: Engine) -> None:
    root, _ = accounts.create_user(engine, "root", role="admin")
    with pytest.raises(accounts.UnknownRole):
        accounts.create_user(engine, "x", role="root")
    accounts.create_role(engine, "reader", "reads", ["jobs.read_own"])
    with pytest.raises(accounts.RoleExists):
        accounts.create_role(engine, "reader", "", [])
    with pytest.raises(accounts.UnknownAction):
        accounts.create_role(engine, "bad", "", ["jobs.everything"])
    with pytest.raises(accounts.BuiltinRole):
        accounts.update_role(engine, "user", "", [])
    with pytest.raises(accounts.BuiltinRole):
        accounts.delete_role(engine, "viewer")
    reader, _ = accounts.create_user(engine, "rita", role="reader")
    assert reader.permissions == {"jobs.read_own"}
    with pytest.raises(accounts.RoleInUse):
        accounts.delete_role(engine, "reader")
    # A token carries only what the role grants, and loses what the role loses
    with pytest.raises(accounts.ActionsExceeded):
        accounts.create_token(engine, reader.id, "t", ["jobs.submit"])
    _, secret = accounts.create_token(engine, reader.id, "t")
    accounts.update_role(engine, "reader", "", ["metrics.read"])
    assert accounts.token_identity(engine, secret).permissions == frozenset()  # type: ignore[union-attr]
    # The last user who may manage users keeps that
    with pytest.raises(accounts.LastManager):
        accounts.set_role(engine, root.id, "user")
    with pytest.raises(accounts.LastManager):
        accounts.set_disabled(engine, root.id, True)
    assert accounts.get_user(engine, root.id).role == "admin"  # type: ignore[union-attr]


def test_cli_ensure_admin_is_recorded_with_the_account(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from accounts import audit

    monkeypatch.setenv("TENURE_DATABASE_URL", str(engine.url))
    assert tenure_cli.main(["users", "ensure-admin"]) == 0
    (row,) = audit.page(engine, audit.AuditFilter(action="user.create")).items
    assert (row.outcome, row.via, row.target, row.details) == ("ok", "cli", "admin", {"role": "admin"})
    assert tenure_cli.main(["users", "ensure-admin"]) == 0  # an admin exists: nothing done, nothing recorded
    assert len(audit.page(engine, audit.AuditFilter(action="user.create")).items) == 1
