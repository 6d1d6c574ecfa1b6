"""What a supervisor tells operators besides its log: Prometheus metrics and the Workers page's rows.

:class:`SlotReport` is the :class:`~tenure_cli.supervisor.Report` of ``tenure worker``, ``tenure
scheduler`` and ``tenure relay``:

- metrics (:mod:`monitoring.metrics`): ``tenure_worker_restarts_total{role, slot}`` counts each
  replacement process, ``tenure_worker_slots_given_up{role}`` the slots given up;
- the ``worker_slots`` rows of this supervisor in the job database (:mod:`monitoring.store`), which the
  Workers page of every web process reads: rewritten on every crash, restart and give-up and every
  :data:`~monitoring.store.WORKER_SLOT_HEARTBEAT_S`, deleted at the stop.

Reporting never stops supervision: a database write that fails (locked for more than
:data:`WRITE_TIMEOUT_S`, unreachable) is logged once and done again at the next change or
heartbeat. A job database that does not exist yet or has no ``worker_slots`` table (not migrated) is
not written to at all; the supervisor then reports through its log and metrics only.

This module loads the job layer (SQLAlchemy, the settings, the store: a CPU-second), so supervisors
make their report once their first children have been forked (they boot meanwhile); replacements
forked later inherit it loaded. No connection is kept open across a fork (``NullPool``), and every
database call is bounded in time (:data:`WRITE_TIMEOUT_S`): a slow database cannot hold up a
restart for long.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, inspect
from sqlalchemy.pool import NullPool

from jobs.db import make_engine, sqlite_path, write
from monitoring import metrics
from monitoring import store as slot_store
from settings.environment import Settings, SettingsError

from .supervisor import GIVEN_UP, Slot

logger = logging.getLogger("tenure.supervisor")

#: How long a supervisor's connect, lock wait or statement may take (the loop must stay responsive).
WRITE_TIMEOUT_S = 2


def _ms(t: float | None) -> int | None:
    return None if t is None else int(t * 1000)


def from_env(role: str) -> SlotReport:
    """The report of a supervisor of *role*, writing to the job database of ``TENURE_DATABASE_URL``."""
    try:
        url: str | None = Settings.from_env().database_url
    except SettingsError as e:
        logger.warning("Slot states are not written to the job database: %s", e)
        url = None
    return SlotReport(role, url)


class SlotReport:
    """Metrics and ``worker_slots`` rows for one supervisor.

    Parameters:
      role: The supervisor's role (the ``role`` label and column).
      database_url: The job database; None: metrics only.
    """

    beat_interval_s = slot_store.WORKER_SLOT_HEARTBEAT_S

    def __init__(self, role: str, database_url: str | None) -> None:
        self.role = role
        self.host = socket.gethostname()
        self.supervisor = f"{self.host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.started_at = time.time()
        self._url = database_url
        self._slots: Sequence[Slot] = ()
        self._engine: Engine | None = None
        self._failing = False

    def _open(self, url: str | None) -> Engine | None:
        if url is None:
            return None
        path = sqlite_path(url)
        if path is not None and not os.path.exists(path):
            logger.info("No job database at %s yet: slot states are reported in the log and metrics only.", path)
            return None
        if path is not None:
            engine = make_engine(url, busy_timeout_ms=WRITE_TIMEOUT_S * 1000, poolclass=NullPool)
        else:
            ms = WRITE_TIMEOUT_S * 1000
            limits = {"connect_timeout": WRITE_TIMEOUT_S, "options": f"-c statement_timeout={ms} -c lock_timeout={ms}"}
            engine = make_engine(url, poolclass=NullPool, connect_args=limits)
        try:
            migrated = inspect(engine).has_table("worker_slots")
        except Exception as e:  # unreachable now: the writes log it and try again
            logger.warning("Could not inspect the job database (%s); will try to write slot states.", e)
            return engine
        if not migrated:
            logger.warning(
                "The job database has no worker_slots table (run `tenure db upgrade`): slot states are "
                "reported in the log and metrics only."
            )
            engine.dispose()
            return None
        return engine

    # -- Report ---------------------------------------------------------------------------------------

    def started(self, slots: Sequence[Slot]) -> None:
        self._slots = slots
        metrics.declare_worker_slots(self.role, len(slots))
        self._engine = self._open(self._url)
        self._write(prune=True)

    def crashed(self, slot: Slot) -> None:
        self._write()

    def restarted(self, slot: Slot) -> None:
        metrics.record_worker_restart(self.role, slot.index)
        self._write()

    def given_up(self, slot: Slot) -> None:
        metrics.record_worker_slots_given_up(self.role, sum(1 for s in self._slots if s.state == GIVEN_UP))
        self._write()

    def beat(self) -> None:
        self._write()

    def stopped(self) -> None:
        if self._engine is None:
            return
        try:
            with write(self._engine) as tx:
                slot_store.worker_slots_delete(tx.conn, self.supervisor)
        except Exception as e:
            logger.warning("Could not remove this supervisor's slot states from the job database: %s", e)
        self._engine.dispose()

    # -- the rows -------------------------------------------------------------------------------------

    def _rows(self, now_ms: int) -> list[dict[str, Any]]:
        return [
            {
                "supervisor": self.supervisor,
                "slot": s.index,
                "host": self.host,
                "supervisor_pid": os.getpid(),
                "role": self.role,
                "state": s.state,
                "pid": s.pid,
                "restarts": s.restarts,
                "crashes": s.crashes,
                "last_exit": s.last_exit,
                "last_exit_at": _ms(s.last_exit_at),
                "restart_at": _ms(s.restart_at),
                "started_at": _ms(self.started_at),
                "heartbeat_at": now_ms,
            }
            for s in self._slots
        ]

    def _write(self, *, prune: bool = False) -> None:
        if self._engine is None:
            return
        now_ms = int(time.time() * 1000)
        try:
            with write(self._engine) as tx:
                if prune:
                    slot_store.worker_slots_prune(tx.conn, now_ms)
                slot_store.worker_slots_write(tx.conn, self.supervisor, self._rows(now_ms))
        except Exception as e:
            if not self._failing:
                logger.warning("Could not write slot states to the job database (will retry): %s", e)
            self._failing = True
            return
        if self._failing:
            logger.info("Slot states are written to the job database again.")
        self._failing = False
