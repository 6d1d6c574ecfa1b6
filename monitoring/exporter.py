"""A host's own metrics endpoint: the processes of one ``tenure worker`` (or scheduler, or relay) on a port.

The web process's ``/metrics`` merges the multiprocess directory of *its* host. A worker on another
machine writes its files on that machine's disk, so it serves them itself: ``tenure worker …
--metrics-port 9191`` starts a :class:`MetricsExporter` in the command's main process *before* its
worker processes exist. The exporter

1. gives this command a directory of its own (``--metrics-dir``, or a fresh temporary one) and points
   ``PROMETHEUS_MULTIPROC_DIR`` of this process — hence of every process it starts — at it. The
   processes of an exporter are therefore never in the web's directory: no process is counted by
   two scrape targets;
2. answers ``GET /metrics`` on ``bind:port`` with those processes' metrics, merged as the web's are
   (:func:`monitoring.exposition.render_metrics`: live gauges of dead pids are dropped at each scrape,
   counters and histograms of dead pids stay). It serves **no** database-derived gauge (queue depth,
   jobs per status, outbox, schedules): those come from the web's ``/metrics`` only, so adding hosts
   never repeats them.

A directory given with ``--metrics-dir`` outlives the command: the next start folds the counters and
histograms of the processes that ended into one archive file per type and deletes their gauges,
so a host that crashed and came back goes on from its last counts — including what it counted after
Prometheus' last scrape — instead of restarting from zero, and the directory does not grow with every
restart. An exclusive lock (``.exporter.lock``) keeps a second command off a directory in use.

It must start before ``prometheus_client`` is imported in the process (the library picks
multiprocess mode at import time); :meth:`MetricsExporter.start` refuses otherwise.
"""

from __future__ import annotations

import fcntl
import glob
import hmac
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

logger = logging.getLogger(__name__)

#: prometheus-client's environment variable (see :mod:`monitoring.exposition`).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: The path the endpoint answers (Prometheus' default ``metrics_path``).
METRICS_PATH = "/metrics"
#: Default bind address: only this host can scrape until an address is chosen.
DEFAULT_BIND = "127.0.0.1"
LOCK_FILE = ".exporter.lock"
#: Archive files holding the folded totals of processes that ended (one per metric type).
ARCHIVE_PID = "archive"
_FOLDED_TYPES = ("counter", "histogram")


class ExporterError(RuntimeError):
    """The exporter cannot start (port taken, directory in use, prometheus_client imported too early)."""


class MetricsExporter:
    """Serve the metrics of this process and the processes it starts on ``bind:port``.

    Parameters:
      port: TCP port (0: any free port; :attr:`port` tells which after :meth:`start`).
      bind: Address to listen on (an IPv6 address works too).
      directory: The multiprocess directory; ``None``: a temporary one, removed at :meth:`stop`.
      token: When set, requests need ``Authorization: Bearer <token>`` (else 401).
    """

    def __init__(
        self, port: int, *, bind: str = DEFAULT_BIND, directory: str | Path | None = None, token: str | None = None
    ) -> None:
        self.port = port
        self.bind = bind
        self.directory = Path(directory) if directory is not None else None
        self.token = token
        self._owned_directory = directory is None
        self._lock_fd: int | None = None
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> MetricsExporter:
        """Take the directory, point this process at it, listen. Call before any worker process starts.

        Raises:
          ExporterError: prometheus_client is already imported, the directory is in use by another
            exporter, or the address cannot be bound.
        """
        if "prometheus_client" in sys.modules:
            raise ExporterError(
                "the metrics exporter must start before prometheus_client is imported (it chooses "
                "multiprocess mode at import time)"
            )
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="tenure-metrics-"))
        else:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock()
        # Before anything imports prometheus_client (the fold below does): it reads this at import.
        os.environ[MULTIPROC_ENV] = str(self.directory)
        if not self._owned_directory:
            fold_finished_processes(self.directory)
        try:
            self._listen()
        except BaseException:
            self.stop()
            raise
        logger.info("Serving metrics of %s on http://%s%s", self.directory, self.address, METRICS_PATH)
        return self

    def stop(self) -> None:
        """Stop listening, release the directory (and remove it when it was a temporary one)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if self._owned_directory and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> MetricsExporter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        return f"{host}:{self.port}"

    # -- parts ----------------------------------------------------------------------------------------
    def _lock(self) -> None:
        assert self.directory is not None
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ExporterError(f"another process exports the metrics directory {self.directory}") from None
        self._lock_fd = fd

    def _listen(self) -> None:
        from .exposition import make_wsgi_app

        app = _only_metrics_path(make_wsgi_app(()), self.token)
        server_class = _Server6 if ":" in self.bind else _Server
        try:
            server = server_class((self.bind, self.port), _QuietHandler)
        except OSError as e:
            raise ExporterError(f"cannot listen on {self.address} for metrics: {e.strerror or e}") from None
        server.set_app(app)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="tenure-metrics-exporter", daemon=True)
        self._thread.start()


def fold_finished_processes(directory: str | Path) -> None:
    """Fold the counter and histogram files of ended processes into the archives; delete their gauges.

    Only for a directory no process writes to (the exporter calls it holding the lock, before any of
    its processes start). Crash-safe: the files to fold are first moved into ``folding/`` (with the
    previous archive), the merged archive is written there and renamed back, then ``folding/`` is
    removed; an interrupted fold is finished by the next call.
    """
    from prometheus_client.mmap_dict import MmapedDict

    root = Path(directory)
    for typ in _FOLDED_TYPES:
        archive = root / f"{typ}_{ARCHIVE_PID}.db"
        folding = root / f"folding-{typ}"
        if folding.exists() and archive.exists():
            shutil.rmtree(folding)  # the merged archive was renamed back: only the clean-up was left
        folding.mkdir(exist_ok=True)
        if archive.exists():  # first: while folding/ exists, an archive in root means the fold completed
            os.replace(archive, folding / archive.name)
        for path in glob.glob(str(root / f"{typ}_*.db")):
            os.replace(path, folding / os.path.basename(path))
        parts = sorted(glob.glob(str(folding / f"{typ}_*.db")))
        if parts:
            totals: dict[str, float] = {}
            for path in parts:
                for key, value, _timestamp, _pos in MmapedDict.read_all_values_from_file(path):
                    totals[key] = totals.get(key, 0.0) + value
            merged = folding / "merged.tmp"
            merged.unlink(missing_ok=True)
            out = MmapedDict(str(merged))
            try:
                for key, value in sorted(totals.items()):
                    out.write_value(key, value, 0.0)
            finally:
                out.close()
            os.replace(merged, archive)
        shutil.rmtree(folding)
    for path in glob.glob(str(root / "gauge_*.db")):
        os.unlink(path)  # live gauges of processes that ended


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    """No access log: Prometheus scrapes every few seconds."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _only_metrics_path(app: Callable[..., Iterable[bytes]], token: str | None) -> Callable[..., Iterable[bytes]]:
    expected = f"Bearer {token}".encode() if token else None

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != METRICS_PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [f"Not found: metrics are at {METRICS_PATH}\n".encode()]
        if expected is not None:
            given = environ.get("HTTP_AUTHORIZATION", "").encode()
            if not hmac.compare_digest(given, expected):
                start_response("401 Unauthorized", [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")])
                return [b"Unauthorized\n"]
        return app(environ, start_response)

    return wrapped
