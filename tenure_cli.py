"""The ``tenure`` command line: ``tenure db upgrade`` and friends."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tenure", description="Tenure: durable jobs on Dramatiq.")
    sub = parser.add_subparsers(dest="command", required=True)
    db = sub.add_parser("db", help="database schema")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_sub.add_parser("upgrade", help="create or migrate the database to the newest schema")
    upgrade.add_argument("--url", help="database URL (default: TENURE_DATABASE_URL)")
    check = db_sub.add_parser("check", help="exit 1 unless the database is at the newest schema")
    check.add_argument("--url", help="database URL (default: TENURE_DATABASE_URL)")
    relay = sub.add_parser("relay", help="publish the outbox to the broker (needed when it is not SQLite)")
    relay.add_argument("--app", help="module declaring the job kinds and the broker (e.g. tasks)")
    _add_users_parser(sub)
    _add_demo_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo_command(args)

    from jobs.errors import SchemaMismatch
    from jobs.settings import Settings, SettingsError

    try:
        settings = Settings.from_env()
    except SettingsError as e:
        print(f"tenure: {e}", file=sys.stderr)
        return 2
    if args.command == "db":
        from jobs import schema
        from jobs.db import make_engine

        url = args.url or settings.database_url
        try:
            if args.db_command == "upgrade":
                revision = schema.upgrade(url)
                print(f"database at schema revision {revision}")
                return 0
            engine = make_engine(url)
            try:
                revision = schema.check_database_at_head(engine)
            finally:
                engine.dispose()
            print(f"database at schema revision {revision}")
            return 0
        except SchemaMismatch as e:
            print(f"tenure: {e}", file=sys.stderr)
            return 1
    if args.command == "users":
        return _users_command(args, settings.database_url)
    if args.command == "relay":
        import importlib

        from jobs.outbox import relay_forever

        if args.app:
            importlib.import_module(args.app)
        try:
            relay_forever(settings)
        except SchemaMismatch as e:
            print(f"tenure: {e}", file=sys.stderr)
            return 1
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


def _add_demo_parser(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="demo data")
    demo_sub = demo.add_subparsers(dest="demo_command", required=True)
    make = demo_sub.add_parser(
        "make-recording", help="write a synthetic live-stream recording folder (FLV segments + danmaku XML)"
    )
    make.add_argument("directory", help="folder to create (the files go directly into it)")
    make.add_argument("--segments", type=int, default=3, help="number of segments (default 3)")
    make.add_argument("--seconds", type=float, default=6.0, help="length of each segment (default 6)")
    make.add_argument(
        "--truncate", type=int, default=None, metavar="N", help="cut segment N as a crashed recorder would"
    )
    make.add_argument("--malformed-xml", type=int, default=None, metavar="N", help="cut segment N's danmaku XML")


def _demo_command(args: argparse.Namespace) -> int:
    """``tenure demo make-recording DIR``: test-pattern video, tone, speech and danmaku, with ffmpeg."""
    from tasks.domain.demo_recording import make_recording
    from tasks.domain.media.ffmpeg import FfmpegError, FfmpegNotFound

    if args.segments < 1 or args.seconds <= 0:
        print("tenure: --segments must be at least 1 and --seconds positive", file=sys.stderr)
        return 2
    try:
        made = make_recording(
            args.directory,
            segments=args.segments,
            seconds=args.seconds,
            truncate_segment=args.truncate,
            malformed_xml=args.malformed_xml,
        )
    except (FfmpegError, FfmpegNotFound) as exc:
        print(f"tenure: {exc}", file=sys.stderr)
        return 1
    for segment in made.segments:
        notes = [n for n, on in (("truncated", segment.truncated), ("malformed xml", segment.xml_malformed)) if on]
        print(
            f"{segment.flv.name}  {segment.written_duration_s:.2f} s{'  (' + ', '.join(notes) + ')' if notes else ''}"
        )
    print(f"recording of room {made.room_id} in {made.folder}")
    return 0


def _users_command(args: argparse.Namespace, database_url: str) -> int:
    """``tenure users …``: passwords are read from stdin or generated, never taken from argv."""
    from sqlalchemy import inspect

    from jobs import accounts
    from jobs.db import make_engine

    engine = make_engine(database_url)
    try:
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
    finally:
        engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
