"""The metrics options of ``tenure worker``, ``tenure scheduler`` and ``tenure relay`` (docs/monitoring.md).

``--metrics-port`` (or ``TENURE_METRICS_PORT``) makes the command serve its own processes' metrics
on that port through :class:`monitoring.exporter.MetricsExporter`; without it nothing listens and
the processes write to ``PROMETHEUS_MULTIPROC_DIR`` as before (the web's ``/metrics`` of the same
host serves them). The variables suit one process per container; in a Procfile give each process
type its own ``--metrics-port``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

PORT_ENV = "TENURE_METRICS_PORT"
BIND_ENV = "TENURE_METRICS_BIND"
DIR_ENV = "TENURE_METRICS_DIR"
TOKEN_FILE_ENV = "TENURE_METRICS_TOKEN_FILE"


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {value!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 1-65535")
    return port


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    """Add the ``--metrics-*`` options (their defaults from the ``TENURE_METRICS_*`` variables)."""
    env = os.environ if env is None else env
    group = parser.add_argument_group("metrics of this host's processes (docs/monitoring.md)")
    group.add_argument(
        "--metrics-port",
        type=_port,
        default=env.get(PORT_ENV) or None,  # argparse converts (and reports) a string default too
        help=f"serve this command's processes' metrics at http://BIND:PORT/metrics (env {PORT_ENV}; default: off)",
    )
    group.add_argument(
        "--metrics-bind",
        default=env.get(BIND_ENV) or "127.0.0.1",
        help=f"address the metrics port listens on (env {BIND_ENV}; default 127.0.0.1: this host only)",
    )
    group.add_argument(
        "--metrics-dir",
        type=Path,
        default=env.get(DIR_ENV) or None,
        help=f"this command's own multiprocess directory, kept across restarts (env {DIR_ENV}; default: a "
        "temporary directory removed at exit)",
    )
    group.add_argument(
        "--metrics-token-file",
        type=Path,
        default=env.get(TOKEN_FILE_ENV) or None,
        help=f"require 'Authorization: Bearer <the file's content>' (env {TOKEN_FILE_ENV}; default: no credentials)",
    )


@contextmanager
def serving(ns: argparse.Namespace) -> Iterator[object | None]:
    """Run the exporter the options ask for around the command (nothing when ``--metrics-port`` is unset).

    Exits with status 2 and a message when the exporter cannot start (port taken, directory in use).
    """
    if ns.metrics_port is None:
        yield None
        return
    from monitoring.exporter import ExporterError, MetricsExporter

    token = None
    try:
        if ns.metrics_token_file is not None:
            token = ns.metrics_token_file.read_text(encoding="utf-8").strip()
            if not token:
                raise ExporterError(f"the metrics token file {ns.metrics_token_file} is empty")
        exporter = MetricsExporter(ns.metrics_port, bind=ns.metrics_bind, directory=ns.metrics_dir, token=token)
        exporter.start()
    except (ExporterError, OSError) as e:
        print(f"tenure: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        yield exporter
    finally:
        exporter.stop()
