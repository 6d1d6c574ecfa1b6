"""What :mod:`bench.jobs_peers` needs of each system: a :class:`System` (its name, how it is grouped in the ratios,
how to set it up once per run) deploys a :class:`Deployment` per round (a fresh store, the processes that stand by
it, its worker command, its store's counts), cleaned up when the round ends, however it ends.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psycopg

from bench.procs import REPO

#: How a system counts in the ratios: Tenure's default deployment, a Tenure fleet deployment, or a peer.
Group = Literal["tenure-default", "tenure-fleet", "peer"]

#: Where the benchmark keeps what it installs for itself (Oban's virtualenv); ``var/`` is gitignored.
VAR_DIR = REPO / "var" / "bench"


def venv_bin(name: str) -> str:
    """A console script of this interpreter's virtualenv (``tenure``, ``celery``, ``rq``, …)."""
    return str(Path(sys.executable).with_name(name))


@dataclass(frozen=True)
class Counts:
    """A system's jobs as its own store records them: *done* finished successfully; *other* anything else
    (state → count: queued, running, failed, missing, …)."""

    done: int
    other: dict[str, int] = field(default_factory=dict)

    def exactly(self, expected: int) -> bool:
        return self.done == expected and not any(self.other.values())


@dataclass(frozen=True)
class RoundContext:
    """One system's round: its scratch directory, the log its processes append to, names unique to the run."""

    run_id: str
    round: int
    workdir: Path
    log: Path

    @property
    def queue(self) -> str:
        """The queue name of this round (RabbitMQ keeps queues beyond a process: unique per run and round)."""
        return f"bench_peers_{self.run_id}_r{self.round}"

    def database_name(self, system: str) -> str:
        return f"bench_peers_{self.run_id}_{system.replace('-', '_')}_r{self.round}"


def base_env(**extra: str) -> dict[str, str]:
    """This process's environment without any ``TENURE_*`` or ``BENCH_PEERS_*`` setting the shell may carry,
    with the repository importable, plus *extra*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENURE_", "BENCH_PEERS_", "BENCH_TENURE_"))}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


class StoreReader:
    """One reading connection to a system's SQL store, opened at first use and kept (the benchmark polls it every
    few milliseconds at the end of a drain): PostgreSQL in autocommit, SQLite outside any transaction, so every
    query sees what is committed."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: Any = None

    def rows(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if self._conn is None:
            if self.url.startswith("sqlite:///"):
                self._conn = sqlite3.connect(self.url[len("sqlite:///") :], isolation_level=None)
            else:
                self._conn = psycopg.connect(self.url, autocommit=True)
        if isinstance(self._conn, sqlite3.Connection):
            return self._conn.execute(query.replace("%s", "?"), params).fetchall()
        return self._conn.execute(query, params).fetchall()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class Deployment(ABC):
    """One system's store and standing processes for one round."""

    #: The module under :mod:`bench.peers.apps` with the job and the producer.
    app: str
    #: The interpreter the producer runs in.
    python: str = sys.executable

    def __init__(self, env: dict[str, str]) -> None:
        #: The environment of the producer and of every worker command.
        self.env = env

    @abstractmethod
    def worker_commands(self, processes: int, threads: int) -> list[list[str]]:
        """The command lines that start *processes* worker processes of *threads* threads (or tasks) each."""

    def workers_started(self, processes: int, threads: int) -> int:
        """How many processes run jobs once those commands are up (each writes its own ledger file)."""
        return processes

    @abstractmethod
    def counts(self) -> Counts:
        """The jobs in the system's own store."""

    def submitted(self, ids: list[str]) -> None:
        """The ids the producer got back (kept only by stores that are checked job by job)."""
        return None

    def close(self) -> None:
        """Release what :meth:`counts` holds open (before the store is dropped)."""
        return None


class System(ABC):
    name: str
    label: str
    group: Group
    #: Keeps its jobs in PostgreSQL (the fleet's comparison is with the fastest of these peers).
    postgres: bool = False

    def prepare(self, log: Path) -> None:
        """Once per benchmark run, before the first round (e.g. install what the system needs)."""
        return None

    @abstractmethod
    def deploy(self, rc: RoundContext) -> contextlib.AbstractContextManager[Deployment]:
        """A fresh deployment for one round, torn down when the block ends."""
