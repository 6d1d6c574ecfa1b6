"""This process's side of job execution: its engine, its worker identity, the attempts it is running.

A worker id is ``host:pid:random``: unique per process (a forked child gets its own), and it names the
host in every lease, event and report. Everything here is recreated after a fork.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from typing import Any

from dramatiq.broker import Broker
from sqlalchemy import Engine

from settings.environment import Settings, current_settings

from .. import db
from ..publish import same_sqlite_file
from ..registry import Registry
from ..registry import registry as default_registry


class _Process:
    """This process's id, refreshed after a fork (read on every message: cheaper than a syscall)."""

    pid = os.getpid()

    @classmethod
    def refresh(cls) -> None:
        cls.pid = os.getpid()


os.register_at_fork(after_in_child=_Process.refresh)


class WorkerState:
    """The execution state of one worker process (see the module docstring).

    Parameters:
      settings: Lease TTL, recovery interval, database URL (default: this process's settings).
      engine: The job database (default: one made from ``settings.database_url`` in each process).
      registry: The kinds this worker can run (default: :data:`jobs.registry.registry`).
    """

    def __init__(
        self, settings: Settings | None = None, *, engine: Engine | None = None, registry: Registry | None = None
    ):
        self.settings = settings or current_settings()
        self.registry = registry or default_registry
        self.lease_ttl_ms = int(self.settings.job_lease_ttl_s * 1000)
        self._given_engine = engine
        self._engine: Engine | None = None
        self._pid = -1
        self._worker_id = ""
        self._lock = threading.Lock()
        self._running: dict[int, Any] = {}
        self._ack_file: dict[int, bool] = {}
        #: The broker this process's jobs run on (set by the binding middleware at boot or first message).
        self.broker: Broker | None = None

    def _ensure_process(self) -> None:
        if self._pid == _Process.pid:
            return
        with self._lock:
            if self._pid == _Process.pid:
                return
            if self._given_engine is not None:
                self._engine = self._given_engine
            else:
                self._engine = db.make_engine(
                    self.settings.database_url, busy_timeout_ms=self.settings.sqlite_busy_timeout_ms
                )
            self._worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
            self._running = {}
            self._pid = _Process.pid

    @property
    def engine(self) -> Engine:
        self._ensure_process()
        assert self._engine is not None
        return self._engine

    @property
    def worker_id(self) -> str:
        self._ensure_process()
        return self._worker_id

    # -- the attempts running in this process (heartbeats, timeouts, progress) -------------------
    def track(self, ctx: Any) -> None:
        with self._lock:
            self._running[id(ctx)] = ctx

    def untrack(self, ctx: Any) -> None:
        with self._lock:
            self._running.pop(id(ctx), None)

    def running(self) -> list[Any]:
        with self._lock:
            return list(self._running.values())

    def acks_in_job_file(self, broker: Broker) -> bool:
        """Whether *broker*'s acks commit in the job database (a SQLiteBroker on the same file)."""
        same = self._ack_file.get(id(broker))
        if same is None:
            same = False
            if db.fast_sqlite(self.engine):
                with self.engine.connect() as conn:
                    same = same_sqlite_file(conn, broker)
            self._ack_file[id(broker)] = same
        return same
