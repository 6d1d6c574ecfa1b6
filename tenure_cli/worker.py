"""``tenure worker``: Dramatiq's CLI, plus an exit code that tells whether work was left to its leases."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from typing import Any

from . import metrics

#: ``tenure worker`` exits with this code (EX_TEMPFAIL) when, past ``--worker-shutdown-timeout``,
#: messages were still running: their leases were left to expire and they run again elsewhere.
EXIT_WORK_LEFT_TO_LEASES = 75
#: Set by ``tenure worker`` for its worker processes: the app (Dramatiq's broker argument) to load.
WORKER_APP_ENV = "TENURE_WORKER_APP"
#: Set by ``tenure worker`` for its worker processes: where each writes its shutdown report.
WORKER_REPORT_DIR_ENV = "TENURE_WORKER_REPORT_DIR"
#: A worker process ignores a second SIGTERM arriving this soon after the first (see boot_worker).
DUPLICATE_SIGTERM_WINDOW_S = 2.0


def worker_command(args: list[str]) -> int:
    """``tenure worker APP [dramatiq options]``: run Dramatiq's CLI, then say how the stop went.

    Everything is Dramatiq's own CLI (same arguments, same signals, same logs), plus the
    ``--metrics-*`` options (:mod:`tenure_cli.metrics`: this command's processes' own metrics port);
    two more things are added.
    Each worker process loads *APP* through :func:`boot_worker`, which adds a middleware that notes
    the messages still running when the Worker's shutdown timeout ran out. After Dramatiq returns,
    exit code 0 becomes :data:`EXIT_WORK_LEFT_TO_LEASES` (75) if any process left such messages: they
    keep their leases (nobody else starts them while this host may still run them) and run again
    elsewhere once the leases expire. Dramatiq's own non-zero codes (1 killed, 2 import, 3 connect,
    4 pid file) are returned unchanged.
    """
    import shutil
    import tempfile

    from dramatiq import cli as dramatiq_cli

    parser = dramatiq_cli.make_argument_parser()
    parser.prog = "tenure worker"
    parser.description = (
        "Run Dramatiq worker processes (all of `dramatiq`'s arguments). Exit codes: Dramatiq's, plus "
        f"{EXIT_WORK_LEFT_TO_LEASES} when messages still running at the end of --worker-shutdown-timeout "
        "were left to their leases (they run again on another worker once the leases expire)."
    )
    metrics.add_arguments(parser)
    ns = parser.parse_args(args)
    report_dir = tempfile.mkdtemp(prefix="tenure-worker-")
    os.environ[WORKER_APP_ENV] = ns.broker
    os.environ[WORKER_REPORT_DIR_ENV] = report_dir
    ns.broker = "tenure_cli.worker:boot_worker"
    try:
        with metrics.serving(ns):  # before the worker processes start: they inherit its directory
            code = dramatiq_cli.main(ns)
        left = _read_shutdown_reports(report_dir)
    finally:
        shutil.rmtree(report_dir, ignore_errors=True)
    if left:
        print(
            f"tenure worker: {len(left)} message(s) were still running when the shutdown timeout "
            f"({ns.worker_shutdown_timeout} ms) ran out; they were left to their leases and will run again "
            f"on another worker: {', '.join(sorted(left))}",
            file=sys.stderr,
        )
        if code == 0:
            return EXIT_WORK_LEFT_TO_LEASES
    return int(code or 0)


def _read_shutdown_reports(report_dir: str) -> dict[str, str]:
    """``message id → actor`` of every message a worker process reported as left running."""
    left: dict[str, str] = {}
    for name in os.listdir(report_dir):
        if name.endswith(".json"):
            with open(os.path.join(report_dir, name), encoding="utf-8") as f:
                left.update(json.load(f)["left_running"])
    return left


def boot_worker() -> None:
    """Dramatiq's broker argument under ``tenure worker``, called in each worker process.

    Imports the app (``module`` or ``module:broker``, as Dramatiq's own argument) and adds the
    shutdown report middleware to its broker.

    It also makes one stop one stop. A process manager that signals the process *group* (honcho,
    foreman, ``kill -TERM -PGID``, systemd's default ``KillMode=control-group``) delivers SIGTERM to a
    worker process twice, microseconds apart: once directly and once forwarded by Dramatiq's main
    process (which forwards only once its workers have booted, so seconds later if the stop came
    during start-up). Two things go wrong with the second one. Dramatiq treats it as "kill now"
    (``sys.exit(1)`` in the middle of the graceful stop: no Worker stop, no broker close, acks lost,
    an unclean exit reported by the next start). And a handler re-entered while the first run of it
    holds a lock deadlocks the main thread (the SQLite broker's SIGTERM hook sets a
    ``threading.Event``), so the process hangs until the process manager's SIGKILL. So the first
    SIGTERM is passed on and repeats are dropped — by the outermost handler, before anything takes
    a lock — until the Worker's stop has been under way for :data:`DUPLICATE_SIGTERM_WINDOW_S`; one
    after that still kills (a second Ctrl-C).
    """
    import dramatiq
    from dramatiq.cli import import_broker

    report = _shutdown_report(os.environ[WORKER_REPORT_DIR_ENV])
    report.guard_sigterm_during_boot()
    _, broker = import_broker(os.environ[WORKER_APP_ENV])
    dramatiq.set_broker(broker)
    broker.add_middleware(report)


def _shutdown_report(report_dir: str) -> Any:
    """A middleware that writes ``<report_dir>/<pid>.json`` when the Worker stops with messages still running."""
    import signal
    import time

    from dramatiq.middleware import Middleware

    logger = logging.getLogger("tenure.worker")

    class ShutdownReport(Middleware):
        def __init__(self) -> None:
            self._lock = threading.Lock()
            self._running: dict[str, str] = {}
            #: ``time.monotonic()`` when the Worker began stopping (None until then).
            self.stopping_since: float | None = None
            self._sigterm_seen = False
            self._booted = False

        # -- one stop per SIGTERM delivery (see boot_worker) -------------------------------------
        def guard_sigterm_during_boot(self) -> None:
            """Before the app loads: wrap Dramatiq's handler so only the first SIGTERM reaches it."""
            dramatiq_handler = signal.getsignal(signal.SIGTERM)
            if not callable(dramatiq_handler):
                return

            def during_boot(signum: int, frame: Any) -> Any:
                if not self._booted:  # after boot, the outer handler below has already filtered
                    if self._sigterm_seen:
                        return None
                    self._sigterm_seen = True
                return dramatiq_handler(signum, frame)

            signal.signal(signal.SIGTERM, during_boot)

        def after_process_boot(self, broker: Any) -> None:
            """After the broker's own hooks: become the outermost SIGTERM handler."""
            inner = signal.getsignal(signal.SIGTERM)
            if not callable(inner):
                return

            def outermost(signum: int, frame: Any) -> Any:
                if self._sigterm_seen:
                    since = self.stopping_since
                    if since is None or time.monotonic() - since < DUPLICATE_SIGTERM_WINDOW_S:
                        return None  # the same stop, delivered again
                self._sigterm_seen = True
                return inner(signum, frame)

            self._booted = True
            signal.signal(signal.SIGTERM, outermost)

        def before_worker_shutdown(self, broker: Any, worker: Any) -> None:
            self.stopping_since = time.monotonic()

        # -- what was left running ----------------------------------------------------------------

        def before_process_message(self, broker: Any, message: Any) -> None:
            with self._lock:
                self._running[message.message_id] = message.actor_name

        def after_process_message(
            self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
        ) -> None:
            with self._lock:
                self._running.pop(message.message_id, None)

        def after_skip_message(self, broker: Any, message: Any) -> None:
            with self._lock:
                self._running.pop(message.message_id, None)

        def after_worker_shutdown(self, broker: Any, worker: Any) -> None:
            # Worker.stop() has joined its threads for at most the shutdown timeout: what is still
            # registered here is running, and its lease is left to expire (see docs/operations.md).
            with self._lock:
                left = dict(self._running)
            if not left:
                return
            logger.warning(
                "%d message(s) still running after the shutdown timeout are left to their leases: %s",
                len(left),
                ", ".join(f"{actor} {mid}" for mid, actor in sorted(left.items())),
            )
            path = os.path.join(report_dir, f"{os.getpid()}.json")
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                json.dump({"pid": os.getpid(), "left_running": left}, f)
            os.replace(path + ".tmp", path)

    return ShutdownReport()
