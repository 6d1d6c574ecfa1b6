"""``tenure scheduler``: periodiq's CLI, plus the ``--metrics-*`` options of this host's metrics port."""

from __future__ import annotations

import logging


def scheduler_command(args: list[str]) -> int:
    """``tenure scheduler APP [periodiq options] [--metrics-port N …]``: run ``periodiq APP`` in this process.

    The same scheduler as ``periodiq APP`` (its arguments, its loop, its logs); with ``--metrics-port``
    the process serves its own metrics (``tenure_schedule_fires_total`` and the rest) on that port
    (:mod:`tenure_cli.metrics`). The exporter starts before the app is imported, as it must.
    """
    import periodiq

    from . import metrics

    parser = periodiq.make_argument_parser()
    parser.prog = "tenure scheduler"
    parser.description = "Run periodiq's scheduler (all of `periodiq`'s arguments), optionally with a metrics port."
    metrics.add_arguments(parser)
    ns = parser.parse_args(args)
    logging.basicConfig(level=logging.INFO, format=periodiq.LOGFORMAT)
    with metrics.serving(ns):
        try:
            return int(periodiq.main(ns) or 0)
        except KeyboardInterrupt:
            logging.getLogger("periodiq").info("Interrupted.")
            return 0
