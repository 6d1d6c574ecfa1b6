"""``tenure worker``: supervised Dramatiq worker processes; an exit code that says if work was left to its leases."""

from __future__ import annotations

import json
import logging
import os
import signal
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

#: In a worker process: shared with the supervisor, set once the process took a SIGTERM, so that the
#: supervisor does not pass on a copy of the same stop (``ChildSpec.stopping``).
_stopping: Any = None


def worker_command(args: list[str]) -> int:
    """``tenure worker APP [dramatiq options] [supervision options]``: supervised Dramatiq worker processes.

    Each of the ``--processes`` slots runs Dramatiq's own worker process (``dramatiq.cli.worker_process``:
    same arguments, signals and logs as ``dramatiq``), forked by a :class:`~tenure_cli.supervisor.Supervisor`
    instead of Dramatiq's main process: a worker process that dies is replaced (backoff, crash cap)
    while its siblings run on, where Dramatiq's CLI would stop them all. Each worker process loads
    *APP* through :func:`boot_worker`, which adds a middleware that notes the messages still running
    when the Worker's shutdown timeout ran out. Exit codes: Dramatiq's for the stop (0; 1 when a worker
    process was killed), 1 when a slot was given up on, and :data:`EXIT_WORK_LEFT_TO_LEASES` (75)
    instead of 0 when messages were left to their leases (they keep them, so nobody else starts them
    while this host may still run them, and run again elsewhere once the leases expire); 2 for bad
    arguments, 4 for a pid file in use. The ``--metrics-*`` options (:mod:`tenure_cli.metrics`) give this
    command's processes their own metrics port.
    """
    import shutil
    import tempfile

    from dramatiq import cli as dramatiq_cli

    from .supervisor import add_supervision_arguments

    parser = dramatiq_cli.make_argument_parser()
    parser.prog = "tenure worker"
    parser.description = (
        "Run Dramatiq worker processes (`dramatiq`'s arguments but --watch, --fork-function, --use-spawn) "
        "and replace any that dies. Exit codes: Dramatiq's, 1 when a slot was given up after too many "
        f"crashes in a row, {EXIT_WORK_LEFT_TO_LEASES} when messages still running at the end of "
        "--worker-shutdown-timeout were left to their leases (they run again on another worker once the "
        "leases expire)."
    )
    add_supervision_arguments(parser, role="worker")
    metrics.add_arguments(parser)
    ns = parser.parse_args(args)
    for refused, given in (("--watch", ns.watch), ("--fork-function", ns.forks), ("--use-spawn", ns.use_spawn)):
        if given:
            parser.error(f"{refused} is not supported by tenure worker (run `dramatiq` for it)")
    for path in ns.path:
        sys.path.insert(0, path)
    try:
        if ns.pid_file:
            dramatiq_cli.setup_pidfile(ns.pid_file)
    except RuntimeError as e:
        print(f"tenure worker: {e}", file=sys.stderr)
        return dramatiq_cli.RET_PIDFILE
    report_dir = tempfile.mkdtemp(prefix="tenure-worker-")
    os.environ[WORKER_APP_ENV] = ns.broker
    os.environ[WORKER_REPORT_DIR_ENV] = report_dir
    ns.broker = "tenure_cli.worker:boot_worker"
    try:
        with metrics.serving(ns):  # before the worker processes start: they inherit its directory
            outcome = _supervise(ns)
        left = _read_shutdown_reports(report_dir)
    finally:
        shutil.rmtree(report_dir, ignore_errors=True)
        if ns.pid_file:
            dramatiq_cli.remove_pidfile(ns.pid_file, logging.getLogger("tenure.supervisor"))
    if outcome.signal == signal.SIGHUP:
        # Dramatiq's reload: every worker process stopped, start again from a fresh interpreter.
        os.execv(sys.executable, [sys.executable, "-m", "tenure_cli", "worker", *args])
    code = outcome.exit_code
    if left:
        print(
            f"tenure worker: {len(left)} message(s) were still running when the shutdown timeout "
            f"({ns.worker_shutdown_timeout} ms) ran out; they were left to their leases and will run again "
            f"on another worker: {', '.join(sorted(left))}",
            file=sys.stderr,
        )
        if code == 0:
            return EXIT_WORK_LEFT_TO_LEASES
    return code


