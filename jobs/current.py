"""The job running in this thread: set by the binding middleware, read by the kind's actor and by actors' helpers.

A kind's Dramatiq actor (declared by :meth:`jobs.registry.Registry.bind`) has no arguments: its body
runs whatever the binding middleware bound to this thread for the message — the claimed attempt's
:class:`~jobs.context.JobContext` and the runner that executes it (:mod:`jobs.execution.runner`). So
declaring a kind never imports the execution engine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_local = threading.local()


def current_job() -> Any:
    """The :class:`~jobs.context.JobContext` of the job running in this thread, if any."""
    return getattr(_local, "ctx", None)


def bind(ctx: Any, run: Callable[[Any], None]) -> None:
    """Make *ctx* this thread's job, executed by ``run(ctx)`` when its actor runs."""
    _local.ctx = ctx
    _local.run = run


def release() -> None:
    _local.ctx = None
    _local.run = None


def run_bound() -> None:
    """The body of every job actor: execute the attempt bound to this thread."""
    ctx, run = current_job(), getattr(_local, "run", None)
    if ctx is None or run is None:
        raise RuntimeError("a job actor ran without JobMiddleware on its broker (add jobs.JobMiddleware)")
    run(ctx)
