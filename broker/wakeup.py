"""Waking idle consumers without busy polling.

In-process, consumers wait on one condition and a per-queue generation counter. Across processes,
each consumer process binds an abstract Unix datagram socket (Linux; nothing on disk to clean up)
and registers its address in ``broker_processes``; producers send the queue name to every live
listener after their enqueue commits. Nudges to the same listener and queue are coalesced to one
per :data:`NUDGE_COALESCE_S`; a consumer that goes idle right after a wake-up re-probes once after
:data:`IDLE_REPROBE_S`, which covers a message committed inside a coalesced window. Everything else
is covered by the consumer's bounded wait (Dramatiq's worker timeout, 1 s by default).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable

logger = logging.getLogger(__name__)

#: Minimum spacing of nudges sent to one listener for one queue, in seconds.
NUDGE_COALESCE_S = 0.001
#: After a wake-up, the first idle wait is this short so a coalesced nudge is never missed.
IDLE_REPROBE_S = 0.002
#: How often a producer refreshes its list of listeners from the database, in seconds.
LISTENER_REFRESH_S = 1.0


def namespace_for(path: str) -> str:
    """A short name shared by every process using the same database file."""
    return hashlib.sha1(os.path.realpath(path).encode()).hexdigest()[:12]


class LocalWaiters:
    """Per-queue generations behind one condition: waiters sleep until their queue changes."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation: dict[str, int] = {}

    def generation(self, queue: str) -> int:
        with self._cond:
            return self._generation.get(queue, 0)

    def notify(self, queues: Iterable[str]) -> None:
        with self._cond:
            for queue in queues:
                self._generation[queue] = self._generation.get(queue, 0) + 1
            self._cond.notify_all()

    def wait(self, queue: str, seen: int, timeout_s: float) -> bool:
        """Wait until *queue*'s generation moves past *seen*; False on timeout."""
        if timeout_s <= 0:
            return False
        with self._cond:
            return self._cond.wait_for(lambda: self._generation.get(queue, 0) != seen, timeout_s)


class Listener:
    """This process's wake socket; each datagram names a queue that got work."""

    def __init__(self, namespace: str, owner: str, on_wake: Callable[[list[str]], None]) -> None:
        self.address = f"@tenure/{namespace}/{owner}"
        self._on_wake = on_wake
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind("\0" + self.address[1:])
        self._sock.settimeout(0.5)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tenure-broker-wake", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                data = self._sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                if self._stopped.is_set():
                    return
                time.sleep(0.05)
                continue
            queues = [q for q in data.decode("utf-8", "replace").split("\n") if q]
            if queues:
                self._on_wake(queues)

    def close(self) -> None:
        self._stopped.set()
        try:
            self._sock.close()
        except OSError:
            pass


class Nudger:
    """Sends wake datagrams to the other consumer processes of this database."""

    def __init__(self, fetch_listeners: Callable[[], list[tuple[str, str]]], own_address: Callable[[], str | None]):
        self._fetch = fetch_listeners
        self._own = own_address
        self._lock = threading.Lock()
        self._listeners: list[tuple[str, frozenset[str]]] = []
        self._refreshed_at = 0.0
        self._last_sent: dict[tuple[str, str], float] = {}
        self._sock: socket.socket | None = None
        self._pid = os.getpid()

    def _socket(self) -> socket.socket:
        if self._sock is None or self._pid != os.getpid():
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
            self._pid = os.getpid()
            self._last_sent.clear()
        return self._sock

    def invalidate(self) -> None:
        self._refreshed_at = 0.0

    def nudge(self, queues: Iterable[str]) -> None:
        queues = set(queues)
        now = time.monotonic()
        with self._lock:
            if now - self._refreshed_at > LISTENER_REFRESH_S:
                try:
                    rows = self._fetch()
                except Exception:  # a failed refresh must never fail the enqueue that triggered it
                    logger.debug("Could not refresh wake listeners.", exc_info=True)
                    rows = None
                if rows is not None:
                    own = self._own()
                    self._listeners = [
                        (addr, frozenset(q for q in qs.split(",") if q)) for addr, qs in rows if addr != own
                    ]
                    self._refreshed_at = now
            targets = []
            for addr, listens in self._listeners:
                wanted = [q for q in queues if not listens or q in listens]
                due = [q for q in wanted if now - self._last_sent.get((addr, q), 0.0) >= NUDGE_COALESCE_S]
                for q in due:
                    self._last_sent[(addr, q)] = now
                if due:
                    targets.append((addr, due))
            sock = self._socket()
        for addr, due in targets:
            try:
                sock.sendto("\n".join(due).encode(), "\0" + addr[1:])
            except OSError as e:
                # EAGAIN: the listener's buffer is full, so it is awake anyway. ECONNREFUSED/ENOENT:
                # the process is gone; the reaper removes its row.
                if e.errno not in (errno.EAGAIN, errno.ECONNREFUSED, errno.ENOENT, errno.EWOULDBLOCK):
                    logger.debug("Wake nudge to %s failed: %s", addr, e)