def _supervise(ns: Any) -> Any:
    """Run the worker processes under a supervisor until it is stopped; its :class:`Outcome`."""
    import ctypes
    import importlib
    import multiprocessing

    from dramatiq import cli as dramatiq_cli
    from dramatiq.canteen import Canteen
    from dramatiq.compat import StreamablePipe, file_or_stderr

    from .supervisor import ChildSpec, Supervisor, log_to, restart_policy

    # Loaded once here, before the worker processes are forked, so that each starts with the job layer
    # (SQLAlchemy, Dramatiq: ~0.5 s of imports) already in memory: a quicker boot, and a quicker
    # replacement after a crash. Importing it does nothing else (no thread, connection or environment read:
    # tests/unit/test_tasks_import_side_effects.py), so nothing is shared with the forks but code. The app
    # itself is still imported in each worker process, as Dramatiq does.
    importlib.import_module("jobs")

    ctx = multiprocessing.get_context("fork")
    # Marked initialised: worker processes then never take its lock (a process SIGKILLed while holding
    # it would block every later boot). tenure worker runs no fork processes (boot_worker says so).
    canteen = ctx.Value(Canteen)
    canteen.initialized = True

    def launch(index: int) -> ChildSpec:
        reader, writer = ctx.Pipe(duplex=False)
        booted = ctx.Event()
        stopping = ctx.RawValue(ctypes.c_bool, False)

        def main() -> None:
            global _stopping
            _stopping = stopping
            dramatiq_cli.worker_process(ns, index, StreamablePipe(writer), canteen, booted)

        return ChildSpec(
            main=main,
            log_reader=reader,
            log_writer=writer,
            booted=booted.is_set,
            stopping=lambda: bool(stopping.value),
        )

    policy = restart_policy(ns)
    with file_or_stderr(ns.log_file) as out:
        if not ns.skip_logging:
            log_to(out, dramatiq_cli.VERBOSITY.get(ns.verbose, logging.DEBUG))
        logging.getLogger("tenure.supervisor").info(
            "Supervising %d %s process(es) of %s: a process that dies is replaced after %.2f s, doubling "
            "with each crash in a row up to %.0f s; a slot is given up after %d crashes in a row.",
            ns.processes,
            ns.role,
            os.environ[WORKER_APP_ENV],
            policy.backoff_s,
            policy.backoff_max_s,
            policy.max_crashes,
        )
        supervisor = Supervisor(
            ns.role,
            ns.processes,
            launch,
            policy,
            lambda: _slot_report(ns.role),
            out=out,
            boot_timeout_s=ns.worker_fork_timeout / 1000,
        )
        return supervisor.run()


def _slot_report(role: str) -> Any:
    from .slot_report import from_env

    return from_env(role)


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
    worker process twice: once directly and once passed on by the supervisor. The supervisor skips
    a process that already took it (this process sets :data:`_stopping`), but its copy can still
    arrive first, microseconds apart, or land during boot (it waits until the process has booted, as
    Dramatiq's main process did). Two things go wrong with a second SIGTERM. Dramatiq treats it as
    "kill now" (``sys.exit(1)`` in the middle of the graceful stop: no Worker stop, no broker close,
    acks lost, an unclean exit reported by the next start). And a handler re-entered while the first
    run of it holds a lock deadlocks the main thread (the SQLite broker's SIGTERM hook sets a
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
    forks = [f"{f.__module__}:{f.__name__}" for m in broker.middleware for f in m.forks]
    if forks:
        logging.getLogger("tenure.worker").warning(
            "tenure worker runs no fork processes; not started: %s (run `dramatiq` for them)", ", ".join(forks)
        )


def _shutdown_report(report_dir: str) -> Any:
    """A middleware that writes ``<report_dir>/<pid>.json`` when the Worker stops with messages still running."""
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
                    self._took_sigterm()
                return dramatiq_handler(signum, frame)

            signal.signal(signal.SIGTERM, during_boot)

        def _took_sigterm(self) -> None:
            self._sigterm_seen = True
            if _stopping is not None:
                _stopping.value = True

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
                self._took_sigterm()
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
