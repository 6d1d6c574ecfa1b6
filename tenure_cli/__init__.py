"""The ``tenure`` command line: ``tenure worker``, ``tenure db upgrade`` and friends.

Each command group lives in its own module: :mod:`tenure_cli.worker` (worker processes),
:mod:`tenure_cli.admin` (database, accounts, relay, demo data), :mod:`tenure_cli.operator`
(``jobs``, ``queues``, ``dead-letters``, ``schedules``, ``workers``: the HTTP API, from any machine;
they never import the server side).
"""

from __future__ import annotations

import argparse
import logging
import sys

from . import admin, operator
from .worker import EXIT_WORK_LEFT_TO_LEASES


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        from .worker import worker_command

        return worker_command(argv[1:])
    parser = argparse.ArgumentParser(prog="tenure", description="Tenure: durable jobs on Dramatiq.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "worker",
        help="`dramatiq` with an exit code that tells whether work was left to its leases (see tenure worker -h)",
    )
    db = sub.add_parser("db", help="database schema")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_sub.add_parser("upgrade", help="create or migrate the database to the newest schema")
    upgrade.add_argument("--url", help="database URL (default: TENURE_DATABASE_URL)")
    check = db_sub.add_parser("check", help="exit 1 unless the database is at the newest schema")
    check.add_argument("--url", help="database URL (default: TENURE_DATABASE_URL)")
    relay = sub.add_parser("relay", help="publish the outbox to the broker (needed when it is not SQLite)")
    relay.add_argument("--app", help="the app composing the broker, as Dramatiq's broker argument (e.g. tasks:compose)")
    admin.add_users_parser(sub)
    admin.add_demo_parser(sub)
    operator.add_parsers(sub)
    args = parser.parse_args(argv)
    if args.command in operator.GROUPS:
        return operator.run(args)
    if args.command == "demo":
        return admin.demo_command(args)

    from jobs.errors import SchemaMismatch
    from settings.environment import Settings, SettingsError

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
        return admin.users_command(args, settings.database_url)
    if args.command == "relay":
        from jobs.outbox import relay_forever

        # Its start line and errors on stderr, as the other Procfile processes log theirs.
        logging.basicConfig(
            level=logging.INFO, format="[%(asctime)s] [PID %(process)d] [%(name)s] [%(levelname)s] %(message)s"
        )
        if args.app:
            from dramatiq.cli import import_broker

            import_broker(args.app)  # Dramatiq's own form: `module`, `module:broker` or `module:callable`
        try:
            relay_forever(settings)
        except SchemaMismatch as e:
            print(f"tenure: {e}", file=sys.stderr)
            return 1
        return 0
    return 2


__all__ = ["EXIT_WORK_LEFT_TO_LEASES", "main"]
