"""``tenure relay``: the outbox relay (:func:`jobs.outbox.relay_forever`) in a supervised child process.

The supervisor replaces the child if it dies (SIGKILL, an OOM kill, a crash), with the backoff and
crash cap of ``tenure worker``, and reports it the same way (log, metrics, the Workers page). The
relay loop already survives the errors it can catch (it logs them and tries again). A row is marked
published in the transaction that published it, so the relay needs no drain: SIGTERM (or Ctrl-C,
SIGHUP) is passed on to the child, which exits at once, and so does the supervisor (exit code 0; 1
if the relay had been given up).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from . import metrics
from .supervisor import add_supervision_arguments, supervise_one, unblock_in_child


def add_relay_parser(sub: argparse._SubParsersAction) -> None:
    relay = sub.add_parser("relay", help="publish the outbox to the broker (needed when it is not SQLite)")
    relay.add_argument("--app", help="the app composing the broker, as Dramatiq's broker argument (e.g. tasks:compose)")
    add_supervision_arguments(relay, role="relay")
    metrics.add_arguments(relay)


def relay_command(ns: argparse.Namespace, settings: Any) -> int:
    """``tenure relay [--app APP] [supervision options]``.

    The schema is checked first, here: a database at another revision is a deployment error that no
    restart mends (exit 1 at once).
    """
    from jobs.db import make_engine
    from jobs.errors import SchemaMismatch
    from jobs.schema import check_database_at_head

    engine = make_engine(settings.database_url)
    try:
        check_database_at_head(engine)
    except SchemaMismatch as e:
        print(f"tenure: {e}", file=sys.stderr)
        return 1
    finally:
        engine.dispose()

    def main() -> None:
        from dramatiq.cli import import_broker

        from jobs.outbox import relay_forever

        unblock_in_child()
        # Its start line and errors on stderr, as the other Procfile processes log theirs.
        logging.basicConfig(
            level=logging.INFO, format="[%(asctime)s] [PID %(process)d] [%(name)s] [%(levelname)s] %(message)s"
        )
        if ns.app:
            import_broker(ns.app)  # Dramatiq's own form: `module`, `module:broker` or `module:callable`
        try:
            relay_forever(settings)
        except SchemaMismatch as e:
            print(f"tenure: {e}", file=sys.stderr)
            sys.exit(1)

    with metrics.serving(ns):  # before the child exists (it imports the metrics)
        return supervise_one(ns, main)
