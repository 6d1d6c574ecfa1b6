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
    args = parser.parse_args(argv)

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
    if args.command == "relay":
        import importlib

        from jobs.outbox import relay_forever

        if args.app:
            importlib.import_module(args.app)
        relay_forever(settings)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
