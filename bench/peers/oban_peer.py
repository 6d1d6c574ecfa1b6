"""Oban for Python (PostgreSQL) in :mod:`bench.jobs_peers`.

Oban needs Python 3.12 or newer, so it gets its own virtualenv, ``var/bench/oban-venv``, made at the benchmark's
set-up (:meth:`Oban.prepare`: ``pip install 'oban>=0.7'`` from PyPI; kept for later runs) with the interpreter
``BENCH_OBAN_PYTHON`` names, else the first Python ≥ 3.12 found (``python3.13``, ``python3.12`` on ``PATH``, then
pyenv's versions). Its producer (:mod:`bench.peers.produce`) runs in that virtualenv too.

Each round: a fresh database, ``oban install``; per drain, one ``oban start --queues <queue>:8`` per worker
process; completion is a ``completed`` row in ``oban_jobs`` (Oban prunes them only after a day).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from bench import broker_bench

from . import services
from .processes import run_tool
from .system import VAR_DIR, Counts, Deployment, RoundContext, StoreReader, System, base_env

VENV = VAR_DIR / "oban-venv"
REQUIREMENT = "oban>=0.7"
MIN_PYTHON = (3, 12)


def _runs(python: str) -> bool:
    probe = f"import sys; sys.exit(0 if sys.version_info >= {MIN_PYTHON!r} else 1)"
    try:
        return subprocess.run([python, "-c", probe], capture_output=True, timeout=30).returncode == 0
    except OSError:
        return False


def find_python() -> str:
    """An interpreter for Oban's virtualenv (see the module's docstring).

    Raises:
      RuntimeError: None was found.
    """
    named = os.environ.get("BENCH_OBAN_PYTHON")
    if named:
        return named
    candidates = [shutil.which(n) for n in ("python3.13", "python3.12")]
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates += sorted(glob.glob(f"{root}/versions/3.1[2-9]*/bin/python"), reverse=True)
    for c in candidates:
        if c and _runs(c):
            return c
    raise RuntimeError("Oban for Python needs Python >= 3.12: set BENCH_OBAN_PYTHON to one")


class ObanDeployment(Deployment):
    app = "oban_app"
    python = str(VENV / "bin" / "python")

    def __init__(self, env: dict[str, str], dsn: str, queue: str) -> None:
        super().__init__(env)
        self.dsn = dsn
        self.store = StoreReader(dsn)
        self.queue = queue

    def worker_commands(self, processes: int, threads: int) -> list[list[str]]:
        cmd = [
            str(VENV / "bin" / "oban"),
            "start",
            "--dsn",
            self.dsn,
            "--queues",
            f"{self.queue}:{threads}",
            "--cron-modules",
            "bench.peers.apps.oban_app",
            "--log-level",
            "warning",
        ]
        return [cmd for _ in range(processes)]

    def counts(self) -> Counts:
        rows = dict(self.store.rows("SELECT state::text, count(*) FROM oban_jobs GROUP BY state"))
        return Counts(rows.pop("completed", 0), rows)

    def close(self) -> None:
        self.store.close()


class Oban(System):
    name = "oban"
    label = "Oban for Python (PostgreSQL)"
    group = "peer"
    postgres = True

    def prepare(self, log: Path) -> None:
        python = VENV / "bin" / "python"
        if python.exists() and subprocess.run([str(python), "-c", "import oban"], capture_output=True).returncode == 0:
            return
        python_for_venv = find_python()
        broker_bench.log(f"oban: making {VENV} with {python_for_venv} and installing {REQUIREMENT!r} (once)")
        with open(log, "ab") as out:
            subprocess.run([python_for_venv, "-m", "venv", "--clear", str(VENV)], check=True, stdout=out, stderr=out)
            subprocess.run([str(python), "-m", "pip", "install", "-q", REQUIREMENT], check=True, stdout=out, stderr=out)

    @contextlib.contextmanager
    def deploy(self, rc: RoundContext) -> Iterator[Deployment]:
        with services.postgres_database(rc.database_name(self.name)) as dsn:
            env = base_env(BENCH_PEERS_DSN=dsn, BENCH_PEERS_QUEUE=rc.queue)
            run_tool([str(VENV / "bin" / "oban"), "install", "--dsn", dsn], env, rc.log, rc.run_id)
            yield ObanDeployment(env, dsn, rc.queue)
