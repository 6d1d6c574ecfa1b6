"""The ``tenure`` command line: ``tenure db upgrade`` and friends (filled in by later issues)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tenure", description="Tenure: durable jobs on Dramatiq.")
    sub = parser.add_subparsers(dest="command", required=True)
    db = sub.add_parser("db", help="database schema")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    db_sub.add_parser("upgrade", help="create or migrate the database to the newest schema")
    _add_users_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "users":
        return _users_command(args)
    if args.command == "db" and args.db_command == "upgrade":
        from broker import DEFAULT_URL, SQLiteBroker

        broker = SQLiteBroker(DEFAULT_URL, middleware=[])
        broker.stats()  # creates the schema on first use
        broker.close()
        print("database ready")
        return 0
    return 2


def _add_users_parser(sub: argparse._SubParsersAction) -> None:
    users = sub.add_parser("users", help="web app accounts")
    users_sub = users.add_subparsers(dest="users_command", required=True)
    create = users_sub.add_parser("create", help="create a user; prints a generated password once")
    create.add_argument("name")
    create.add_argument("--admin", action="store_true", help="role admin (default: user)")
    create.add_argument(
        "--password-stdin", action="store_true", help="read the password from stdin instead of generating one"
    )
    users_sub.add_parser("ensure-admin", help="create user 'admin' with a random password if no admin exists")


def _users_command(args: argparse.Namespace) -> int:
    """``tenure users …``: passwords are read from stdin or generated, never taken from argv."""
    import os

    from sqlalchemy import create_engine, inspect

    from broker import DEFAULT_URL
    from jobs import accounts

    engine = create_engine(os.environ.get("TENURE_DATABASE_URL", DEFAULT_URL))
    if not inspect(engine).has_table("users"):
        print("tenure: the database has no accounts tables yet; run `tenure db upgrade` first", file=sys.stderr)
        return 1
    if args.users_command == "ensure-admin":
        created = accounts.ensure_admin(engine)
        if created is None:
            print("an admin account exists")
            return 0
        user, password = created
        print(f"Created admin account {user.username!r} with password: {password}")
        print("Log in at the web app's /login page; this password is shown only once.")
        return 0
    password = sys.stdin.readline().rstrip("\n") if args.password_stdin else None
    try:
        user, password = accounts.create_user(engine, args.name, password, role="admin" if args.admin else "user")
    except (accounts.AccountError, ValueError) as exc:
        print(f"tenure: {exc}", file=sys.stderr)
        return 1
    print(f"created {user.role} {user.username!r}")
    if not args.password_stdin:
        print(f"password (shown once): {password}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
