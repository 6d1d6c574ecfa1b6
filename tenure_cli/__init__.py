"""The ``tenure`` command line: ``tenure worker``, ``tenure scheduler``, ``tenure db upgrade`` and friends.

Each command group lives in its own module: :mod:`tenure_cli.worker` (worker processes),
:mod:`tenure_cli.scheduler` (periodiq), :mod:`tenure_cli.admin` (database, accounts, relay, demo
data); :mod:`tenure_cli.metrics` holds the metrics-port options the long-running commands share.
"""

from __future__ import annotations

import argparse
import logging
import sys

from . import admin, metrics
from .worker import EXIT_WORK_LEFT_TO_LEASES


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        from .worker import worker_command

        return worker_command(argv[1:])
    if argv[:1] == ["scheduler"]:
        from .scheduler import scheduler_command

        return scheduler_command(argv[1:])
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
    sub.add_parser("scheduler", help="`periodiq` with a metrics port option (see tenure scheduler -h)")
    relay = sub.add_parser("relay", help="publish the outbox to the broker (needed when it is not SQLite)")
    relay.add_argument("--app", help="module declaring the job kinds and the broker (e.g. tasks)")
    metrics.add_arguments(relay)
    admin.add_users_parser(sub)
    admin.add_demo_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "demo":
        return admin.demo_command(args)

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
        return admin.users_command(args, settings.database_url)
    if args.command == "relay":
        import importlib

        from jobs.outbox import relay_forever

        # Its start line and errors on stderr, as the other Procfile processes log theirs.
        logging.basicConfig(
            level=logging.INFO, format="[%(asctime)s] [PID %(process)d] [%(name)s] [%(levelname)s] %(message)s"
        )
        with metrics.serving(args):  # before the app is imported (it imports the metrics)
            if args.app:
                importlib.import_module(args.app)
            try:
                relay_forever(settings)
            except SchemaMismatch as e:
                print(f"tenure: {e}", file=sys.stderr)
                return 1
        return 0
    return 2


__all__ = ["EXIT_WORK_LEFT_TO_LEASES", "main"]
