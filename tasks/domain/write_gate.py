"""Output-root write gate: fail fast while an output directory is broken, probe it sparingly, alert per transition.

States per output root: ``healthy`` — writes go ahead; ``degraded`` — entered on the first write
failure that says the *root* is unusable (disk full, quota, read-only or vanished mount, permission
lost, I/O error). While degraded, :meth:`WriteGate.check` refuses at once with the cached error
instead of letting every job fail slowly; once per cool-down window (default 30 s) exactly one
caller is chosen to probe with a real write (create, write, fsync, delete a small file). A
successful probe returns the root to healthy and reports the job ids that were refused meanwhile,
so the job layer can clear their backoff and run them now. The ``alert`` callback runs once per
transition (healthy→degraded, degraded→healthy), never per job.

Scope: the state lives in a :class:`GateStore`. :class:`MemoryGateStore` (the default) shares it
between the threads of one process; a store in the database (``tasks.store.SQLGateStore``) shares it
between every worker process, so after the first failure anywhere every worker refuses fast, one
caller in all of them probes per window, and each transition is alerted once in all. Every store
operation that decides something is one atomic step (a conditional update): two processes can never
both win a transition or a probe. The probe runs on the chosen caller's thread: on a hung network
mount that caller blocks (the others keep being refused fast).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

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


@dataclass(frozen=True)
class GateRecord:
    """The stored state of one root (times come from the gate's clock)."""

    root: str
    state: GateState
    error: str | None = None
    degraded_since: float | None = None
    next_probe_at: float | None = None
    last_probe_at: float | None = None


class GateStore(Protocol):
    """Where the gates' state lives; each method is atomic (one transaction in a database)."""

    def gate_get(self, root: str) -> GateRecord | None:
        """The root's state (None: never degraded, i.e. healthy)."""
        ...

    def gate_degrade(self, root: str, error: str, now: float, next_probe_at: float, job_id: str | None) -> bool:
        """healthy → degraded (keeping an already degraded root's first error); *job_id*, if any, is
        remembered as blocked. Returns whether THIS call made the transition."""
        ...

    def gate_block(self, root: str, job_id: str) -> None:
        """Remember a job refused while the root is degraded."""
        ...

    def gate_claim_probe(self, root: str, now: float, next_probe_at: float) -> bool:
        """Whether this caller is the one prober of the window (degraded and the probe due)."""
        ...

    def gate_probe_failed(self, root: str, error: str, now: float) -> None:
        """The probe failed: the root stays degraded with this error cached."""
        ...

    def gate_recover(self, root: str, now: float) -> tuple[bool, frozenset[str], float | None]:
        """degraded → healthy: ``(this call made the transition, the blocked jobs (forgotten now),
        degraded since)``."""
        ...

    def gate_blocked(self, root: str) -> frozenset[str]:
        """Jobs refused since the root degraded."""
        ...

    def gate_degraded(self) -> dict[str, str]:
        """Every degraded root and its cached error."""
        ...


class MemoryGateStore:
    """A :class:`GateStore` for the threads of one process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, GateRecord] = {}
        self._blocked: dict[str, set[str]] = {}

    def gate_get(self, root: str) -> GateRecord | None:
        with self._lock:
            return self._records.get(root)

    def gate_degrade(self, root: str, error: str, now: float, next_probe_at: float, job_id: str | None) -> bool:
        with self._lock:
            if job_id is not None:
                self._blocked.setdefault(root, set()).add(job_id)
            current = self._records.get(root)
            if current is not None and current.state == "degraded":
                return False
            self._records[root] = GateRecord(root, "degraded", error, now, next_probe_at)
            return True

    def gate_block(self, root: str, job_id: str) -> None:
        with self._lock:
            self._blocked.setdefault(root, set()).add(job_id)

    def gate_claim_probe(self, root: str, now: float, next_probe_at: float) -> bool:
        with self._lock:
            current = self._records.get(root)
            if current is None or current.state != "degraded" or (current.next_probe_at or 0.0) > now:
                return False
            self._records[root] = dataclasses.replace(current, next_probe_at=next_probe_at, last_probe_at=now)
            return True

    def gate_probe_failed(self, root: str, error: str, now: float) -> None:
        with self._lock:
            current = self._records.get(root)
            if current is not None and current.state == "degraded":
                self._records[root] = dataclasses.replace(current, error=error)

    def gate_recover(self, root: str, now: float) -> tuple[bool, frozenset[str], float | None]:
        with self._lock:
            current = self._records.get(root)
            if current is None or current.state != "degraded":
                return False, frozenset(), None
            self._records[root] = GateRecord(root, "healthy", last_probe_at=current.last_probe_at)
            return True, frozenset(self._blocked.pop(root, set())), current.degraded_since

    def gate_blocked(self, root: str) -> frozenset[str]:
        with self._lock:
            return frozenset(self._blocked.get(root, set()))

    def gate_degraded(self) -> dict[str, str]:
        with self._lock:
            return {r.root: r.error or "" for r in self._records.values() if r.state == "degraded"}


class WriteGate:
    """The gate of one output root (thread-safe; shared by processes when its store is).

    Parameters
    ----------
    root:
        The output directory.
    cooldown_s:
        Minimum time between probes while degraded.
    clock:
        Time source; tests inject a fake one. A store shared by processes needs wall time
        (``time.time``), the same on every host.
    alert:
        Called once per transition (by the caller that made it), outside any lock.
    probe:
        ``probe(root)`` raising ``OSError`` on failure; :func:`probe_write` by default.
    store:
        Where the state lives (default: a private :class:`MemoryGateStore`).
    """

    def __init__(
        self,
        root: Path,
        *,
        cooldown_s: float = DEFAULT_COOLDOWN_S,
        clock: Callable[[], float] = time.monotonic,
        alert: Callable[[GateTransition], None] = lambda transition: None,
        probe: Callable[[Path], None] = probe_write,
        store: GateStore | None = None,
    ) -> None:
        self.root = root
        self.key = str(root)
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.alert = alert
        self.probe = probe
        self.store: GateStore = store if store is not None else MemoryGateStore()

    @property
    def state(self) -> GateState:
        record = self.store.gate_get(self.key)
        return "healthy" if record is None else record.state

    @property
    def error(self) -> str | None:
        """The cached error while degraded."""
        record = self.store.gate_get(self.key)
        return None if record is None or record.state != "degraded" else record.error

    @property
    def blocked_job_ids(self) -> frozenset[str]:
        return self.store.gate_blocked(self.key)

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
        record = self.store.gate_get(self.key)
        if record is None or record.state == "healthy":
            return
        now = self.clock()
        due = (record.next_probe_at or 0.0) <= now
        if not due or not self.store.gate_claim_probe(self.key, now, now + self.cooldown_s):
            # Another caller (in any process) probes this window; the next one opens at next_probe_at.
            raise self._refuse(job_id, record.error, (record.next_probe_at or now) - now)
        try:
            self.probe(self.root)
        except OSError as exc:
            error = describe_os_error(exc)
            self.store.gate_probe_failed(self.key, error, self.clock())
            raise self._refuse(job_id, error, self.cooldown_s) from None
        recovered, blocked, since = self.store.gate_recover(self.key, self.clock())
        if recovered:
            degraded_for = None if since is None else max(0.0, self.clock() - since)
            self.alert(GateTransition(self.root, "healthy", None, blocked, degraded_for))

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
        error = describe_os_error(exc)
        now = self.clock()
        if self.store.gate_degrade(self.key, error, now, now + self.cooldown_s, job_id):
            self.alert(GateTransition(self.root, "degraded", error, frozenset(), None))
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

    def _refuse(self, job_id: str | None, error: str | None, retry_in_s: float) -> OutputRootDegraded:
        if job_id is not None:
            self.store.gate_block(self.key, job_id)
        return OutputRootDegraded(self.root, error or "unknown error", max(0.0, retry_in_s))


class WriteGateRegistry:
    """One :class:`WriteGate` per output root, sharing clock, cool-down, alert and store."""

    def __init__(
        self,
        *,
        cooldown_s: float = DEFAULT_COOLDOWN_S,
        clock: Callable[[], float] = time.monotonic,
        alert: Callable[[GateTransition], None] = lambda transition: None,
        probe: Callable[[Path], None] = probe_write,
        store: GateStore | None = None,
    ) -> None:
        self.store: GateStore = store if store is not None else MemoryGateStore()
        self._kwargs = {"cooldown_s": cooldown_s, "clock": clock, "alert": alert, "probe": probe, "store": self.store}
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
        """Degraded roots and their cached errors, as the store knows them (for readiness health)."""
        return {Path(root): error for root, error in self.store.gate_degraded().items()}
