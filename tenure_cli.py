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
    args = parser.parse_args(argv)
    if args.command == "db" and args.db_command == "upgrade":
        from broker import DEFAULT_URL, SQLiteBroker

        broker = SQLiteBroker(DEFAULT_URL, middleware=[])
        broker.stats()  # creates the schema on first use
        broker.close()
        print("database ready")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
