"""The output-root write gate of the actors, its state shared by every worker process (in the job database).

``transcribe`` and ``render_clip`` write through :func:`gated_write`. The gate
(:mod:`tasks.domain.write_gate`) keeps its state in ``output_root_health`` (:class:`tasks.store.SQLGateStore`),
so once a root degrades in one worker every worker refuses fast with the cached error, without a
failed write of its own; one caller in all of them probes per cool-down; each transition is alerted
once in all. On recovery the jobs it refused meanwhile are run at once (:func:`jobs.run_now` clears
their backoff) instead of after their backoff. Readiness health reads the same table
(:func:`monitoring.store.degraded_output_roots`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from sqlalchemy import Engine

from jobs import JobContext, JobStatus, StaleAttempt, current_job, get_job, run_now

from .domain.control import DomainError
from .domain.write_gate import (
    DEFAULT_COOLDOWN_S,
    GateTransition,
    OutputRootDegraded,
    WriteGateRegistry,
    probe_write,
)
from .runtime import domain_engine, output_root, retry_in, task_settings
from .store import SQLGateStore

logger = logging.getLogger(__name__)

#: A job refused just before recovery may still be recording that refusal when the recovery runs; it
#: is queued (with its backoff) a moment later. Recovery looks again this often …
RELEASE_RETRY_S = 0.5
#: … this many times.
RELEASE_RETRIES = 6

_lock = threading.Lock()
_gates: tuple[int, WriteGateRegistry] | None = None


def output_gates() -> WriteGateRegistry:
    """This process's gates (one per root), on the shared store in the job database."""
    global _gates
    with _lock:
        if _gates is None or _gates[0] != os.getpid():
            cooldown = float(getattr(task_settings(), "write_gate_cooldown_s", DEFAULT_COOLDOWN_S))
            registry = WriteGateRegistry(
                cooldown_s=cooldown,
                clock=time.time,  # shared by processes: wall time, not a per-process monotonic clock
                alert=_alert,
                store=SQLGateStore(domain_engine()),
            )
            _gates = (os.getpid(), registry)
        return _gates[1]


def reset_for_tests() -> None:
    """Forget this process's gates (tests that change the database or the cool-down)."""
    global _gates
    with _lock:
        _gates = None


@contextmanager
def gated_write(ctx: JobContext) -> Iterator[None]:
    """Consult the output root's gate, run the block's writes, and report a root failure.

    A degraded root refuses at once with the cached error, and the job is retried after the next
    probe is due (or at once, if the root recovers first). A block that fails with an ``OSError``
    reports it; one that fails otherwise (an ffmpeg error says "No space left" only in its stderr)
    is followed by a real probe write, so a full or vanished root is noticed however the write failed.

    Raises:
      OutputRootDegraded: Refused, or this write degraded the root.
    """
    root = output_root(ctx)
    gate = output_gates().gate(root)
    try:
        gate.check(ctx.job_id)
    except OutputRootDegraded as exc:
        retry_in(ctx, exc.retry_in_s)
        raise
    try:
        yield
    except OSError as exc:
        if gate.report_failure(exc, ctx.job_id):
            retry_in(ctx, gate.cooldown_s)
        raise
    except DomainError:
        try:
            probe_write(root)
        except OSError as probe_exc:
            if gate.report_failure(probe_exc, ctx.job_id):
                retry_in(ctx, gate.cooldown_s)
        raise


def _alert(transition: GateTransition) -> None:
    """Once per transition, in the one process that made it: a log line, an event on the job that
    caused it, and on recovery the refused jobs run now."""
    if transition.state == "degraded":
        logger.error("ALERT output root %s is degraded: %s", transition.root, transition.error)
    else:
        logger.warning(
            "ALERT output root %s recovered after %.0f s; %d job(s) were refused meanwhile and run now",
            transition.root,
            transition.degraded_for_s or 0.0,
            len(transition.blocked_job_ids),
        )
    ctx = current_job()
    if ctx is not None:
        try:
            ctx.event(f"output_root_{transition.state}", root=str(transition.root), error=transition.error)
        except (StaleAttempt, OSError) as exc:
            logger.debug("could not record the gate transition on job %s: %s", ctx.job_id, exc)
    if transition.state == "healthy" and transition.blocked_job_ids:
        blocked = sorted(transition.blocked_job_ids - ({ctx.job_id} if ctx is not None else set()))
        _release(domain_engine(), blocked, RELEASE_RETRIES)


def _release(engine: Engine, job_ids: Iterable[str], retries: int) -> None:
    """Run the refused jobs now; look again shortly for those still recording their refusal."""
    job_ids = list(job_ids)
    try:
        released = set(run_now(engine, job_ids, by="write-gate"))
        pending = [j for j in job_ids if j not in released and _running(engine, j)]
    except Exception:  # recovery itself must not fail the probing job: the jobs still run after their backoff
        logger.warning("could not run the jobs the output root refused at once", exc_info=True)
        return
    if pending and retries > 0:
        timer = threading.Timer(RELEASE_RETRY_S, _release, (engine, pending, retries - 1))
        timer.daemon = True
        timer.start()


def _running(engine: Engine, job_id: str) -> bool:
    try:
        return get_job(engine, job_id, owner_id="", is_admin=True).status == JobStatus.RUNNING
    except Exception:
        return False
