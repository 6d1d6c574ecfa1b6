"""Keep N child processes running: replace one that dies, give up on a slot that keeps crashing.

``tenure worker`` (Dramatiq worker processes), ``tenure scheduler`` (periodiq) and ``tenure relay``
(the outbox relay) run their work in the children of a :class:`Supervisor`, one child per *slot*.
The supervisor is a single-threaded loop, like gunicorn's arbiter: it forks each child with the stop
signals blocked, then waits on the children's process sentinels, their log pipes and a pipe its
signal handler writes to, with a timeout set by the next restart that is due. Being single-threaded,
it can fork a replacement at any time without a lock held by another thread ending up in the child.

- A child that exits while no stop was asked for has **crashed** (SIGKILL, an OOM kill, a segfault,
  ``os._exit``, an exception at boot, even exit code 0): its slot is restarted after a backoff that
  doubles with each consecutive crash (:class:`RestartPolicy`); a child that ran for the policy's
  window before crashing starts a new streak. After ``max_crashes`` consecutive crashes the slot is
  **given up**: no more restarts, an error logged and reported; the other slots run on, and so
  does the supervisor, until it is stopped (:attr:`Outcome.exit_code` then says so).
- **SIGTERM**, **SIGINT** (passed on as SIGTERM) and **SIGHUP** stop it: nothing is restarted any
  more, every such signal is passed on to each child, and :meth:`Supervisor.run` returns once every
  child has exited. The signal handler passes it on at once to a child that has booted; a child still
  booting gets it once it is ready (as from Dramatiq's CLI: a worker process can take a stop only
  once its handlers are in place). The *first* stop is not passed on to a child that says it is
  already stopping (:attr:`ChildSpec.stopping`): the signal was sent to the whole process group
  (honcho, Ctrl-C, ``kill -TERM -PGID``), and a second copy would be a "kill now" to a worker process.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, NoReturn, Protocol, TextIO

logger = logging.getLogger("tenure.supervisor")

#: The signals that stop a supervisor (SIGINT is passed on to the children as SIGTERM).
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
#: A slot is given up after this many crashes in a row.
DEFAULT_MAX_CRASHES = 10
#: A child that ran at least this long before it crashed starts a new streak (its crash counts as the first).
DEFAULT_CRASH_WINDOW_MS = 60_000
#: The wait before the restart after a first crash; it doubles with each further crash in a row.
DEFAULT_RESTART_BACKOFF_MS = 500
#: The longest wait between a crash and the restart.
DEFAULT_RESTART_BACKOFF_MAX_MS = 30_000
#: A stop signal waits at most this long for a child to boot (Dramatiq's ``--worker-fork-timeout``).
DEFAULT_BOOT_TIMEOUT_S = 30.0
#: Once every child has exited, how long their log pipes are still read (a grandchild may hold one open).
LOG_DRAIN_S = 1.0
#: While a child is booting, how often the supervisor looks whether it has become ready.
BOOT_POLL_S = 0.05

RUNNING = "running"
RESTARTING = "restarting"
GIVEN_UP = "given_up"
STOPPED = "stopped"


@dataclass(frozen=True)
class RestartPolicy:
    """When a crashed child is replaced, and when its slot is given up."""

    max_crashes: int = DEFAULT_MAX_CRASHES
    window_s: float = DEFAULT_CRASH_WINDOW_MS / 1000
    backoff_s: float = DEFAULT_RESTART_BACKOFF_MS / 1000
    backoff_max_s: float = DEFAULT_RESTART_BACKOFF_MAX_MS / 1000

    def delay_s(self, crashes: int) -> float:
        """The wait before the restart that follows the *crashes*-th crash in a row (1, 2, …)."""
        return min(self.backoff_max_s, self.backoff_s * 2 ** (crashes - 1))


def _yes() -> bool:
    return True


def _no() -> bool:
    return False


@dataclass
class ChildSpec:
    """What the next child of a slot runs (a :data:`Launch` builds one for every start).

    ``main`` runs in the forked child with the stop signals still blocked and their handlers reset
    to the defaults: it unblocks them once its own handlers are in place.
    """

    main: Callable[[], object]
    #: The supervisor's end of a pipe the child logs through (read and copied to the supervisor's output).
    log_reader: Connection | None = None
    #: The child's end of that pipe (closed in the supervisor once the child is forked).
    log_writer: Connection | None = None
    #: Whether the child is ready to take a stop signal (called by the loop, never by the signal handler).
    booted: Callable[[], bool] = _yes
    #: Whether the child has already been told to stop, by a signal of its own (called by the signal handler:
    #: it must only read memory, e.g. a shared ``multiprocessing.RawValue`` the child sets).
    stopping: Callable[[], bool] = _no


#: Builds the spec of slot *index*'s next child.
Launch = Callable[[int], ChildSpec]


@dataclass
class Slot:
    """One slot of a supervisor: its state as the reports show it (Unix times in seconds)."""

    index: int
    state: str = RUNNING
    pid: int | None = None
    #: Replacement children started in this slot.
    restarts: int = 0
    #: Crashes in a row.
    crashes: int = 0
    last_exit: str | None = None
    last_exit_at: float | None = None
    restart_at: float | None = None
    _process: BaseProcess | None = field(default=None, repr=False)
    _spec: ChildSpec | None = field(default=None, repr=False)
    #: Set by the loop once ``_spec.booted()``: the signal handler then passes stops on at once.
    _ready: bool = field(default=False, repr=False)
    _started_mono: float = field(default=0.0, repr=False)
    _restart_mono: float | None = field(default=None, repr=False)
    #: Stop signals held for the loop to send (the child was still booting).
    _pending: list[int] = field(default_factory=list, repr=False)


class Report(Protocol):
    """Where a supervisor reports its slots besides its log (metrics, the Workers page)."""

    #: How often :meth:`beat` is called, in seconds.
    beat_interval_s: float

    def started(self, slots: Sequence[Slot]) -> None: ...

    def crashed(self, slot: Slot) -> None: ...

    def restarted(self, slot: Slot) -> None: ...

    def given_up(self, slot: Slot) -> None: ...

    def beat(self) -> None: ...

    def stopped(self) -> None: ...


@dataclass(frozen=True)
class Outcome:
    """How a supervisor's run ended."""

    #: The first stop signal received.
    signal: int | None
    #: Exit codes of the children that exited during the stop (0 for one ended by the signal passed on).
    stop_codes: tuple[int, ...]
    #: The slots given up on.
    given_up: tuple[int, ...]

    @property
    def exit_code(self) -> int:
        """Dramatiq's rule (the first non-zero code; killed by a signal: 1), else 1 if a slot was given up."""
        for code in self.stop_codes:
            if code:
                return 1 if code < 0 else code
        return 1 if self.given_up else 0


