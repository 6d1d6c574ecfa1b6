"""Real worker processes for the actor tests: a migrated SQLite file, ``python -m dramatiq`` workers, a submitter.

Every test gets its own database and output root; every process it starts is stopped when it ends.
The test process submits jobs through a private registry that mirrors the real kinds onto a broker
on the test's file (the job and its message commit in one transaction, as in production).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

import jobs
from broker import SQLiteBroker
from jobs.db import make_engine
from jobs.registry import Registry
from jobs.registry import registry as global_registry
from jobs.schema import upgrade
from settings.environment import Settings
from tasks import import_recording, notify, pipeline, render_clip, transcribe  # noqa: F401  (the real kinds)
from tasks.domain.demo_recording import DemoRecording, make_recording

ROOT = Path(__file__).resolve().parents[3]
APP = "tests.acceptance.tasks.apps.worker:compose"
KINDS = ("import_recording", "transcribe", "render_clip", "notify_webhook", "notify_email", "recording_pipeline")
#: Queues of the general worker type (everything but ASR, which has its own process type).
MAIN_QUEUES = ("default", "render", "notify")
OWNER = "u1"


@pytest.fixture(scope="session")
def recording(tmp_path_factory: pytest.TempPathFactory) -> DemoRecording:
    """Three 6 s segments; segment 1 is a truncated FLV, segment 2 has a cut (malformed) danmaku XML."""
    folder = tmp_path_factory.mktemp("rec") / "23058-演示主播"
    return make_recording(folder, segments=3, seconds=6.0, truncate_segment=1, malformed_xml=2)


@dataclass
class Fleet:
    """One test's database, output root, worker processes and a way to submit and wait."""

    tmp: Path
    db: Path
    engine: Engine
    broker: SQLiteBroker
    registry: Registry
    settings: Settings
    env_extra: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    killed: set[str] = field(default_factory=set)

    @property
    def output_root(self) -> Path:
        return Path(self.settings.output_root)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
        url = f"sqlite:///{self.db}"
        env.update(
            TENURE_DATABASE_URL=url,
            TENURE_BROKER_URL=url,
            TENURE_OUTPUT_ROOT=str(self.output_root),
            TENURE_JOB_LEASE_TTL_S="4",
            TENURE_RECOVERY_INTERVAL_S="1",
            TENURE_ASR_THREADS="1",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.env_extra)
        env.update(extra)
        return env

    def worker(self, name: str, queues: tuple[str, ...] = MAIN_QUEUES, threads: int = 2, **env: str) -> int:
        """Start ``python -m dramatiq`` (one worker process) on *queues*; returns the main process's pid."""
        argv = [sys.executable, "-m", "dramatiq", APP, "--processes", "1", "--threads", str(threads)]
        argv += ["--queues", *queues]
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        self.procs[name] = subprocess.Popen(
            argv, cwd=ROOT, env=self.env(**env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        return self.procs[name].pid

    def asr_worker(self, name: str = "asr") -> int:
        """The ``asr`` process type: the asr queue only, one thread."""
        return self.worker(name, ("asr",), threads=1)

    def submit(self, kind: str, payload: dict[str, Any], *, owner_id: str = OWNER, **kwargs: Any) -> jobs.JobRecord:
        return jobs.submit(
            self.engine,
            owner_id=owner_id,
            kind=kind,
            payload=payload,
            registry=self.registry,
            settings=self.settings,
            **kwargs,
        )

    def job(self, job_id: str, owner_id: str = OWNER) -> jobs.JobRecord:
        return jobs.get_job(self.engine, job_id, owner_id=owner_id)

    def events(self, job_id: str) -> list[jobs.JobEventRecord]:
        return jobs.job_events(self.engine, job_id, owner_id=OWNER, limit=500)

    def event(self, job_id: str, type_: str) -> jobs.JobEventRecord | None:
        return next((e for e in self.events(job_id) if e.type == type_), None)

    def sql(self, statement: str, **params: Any) -> list[Any]:
        with self.engine.connect() as conn:
            rows = conn.execute(text(statement), params).fetchall()
            conn.rollback()
        return rows

    def wait(self, predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            for name, p in self.procs.items():
                if (
                    name not in self.killed
                    and p.poll() is not None
                    and p.returncode not in (-signal.SIGKILL, -signal.SIGTERM, 0)
                ):
                    raise AssertionError(f"worker {name} exited with {p.returncode}:\n{self.logs()}")
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out after {timeout_s}s waiting for {what}:\n{self.logs()}")
            time.sleep(0.1)

    def wait_terminal(self, job_id: str, timeout_s: float = 60, owner_id: str = OWNER) -> jobs.JobRecord:
        return self.wait(lambda: (j := self.job(job_id, owner_id)).terminal and j, timeout_s, f"job {job_id} to finish")

    def sigkill_worker_process(self, pid: int) -> str:
        """SIGKILL one worker process (a child of a started ``dramatiq``); returns which one it was.

        Dramatiq's main process then shuts down with exit code 1, which :meth:`wait` expects.
        """
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        name = next(n for n, p in self.procs.items() if p.pid == ppid)
        self.killed.add(name)
        os.kill(pid, signal.SIGKILL)
        return name

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}" for p in sorted(self.tmp.glob("*.log"))
        )

    def stop(self, name: str | None = None) -> None:
        """SIGTERM (then SIGKILL) the named worker, or all of them, and reap them."""
        targets = [self.procs[name]] if name else list(self.procs.values())
        for p in targets:
            if p.poll() is None:
                # Only the dramatiq main process: it forwards SIGTERM to its workers. Signalling the whole
                # group too would give each worker a second SIGTERM, which Dramatiq treats as "kill now".
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in targets:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def mirror_kinds(broker: SQLiteBroker) -> Registry:
    """The real kinds (same functions and policies) declared on *broker*, in a private registry."""
    reg = Registry()
    for name in KINDS:
        k = global_registry.get(name)
        if k.workflow:  # no actor: submitting it creates the workflow, whose steps are the kinds above
            reg.workflow(k.name)(k.fn)
            continue
        reg.kind(
            k.name,
            queue=k.queue,
            safe_to_rerun=k.safe_to_rerun,
            backoff=k.backoff,
            never_retry=k.never_retry,
            max_attempts=k.max_attempts,
            timeout_s=k.timeout_s,
            broker=broker,
        )(k.fn)
    return reg


@pytest.fixture()
def fleet(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    db = tmp_path / "tenure.db"
    url = f"sqlite:///{db}"
    upgrade(url)
    broker = SQLiteBroker(url, middleware=[])
    engine = make_engine(url)
    settings = Settings(database_url=url, broker_url=url, output_root=str(tmp_path / "outputs"))
    # The recordings live in pytest's temporary folders (the session's and each test's): the import root.
    imports = {"TENURE_IMPORT_ROOTS": str(tmp_path_factory.getbasetemp())}
    f = Fleet(tmp_path, db, engine, broker, mirror_kinds(broker), settings, env_extra=imports)
    try:
        yield f
    finally:
        f.stop()
        broker.close()
        engine.dispose()


def worker_pid(job: jobs.JobRecord, fleet: Fleet) -> int:
    """The pid of the process running *job* (from its worker id ``host:pid:nonce``)."""
    [(worker_id,)] = fleet.sql("SELECT worker_id FROM jobs WHERE id = :id", id=job.id)
    return int(worker_id.split(":")[1])


def ffmpeg_alive(pid: int) -> bool:
    """Whether *pid* is a live (non-zombie) ffmpeg process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return "ffmpeg" in stat and stat.rsplit(")", 1)[1].split()[0] != "Z"
