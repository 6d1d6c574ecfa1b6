"""Output-root write gate: fail fast while an output directory is broken, probe it sparingly, alert per transition.

States per output root: ``healthy`` — writes go ahead; ``degraded`` — entered on the first write
failure that says the *root* is unusable (disk full, quota, read-only or vanished mount, permission
lost, I/O error). While degraded, :meth:`WriteGate.check` refuses at once with the cached error
instead of letting every job fail slowly; once per cool-down window (default 30 s) exactly one
caller is chosen to probe with a real write (create, write, fsync, delete a small file). A
successful probe returns the root to healthy and reports the job ids that were refused meanwhile,
so the job layer can clear their backoff and run them now. The ``alert`` callback runs once per
transition (healthy→degraded, degraded→healthy), never per job.

Scope: the state is per process (one :class:`WriteGate` per root in a :class:`WriteGateRegistry`,
thread-safe). With N worker processes a broken root is detected, probed and alerted by each of them
(at most N alerts per transition); sharing the state through the job database is left to the job
layer. The probe runs on the chosen caller's thread: on a hung network mount that caller blocks
(the others keep being refused fast).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .control import DomainError

#: Seconds between probes of a degraded root.
DEFAULT_COOLDOWN_S = 30.0
#: Bytes the probe writes: more than one page, so a full file system cannot absorb it in slack space.
PROBE_BYTES = 16 * 1024
#: errno values that mean the output root itself is unusable (not just this one file name).
ROOT_FAILURE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.ENOTCONN, errno.ESTALE}
    | {errno.ENODEV, errno.ENXIO, errno.ENOENT}
)

GateState = Literal["healthy", "degraded"]


class OutputRootDegraded(DomainError):
    """The output root is degraded; the job was refused without trying (the message is the cached error)."""

    def __init__(self, root: Path, error: str, retry_in_s: float) -> None:
        super().__init__(f"output root {root} is degraded: {error} (next probe in {retry_in_s:.0f} s)")
        self.root = root
        self.error = error
        self.retry_in_s = retry_in_s


@dataclass(frozen=True)
class GateTransition:
    """What the alert callback receives, once per state change."""

    root: Path
    state: GateState  # the new state
    error: str | None  # why it degraded (None on recovery)
    blocked_job_ids: frozenset[str]  # on recovery: the jobs refused while degraded
    degraded_for_s: float | None  # on recovery: how long it was degraded


def describe_os_error(exc: OSError) -> str:
    """A short, path-free description (``ENOSPC: No space left on device``)."""
    name = errno.errorcode.get(exc.errno or 0, "EUNKNOWN")
    return f"{name}: {exc.strerror or exc}"


def is_root_failure(exc: BaseException, root: Path) -> bool:
    """Whether a write error means the root is unusable rather than one bad file name.

    Parameters
    ----------
    exc:
        The error a write raised.
    root:
        The output root the write was under.

    Returns
    -------
    bool
        True for the errnos in :data:`ROOT_FAILURE_ERRNOS` — ``ENOENT`` only when the root itself is gone.
    """
    if not isinstance(exc, OSError) or exc.errno not in ROOT_FAILURE_ERRNOS:
        return False
    if exc.errno == errno.ENOENT:
        return not root.is_dir()
    return True


def probe_write(root: Path) -> None:
    """Prove the root is writable with a real write: create, write :data:`PROBE_BYTES`, fsync, delete.

    Parameters
    ----------
    root:
        The output root.

    Raises
    ------
    OSError
        Whatever the file system says.
    """
    path = root / f".tenure-write-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"\0" * PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            path.unlink()


class WriteGate:
    """The gate of one output root (thread-safe, per process).

    Parameters
    ----------
    root:
        The output directory.
    cooldown_s:
        Minimum time between probes while degraded.
    clock:
        Monotonic time source; tests inject a fake one.
    alert:
        Called once per transition, outside the gate's lock.
    probe:
        ``probe(root)`` raising ``OSError`` on failure; :func:`probe_write` by default.
    """

    def __init__(
        self,
        root: Path,
        *,
        cooldown_s: float = DEFAULT_COOLDOWN_S,
        clock: Callable[[], float] = time.monotonic,
        alert: Callable[[GateTransition], None] = lambda transition: None,
        probe: Callable[[Path], None] = probe_write,
    ) -> None:
        self.root = root
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.alert = alert
        self.probe = probe
        self._lock = threading.Lock()
        self._state: GateState = "healthy"
        self._error: str | None = None
        self._since = 0.0
        self._next_probe_at = 0.0
        self._probing = False
        self._blocked: set[str] = set()

    @property
    def state(self) -> GateState:
        return self._state

    @property
    def error(self) -> str | None:
        """The cached error while degraded."""
        return self._error

    @property
    def blocked_job_ids(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._blocked)

    def check(self, job_id: str | None = None) -> None:
        """Let a job write, refuse it fast, or — once per cool-down — probe the root on this caller.

        Parameters
        ----------
        job_id:
            The asking job, remembered when refused so recovery can report it.

        Raises
        ------
        OutputRootDegraded
            The root is degraded (and this caller did not probe it back to health).
        """
        with self._lock:
            if self._state == "healthy":
                return
            now = self.clock()
            if self._probing or now < self._next_probe_at:
                raise self._refuse(job_id, now)
            self._probing = True  # this caller is the one prober of the window
            self._next_probe_at = now + self.cooldown_s
        try:
            self.probe(self.root)
        except OSError as exc:
            with self._lock:
                self._probing = False
                self._error = describe_os_error(exc)
                raise self._refuse(job_id, self.clock()) from None
        except BaseException:
            with self._lock:
                self._probing = False
            raise
        with self._lock:
            self._probing = False
            transition = GateTransition(
                self.root, "healthy", None, frozenset(self._blocked), self.clock() - self._since
            )
            self._state, self._error = "healthy", None
            self._blocked.clear()
        self.alert(transition)

    def report_failure(self, exc: BaseException, job_id: str | None = None) -> bool:
        """Tell the gate a write under the root failed.

        Parameters
        ----------
        exc:
            The error.
        job_id:
            The job whose write failed.

        Returns
        -------
        bool
            True when the error marks the root degraded (or it already was); False for errors
            that concern only that file.
        """
        if not is_root_failure(exc, self.root):
            return False
        assert isinstance(exc, OSError)
        transition = None
        with self._lock:
            if job_id is not None:
                self._blocked.add(job_id)
            if self._state == "healthy":
                now = self.clock()
                self._state, self._error, self._since = "degraded", describe_os_error(exc), now
                self._next_probe_at = now + self.cooldown_s
                transition = GateTransition(self.root, "degraded", self._error, frozenset(), None)
        if transition is not None:
            self.alert(transition)
        return True

    @contextlib.contextmanager
    def guard(self, job_id: str | None = None) -> Iterator[None]:
        """``check()``, run the block, and report a root failure if the block's write raises.

        Parameters
        ----------
        job_id:
            The writing job.

        Raises
        ------
        OutputRootDegraded
            Refused up front.
        OSError
            The block's own error, re-raised after it was reported.
        """
        self.check(job_id)
        try:
            yield
        except OSError as exc:
            self.report_failure(exc, job_id)
            raise

    def _refuse(self, job_id: str | None, now: float) -> OutputRootDegraded:
        if job_id is not None:
            self._blocked.add(job_id)
        return OutputRootDegraded(self.root, self._error or "unknown error", max(0.0, self._next_probe_at - now))


class WriteGateRegistry:
    """One :class:`WriteGate` per output root in this process, sharing clock, cool-down and alert."""

    def __init__(
        self,
        *,
        cooldown_s: float = DEFAULT_COOLDOWN_S,
        clock: Callable[[], float] = time.monotonic,
        alert: Callable[[GateTransition], None] = lambda transition: None,
        probe: Callable[[Path], None] = probe_write,
    ) -> None:
        self._kwargs = {"cooldown_s": cooldown_s, "clock": clock, "alert": alert, "probe": probe}
        self._gates: dict[Path, WriteGate] = {}
        self._lock = threading.Lock()

    def gate(self, root: Path) -> WriteGate:
        """The gate for ``root`` (created on first use; keyed by the absolute path)."""
        key = Path(os.path.abspath(root))
        with self._lock:
            if key not in self._gates:
                self._gates[key] = WriteGate(key, **self._kwargs)  # type: ignore[arg-type]
            return self._gates[key]

    def degraded(self) -> dict[Path, str]:
        """Degraded roots and their cached errors (for the readiness health check)."""
        with self._lock:
            gates = list(self._gates.values())
        return {g.root: g.error or "" for g in gates if g.state == "degraded"}
