"""``tenure scheduler``: periodiq's scheduler in a supervised child process, optionally with a metrics port.

The child runs ``periodiq APP …`` (same arguments, same logs); the supervisor replaces it if it dies
(SIGKILL, an OOM kill, a crash), with the backoff and crash cap of ``tenure worker``, and reports it
the same way (log, metrics, the Workers page). A tick is one transaction, so a scheduler needs no
drain: SIGTERM (or Ctrl-C, SIGHUP) is passed on to the child, which exits at once, and so does the
supervisor (exit code 0; 1 if the scheduler had been given up). With ``--metrics-port`` this host
serves the scheduler's metrics (``tenure_schedule_fires_total`` and the rest) on that port
(:mod:`tenure_cli.metrics`); the exporter starts before the child exists, as it must.
"""

from __future__ import annotations

import logging
import sys

from .supervisor import add_supervision_arguments, supervise_one, unblock_in_child


def scheduler_command(args: list[str]) -> int:
    """``tenure scheduler APP [modules] [-P PATH] [-v] [supervision options] [--metrics-port N …]``."""
    import periodiq
    from dramatiq.cli import LOGFORMAT

    from . import metrics

    parser = periodiq.make_argument_parser()
    parser.prog = "tenure scheduler"
    parser.description = (
        "Run periodiq's scheduler (`periodiq`'s arguments) in a child process that is replaced if it dies, "
        "optionally with a metrics port. Exit codes: 0 stopped, 1 when the scheduler was given up after too "
        "many crashes in a row."
    )
    add_supervision_arguments(parser, role="scheduler")
    metrics.add_arguments(parser)
    ns = parser.parse_args(args)

    def main() -> None:
        unblock_in_child()
        logging.basicConfig(level=logging.INFO, format=LOGFORMAT)  # as periodiq's own entry point does
        sys.exit(periodiq.main(ns))

    with metrics.serving(ns):
        return supervise_one(ns, main)