def describe_exit(code: int) -> str:
    """``killed by SIGKILL`` / ``exited with code 1`` for a process's exit code (negative: a signal)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class Supervisor:
    """Run *slots* children built by *launch*, replace those that crash (see the module docstring).

    Parameters:
      role: The name of what the children are, in log lines and reports (``worker``, ``scheduler``…).
      slots: How many children run at once.
      launch: Builds the spec of a slot's next child (called in the supervisor before each fork).
      policy: Restart backoff and crash cap.
      report: Makes the report, which is told about every start, crash, restart and give-up and beaten
        periodically; called once the first children have been forked (a report may load slowly).
      out: Where the children's log pipes are copied to.
      boot_timeout_s: A stop signal waits for a child to boot at most this long (then it is sent anyway).
    """

    def __init__(
        self,
        role: str,
        slots: int,
        launch: Launch,
        policy: RestartPolicy,
        report: Callable[[], Report],
        *,
        out: TextIO | None = None,
        boot_timeout_s: float = DEFAULT_BOOT_TIMEOUT_S,
    ) -> None:
        if slots < 1:
            raise ValueError("a supervisor needs at least one slot")
        self.role = role
        self.slots = [Slot(i) for i in range(slots)]
        self.launch = launch
        self.policy = policy
        self._make_report = report
        self.report: Report | None = None
        self.out = out or sys.stderr
        self.boot_timeout_s = boot_timeout_s
        self._ctx = multiprocessing.get_context("fork")
        #: Stop signals the handler received, for the loop to log (SIGINT already turned into SIGTERM).
        self._received: list[int] = []
        self._stop_signal: int | None = None
        self._sent: set[int] = set()
        self._stop_codes: list[int] = []
        self._logs: list[Connection] = []
        self._wake_r = self._wake_w = -1

    # -- the loop -------------------------------------------------------------------------------------

    def run(self) -> Outcome:
        """Start every slot, supervise until stopped, return once every child has exited."""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        try:
            for slot in self.slots:
                if self._stop_signal is None:
                    self._start(slot)
                else:  # stopped while starting
                    slot.state = STOPPED
            report = self.report = self._make_report()
            report.started(self.slots)
            next_beat = time.monotonic() + report.beat_interval_s
            drain_until: float | None = None
            while True:
                now = time.monotonic()
                if self._stop_signal is not None and not any(s._process for s in self.slots):
                    drain_until = drain_until or now + LOG_DRAIN_S
                    if not self._logs or now >= drain_until:
                        break
                timeout = self._timeout(now, next_beat, drain_until)
                ready = wait([self._wake_r, *self._logs, *self._sentinels()], timeout)
                self._copy_logs(ready)
                self._reap()
                self._take_signals()
                self._restart_due()
                if time.monotonic() >= next_beat:
                    report.beat()
                    next_beat = time.monotonic() + report.beat_interval_s
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for conn in self._logs:
                conn.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
            if self.report is not None:
                self.report.stopped()
        return Outcome(
            self._stop_signal, tuple(self._stop_codes), tuple(s.index for s in self.slots if s.state == GIVEN_UP)
        )

    def _reported(self) -> Report:
        assert self.report is not None, "crashes are seen in the loop, after the report was made"
        return self.report

    def _sentinels(self) -> list[int]:
        return [s._process.sentinel for s in self.slots if s._process is not None]

    def _timeout(self, now: float, next_beat: float, drain_until: float | None) -> float:
        due = [next_beat] + [s._restart_mono for s in self.slots if s._restart_mono is not None]
        if drain_until is not None:
            due.append(drain_until)
        if any(s._process is not None and not s._ready for s in self.slots):
            due.append(now + BOOT_POLL_S)
        return max(0.0, min(due) - now)

    # -- signals --------------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Runs between any two bytecodes of the loop: only plain reads and writes, os calls, no logging.
        passed_on = signal.SIGTERM if signum == signal.SIGINT else signum
        first = self._stop_signal is None
        if first:
            self._stop_signal = signum
        self._sent.add(passed_on)
        for slot in self.slots:
            if slot._process is not None:
                if slot._ready:
                    self._pass_on(slot, passed_on, first)
                else:
                    slot._pending.append(passed_on)
        self._received.append(passed_on)
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # the loop has enough wake-ups pending

    def _pass_on(self, slot: Slot, sig: int, first: bool) -> None:
        assert slot._spec is not None and slot.pid is not None
        if first and slot._spec.stopping():
            return  # it got this very stop from the process group already
        try:
            os.kill(slot.pid, sig)
        except ProcessLookupError:
            pass  # it has just exited; the loop reaps it

    def _take_signals(self) -> None:
        """In the loop: log the signals the handler received, hand pending ones to children now ready."""
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass
        while self._received:
            logger.info("Sending signal %r to subprocesses...", signal.Signals(self._received.pop(0)).name)
        if self._stop_signal is not None:
            for slot in self.slots:
                if slot.state == RESTARTING:  # nothing is restarted during a stop
                    slot.state, slot._restart_mono, slot.restart_at = STOPPED, None, None
        for slot in self.slots:
            if slot._process is None or slot._ready or slot._spec is None:
                continue
            if slot._spec.booted() or time.monotonic() - slot._started_mono >= self.boot_timeout_s:
                # The handler sends directly from now on; what it held back goes now (swap: it may append).
                pending, slot._pending = slot._pending, []
                slot._ready = True
                for i, sig in enumerate(pending):
                    # the child was there for every stop signal, so the first one held is the first stop
                    self._pass_on(slot, sig, first=i == 0)

    # -- children -------------------------------------------------------------------------------------

    def _start(self, slot: Slot) -> None:
        spec = self.launch(slot.index)
        # Blocked across the fork: the child must not run this supervisor's handler before its own exist.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            process = self._ctx.Process(
                target=self._child_main, args=(spec,), name=f"{self.role}-{slot.index}", daemon=False
            )
            process.start()
            slot.state, slot.pid, slot._process, slot._spec = RUNNING, process.pid, process, spec
            slot._ready, slot._pending, slot._started_mono = False, [], time.monotonic()
        except BaseException:
            if spec.log_reader is not None:
                spec.log_reader.close()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            if spec.log_writer is not None:
                spec.log_writer.close()
        if spec.log_reader is not None:
            self._logs.append(spec.log_reader)

    def _child_main(self, spec: ChildSpec) -> None:
        """In the forked child: drop the supervisor's descriptors and handlers, then run the child."""
        os.close(self._wake_r)
        os.close(self._wake_w)
        for conn in self._logs:
            conn.close()
        if spec.log_reader is not None:
            spec.log_reader.close()
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        spec.main()

    def _copy_logs(self, ready: list[Any]) -> None:
        for conn in [c for c in ready if isinstance(c, Connection)]:
            try:
                while conn.poll():
                    self.out.write(conn.recv_bytes().decode("utf-8", errors="replace"))
            except (EOFError, OSError):
                conn.close()
                self._logs.remove(conn)
            self.out.flush()

    def _reap(self) -> None:
        for slot in self.slots:
            process = slot._process
            if process is None or process.exitcode is None:
                continue
            code = process.exitcode
            pid = slot.pid
            slot._process, slot.pid, slot._spec, slot._pending = None, None, None, []
            process.close()
            if self._stop_signal is not None:
                slot.state = STOPPED
                self._stop_codes.append(0 if code < 0 and -code in self._sent else code)
            else:
                self._crashed(slot, pid, describe_exit(code), code == -signal.SIGKILL)

    def _crashed(self, slot: Slot, pid: int | None, how: str, sigkill: bool = False) -> None:
        now = time.monotonic()
        if now - slot._started_mono >= self.policy.window_s:
            slot.crashes = 0
        slot.crashes += 1
        slot.last_exit, slot.last_exit_at = how, time.time()
        hint = ", perhaps out of memory" if sigkill else ""
        if slot.crashes >= self.policy.max_crashes:
            slot.state = GIVEN_UP
            logger.error(
                "%s process %d (PID %s) exited unexpectedly (%s%s): %d crashes in a row, so the slot is given up "
                "and not restarted any more; the other slots run on.",
                self.role,
                slot.index,
                pid,
                how,
                hint,
                slot.crashes,
            )
            self._reported().given_up(slot)
            return
        delay = self.policy.delay_s(slot.crashes)
        slot.state, slot._restart_mono, slot.restart_at = RESTARTING, now + delay, time.time() + delay
        logger.error(
            "%s process %d (PID %s) exited unexpectedly (%s%s); restarting it in %.2f s (crash %d in a row; "
            "given up at %d).",
            self.role,
            slot.index,
            pid,
            how,
            hint,
            delay,
            slot.crashes,
            self.policy.max_crashes,
        )
        self._reported().crashed(slot)

    def _restart_due(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if self._stop_signal is not None:
                return
            if slot.state != RESTARTING or slot._restart_mono is None or slot._restart_mono > now:
                continue
            slot._restart_mono, slot.restart_at = None, None
            try:
                self._start(slot)
            except OSError as e:  # fork failed (out of memory, process limit): a crash of this slot too
                self._crashed(slot, None, f"could not be started ({e})")
                continue
            slot.restarts += 1
            logger.info(
                "%s process %d restarted as PID %d (restart %d).", self.role, slot.index, slot.pid, slot.restarts
            )
            self._reported().restarted(slot)


# -- command-line options shared by the supervised commands ---------------------------------------------

_ROLE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


def _role(value: str) -> str:
    if not _ROLE.match(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a role name (a lower-case letter, then up to 31 of a-z, 0-9, '_', '-')"
        )
    return value


def _ms(minimum: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            ms = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if ms < minimum:
            raise argparse.ArgumentTypeError(f"{value!r} is below the minimum of {minimum}")
        return ms

    return parse


def add_supervision_arguments(parser: argparse.ArgumentParser, *, role: str) -> None:
    """The ``--role`` and restart options of ``tenure worker``, ``tenure scheduler`` and ``tenure relay``."""
    group = parser.add_argument_group("supervision (a child process that dies is replaced)")
    group.add_argument(
        "--role",
        type=_role,
        default=role,
        help="this process type's name in logs, the metrics' role label and the Workers page (default: %(default)s)",
    )
    group.add_argument(
        "--max-crashes",
        type=_ms(1),
        default=DEFAULT_MAX_CRASHES,
        metavar="N",
        help="give a slot up after N crashes in a row (default: %(default)s)",
    )
    group.add_argument(
        "--crash-window-ms",
        type=_ms(0),
        default=DEFAULT_CRASH_WINDOW_MS,
        metavar="MS",
        help="a process that ran this long before crashing starts a new streak (default: %(default)s)",
    )
    group.add_argument(
        "--restart-backoff-ms",
        type=_ms(0),
        default=DEFAULT_RESTART_BACKOFF_MS,
        metavar="MS",
        help="wait before restarting after a first crash; doubles with each crash in a row (default: %(default)s)",
    )
    group.add_argument(
        "--restart-backoff-max-ms",
        type=_ms(0),
        default=DEFAULT_RESTART_BACKOFF_MAX_MS,
        metavar="MS",
        help="the longest wait before a restart (default: %(default)s)",
    )


def restart_policy(ns: argparse.Namespace) -> RestartPolicy:
    """The :class:`RestartPolicy` of options parsed with :func:`add_supervision_arguments`."""
    return RestartPolicy(
        max_crashes=ns.max_crashes,
        window_s=ns.crash_window_ms / 1000,
        backoff_s=ns.restart_backoff_ms / 1000,
        backoff_max_s=max(ns.restart_backoff_ms, ns.restart_backoff_max_ms) / 1000,
    )


def log_to(stream: TextIO, level: int) -> None:
    """Send the supervisor's own log lines to *stream* in Dramatiq's format (its children log on their own)."""
    from dramatiq.cli import LOGFORMAT

    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(LOGFORMAT))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def exit_now(code: int) -> NoReturn:
    """End a supervisor process without Python's finalization, once its children are gone.

    Finalizing the modules it loaded (the job layer, SQLAlchemy) takes seconds on a busy machine,
    time taken out of a process manager's kill timeout (honcho's 5 s); nothing is left to clean up.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def unblock_in_child() -> None:
    """In a child without stop handlers of its own: Ctrl-C reaches it through the supervisor (as
    SIGTERM), whose default action ends it; then let the stop signals in."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def supervise_one(ns: argparse.Namespace, main: Callable[[], object]) -> int:
    """Run *main* in one supervised child (options of :func:`add_supervision_arguments`); the exit code.

    For loops that need no drain (the scheduler, the relay): SIGTERM ends the child at once.
    """
    from .slot_report import from_env

    log_to(sys.stderr, logging.INFO)
    supervisor = Supervisor(
        ns.role, 1, lambda index: ChildSpec(main=main), restart_policy(ns), lambda: from_env(ns.role)
    )
    return supervisor.run().exit_code
