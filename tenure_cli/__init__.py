"""The ``tenure`` command line: ``tenure worker``, ``tenure scheduler``, ``tenure db upgrade`` and friends.

Each command group lives in its own module: :mod:`tenure_cli.worker` (worker processes),
:mod:`tenure_cli.scheduler` and :mod:`tenure_cli.relay` (the scheduler and the outbox relay), all
three supervised by :mod:`tenure_cli.supervisor`; :mod:`tenure_cli.admin` (accounts, demo data);
:mod:`tenure_cli.operator` (``jobs``, ``queues``, ``dead-letters``, ``schedules``, ``workers``: the
HTTP API, from any machine; they never import the server side); :mod:`tenure_cli.metrics` holds the
metrics-port options the long-running commands share.
"""

from __future__ import annotations

import argparse
import sys

from . import admin, operator
from .relay import add_relay_parser
from .worker import EXIT_WORK_LEFT_TO_LEASES


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The supervised commands end with exit_now: their children are gone by then, and finalizing the
    # modules they loaded would take seconds out of a process manager's kill timeout.
    if argv[:1] == ["worker"]:
        from .supervisor import exit_now
        from .worker import worker_command

        exit_now(worker_command(argv[1:]))
    if argv[:1] == ["scheduler"]:
        from .scheduler import scheduler_command
        from .supervisor import exit_now

        exit_now(scheduler_command(argv[1:]))
    parser = argparse.ArgumentParser(prog="tenure", description="Tenure: durable jobs on Dramatiq.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "worker",
        help="Dramatiq worker processes, replaced when one dies; exit code 75 when work was left to its leases "
        "(see tenure worker -h)",
    )
    sub.add_parser(
        "scheduler",
        help="periodiq's scheduler in a child process that is replaced if it dies (see tenure scheduler -h)",
    )
    db = sub.add_parser("db", help="database schema")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_sub.add_parser("upgrade", help="create or migrate the database to the newest schema")
    upgrade.add_argument("--url", help="database URL (default: TENURE_DATABASE_URL)")
    check = db_sub.add_parser("check", help="exit 1 unless the database is at the newest schema")
    check.add_argument("--url", help="database URL (default: TENURE_DATABASE_URL)")
    add_relay_parser(sub)
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
        from .relay import relay_command
        from .supervisor import exit_now

        exit_now(relay_command(args, settings))
    return 2


__all__ = ["EXIT_WORK_LEFT_TO_LEASES", "main"]
