"""The ``tenure`` command line: ``tenure db upgrade`` and friends."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from typing import Any

#: ``tenure worker`` exits with this code (EX_TEMPFAIL) when, past ``--worker-shutdown-timeout``,
#: messages were still running: their leases were left to expire and they run again elsewhere.
EXIT_WORK_LEFT_TO_LEASES = 75
#: Set by ``tenure worker`` for its worker processes: the app (Dramatiq's broker argument) to load.
WORKER_APP_ENV = "TENURE_WORKER_APP"
#: Set by ``tenure worker`` for its worker processes: where each writes its shutdown report.
WORKER_REPORT_DIR_ENV = "TENURE_WORKER_REPORT_DIR"
#: A worker process ignores a second SIGTERM arriving this soon after the first (see _boot_worker).
DUPLICATE_SIGTERM_WINDOW_S = 2.0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        return _worker_command(argv[1:])
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
    relay = sub.add_parser("relay", help="publish the outbox to the broker (needed when it is not SQLite)")
    relay.add_argument("--app", help="module declaring the job kinds and the broker (e.g. tasks)")
    _add_users_parser(sub)
    _add_demo_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo_command(args)

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
        return _users_command(args, settings.database_url)
    if args.command == "relay":
        import importlib

        from jobs.outbox import relay_forever

        # Its start line and errors on stderr, as the other Procfile processes log theirs.
        logging.basicConfig(
            level=logging.INFO, format="[%(asctime)s] [PID %(process)d] [%(name)s] [%(levelname)s] %(message)s"
        )
        if args.app:
            importlib.import_module(args.app)
        try:
            relay_forever(settings)
        except SchemaMismatch as e:
            print(f"tenure: {e}", file=sys.stderr)
            return 1
        return 0
    return 2


def _worker_command(args: list[str]) -> int:
    """``tenure worker APP [dramatiq options]``: run Dramatiq's CLI, then say how the stop went.

    Everything is Dramatiq's own CLI (same arguments, same signals, same logs); two things are added.
    Each worker process loads *APP* through :func:`_boot_worker`, which adds a middleware that notes
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
    ns = parser.parse_args(args)
    report_dir = tempfile.mkdtemp(prefix="tenure-worker-")
    os.environ[WORKER_APP_ENV] = ns.broker
    os.environ[WORKER_REPORT_DIR_ENV] = report_dir
    ns.broker = "tenure_cli:_boot_worker"
    try:
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


def _boot_worker() -> None:
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

        # -- one stop per SIGTERM delivery (see _boot_worker) -------------------------------------
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


def _add_users_parser(sub: argparse._SubParsersAction) -> None:
    users = sub.add_parser("users", help="web app accounts")
    users_sub = users.add_subparsers(dest="users_command", required=True)
    create = users_sub.add_parser("create", help="create a user; prints a generated password once")
    create.add_argument("name")
    create.add_argument("--admin", action="store_true", help="role admin (default: user)")
    create.add_argument(
        "--password-stdin", action="store_true", help="read the password from stdin instead of generating one"
    )
    users_sub.add_parser("ensure-admin", help="create user 'admin' with a random password if no admin exists")
    reset = users_sub.add_parser(
        "set-password", help="give a user a new password (e.g. a lost admin password); prints a generated one once"
    )
    reset.add_argument("name")
    reset.add_argument(
        "--password-stdin", action="store_true", help="read the password from stdin instead of generating one"
    )


def _add_demo_parser(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="demo data")
    demo_sub = demo.add_subparsers(dest="demo_command", required=True)
    make = demo_sub.add_parser(
        "make-recording", help="write a synthetic live-stream recording folder (FLV segments + danmaku XML)"
    )
    make.add_argument("directory", help="folder to create (the files go directly into it)")
    make.add_argument("--segments", type=int, default=3, help="number of segments (default 3)")
    make.add_argument("--seconds", type=float, default=6.0, help="length of each segment (default 6)")
    make.add_argument(
        "--truncate", type=int, default=None, metavar="N", help="cut segment N as a crashed recorder would"
    )
    make.add_argument("--malformed-xml", type=int, default=None, metavar="N", help="cut segment N's danmaku XML")
    make.add_argument(
        "--room",
        type=int,
        default=23058,
        help="live room id (default 23058); a session is one room and start time, so give another room to "
        "import a second demo recording as a new session rather than an update of the first",
    )


def _demo_command(args: argparse.Namespace) -> int:
    """``tenure demo make-recording DIR``: test-pattern video, tone, speech and danmaku, with ffmpeg."""
    from tasks.domain.demo_recording import make_recording
    from tasks.domain.media.ffmpeg import FfmpegError, FfmpegNotFound

    if args.segments < 1 or args.seconds <= 0:
        print("tenure: --segments must be at least 1 and --seconds positive", file=sys.stderr)
        return 2
    try:
        made = make_recording(
            args.directory,
            segments=args.segments,
            seconds=args.seconds,
            truncate_segment=args.truncate,
            malformed_xml=args.malformed_xml,
            room_id=args.room,
        )
    except (FfmpegError, FfmpegNotFound) as exc:
        print(f"tenure: {exc}", file=sys.stderr)
        return 1
    for segment in made.segments:
        notes = [n for n, on in (("truncated", segment.truncated), ("malformed xml", segment.xml_malformed)) if on]
        print(
            f"{segment.flv.name}  {segment.written_duration_s:.2f} s{'  (' + ', '.join(notes) + ')' if notes else ''}"
        )
    print(f"recording of room {made.room_id} in {made.folder}")
    return 0


def _users_command(args: argparse.Namespace, database_url: str) -> int:
    """``tenure users …``: passwords are read from stdin or generated, never taken from argv."""
    from sqlalchemy import inspect

    from jobs import accounts
    from jobs.db import make_engine

    engine = make_engine(database_url)
    try:
        if not inspect(engine).has_table("users"):
            print("tenure: the database has no accounts tables yet; run `tenure db upgrade` first", file=sys.stderr)
            return 1
        if args.users_command == "ensure-admin":
            created = accounts.ensure_admin(engine)
            if created is None:
                print("an admin account exists")
                return 0
            user, password = created
            print(f"Created admin account {user.username!r} with password: {password}")
            print("Log in at the web app's /login page; this password is shown only once.")
            return 0
        password = sys.stdin.readline().rstrip("\n") if args.password_stdin else None
        if args.users_command == "set-password":
            return _set_password(engine, args.name, password)
        try:
            user, password = accounts.create_user(engine, args.name, password, role="admin" if args.admin else "user")
        except (accounts.AccountError, ValueError) as exc:
            print(f"tenure: {exc}", file=sys.stderr)
            return 1
        print(f"created {user.role} {user.username!r}")
        if not args.password_stdin:
            print(f"password (shown once): {password}")
        return 0
    finally:
        engine.dispose()


def _set_password(engine: Any, name: str, password: str | None) -> int:
    """``tenure users set-password NAME``: the typed password, or a generated one printed once."""
    from jobs import accounts

    user = accounts.get_user_by_name(engine, name)
    if user is None:
        print(f"tenure: no user named {name!r}", file=sys.stderr)
        return 1
    new = accounts.generate_password() if password is None else password
    try:
        accounts.set_password(engine, user.id, new)
    except (accounts.AccountError, ValueError) as exc:
        print(f"tenure: {exc}", file=sys.stderr)
        return 1
    print(f"password of {user.role} {user.username!r} changed")
    if password is None:
        print(f"password (shown once): {new}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
