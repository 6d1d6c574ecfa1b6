"""Health checks: liveness (the process answers) and readiness (its dependencies answer).

The web app wires them to HTTP (``/api/health/live`` → :func:`live`, ``/api/health/ready`` →
:func:`ready`, with details for callers holding ``metrics.read``)::

    report = ready(standard_checks(broker=broker, database=jobs_db_check, output_dir=settings.output_dir,
                                   output_roots=lambda: degraded_output_roots(engine)))
    return report.to_dict(details=can("metrics.read")), report.http_status

A check is a callable that returns a short detail string (or ``None``) when the component is fine
and raises when it is not. Each runs in its own thread with a timeout, so a hung dependency makes
the probe fail in bounded time instead of hanging the load balancer's request.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Time one readiness check may take before it counts as failed, in seconds.
DEFAULT_CHECK_TIMEOUT_S = 2.0
#: Longest failure detail kept (errors may be long; they never carry payloads).
MAX_DETAIL_CHARS = 300

Check = Callable[[], str | None]


@dataclass(frozen=True)
class ComponentHealth:
    """The result of one check."""

    name: str
    ok: bool
    detail: str | None = None
    duration_ms: float = 0.0


@dataclass(frozen=True)
class HealthReport:
    """Overall status and the component results."""

    ok: bool
    components: tuple[ComponentHealth, ...] = field(default_factory=tuple)

    @property
    def status(self) -> str:
        return "ok" if self.ok else "fail"

    @property
    def http_status(self) -> int:
        return 200 if self.ok else 503

    def to_dict(self, *, details: bool = True) -> dict[str, Any]:
        """JSON-ready: ``{"status", "components": {name: {"status", "detail", "duration_ms"}}}``.

        With ``details=False`` (unauthenticated callers) only the statuses are included.
        """
        components: dict[str, Any] = {}
        for c in self.components:
            entry: dict[str, Any] = {"status": "ok" if c.ok else "fail"}
            if details:
                entry["detail"] = c.detail
                entry["duration_ms"] = round(c.duration_ms, 1)
            components[c.name] = entry
        return {"status": self.status, "components": components}


def live() -> HealthReport:
    """Liveness: the process runs and answers. Checks no dependency (a restart would not fix one)."""
    return HealthReport(True, (ComponentHealth("process", True, f"pid {os.getpid()}"),))


def ready(checks: Mapping[str, Check], *, timeout_s: float = DEFAULT_CHECK_TIMEOUT_S) -> HealthReport:
    """Readiness: run every check concurrently; ready when all pass within *timeout_s*.

    Parameters:
      checks: Component name → check (see :func:`standard_checks`).
      timeout_s: Time each check may take.

    Returns:
      The report, components in the order given.
    """
    runs = [_Run(name, check) for name, check in checks.items()]
    deadline = time.monotonic() + timeout_s
    for run in runs:
        run.done.wait(max(0.0, deadline - time.monotonic()))
    return HealthReport(all(r.result().ok for r in runs), tuple(r.result() for r in runs))


class _Run:
    def __init__(self, name: str, check: Check) -> None:
        self.name = name
        self.done = threading.Event()
        self._result: ComponentHealth | None = None
        self._started = time.perf_counter()
        threading.Thread(target=self._target, args=(check,), name=f"tenure-health-{name}", daemon=True).start()

    def _target(self, check: Check) -> None:
        try:
            detail = check()
            ok = True
        except Exception as e:  # the failure is the answer
            detail, ok = f"{type(e).__name__}: {e}"[:MAX_DETAIL_CHARS], False
        self._result = ComponentHealth(self.name, ok, detail, (time.perf_counter() - self._started) * 1000)
        self.done.set()

    def result(self) -> ComponentHealth:
        if self.done.is_set() and self._result is not None:
            return self._result
        elapsed = (time.perf_counter() - self._started) * 1000
        return ComponentHealth(self.name, False, "timed out", elapsed)


# -- checks ----------------------------------------------------------------------------------------


def broker_check(broker: Any) -> Check:
    """Reachability of any Dramatiq broker: SQLite (a read), Redis (PING), RabbitMQ (a connection)."""

    def check() -> str | None:
        store = getattr(broker, "store", None)
        if store is not None and hasattr(store, "read"):
            with store.read() as conn:
                conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone()
            return f"sqlite {store.target.path}"
        client = getattr(broker, "client", None)
        if client is not None and hasattr(client, "ping"):
            client.ping()
            return "redis"
        connection = getattr(broker, "connection", None)  # RabbitmqBroker opens one per thread
        if connection is not None and getattr(connection, "is_open", False):
            return "rabbitmq"
        raise RuntimeError(f"cannot check a {type(broker).__name__}")

    return check


def directory_writable_check(path: str | os.PathLike[str]) -> Check:
    """The directory exists and a file can be created in it (and is removed again)."""

    def check() -> str | None:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".tenure-health-", delete=True) as f:
            f.write(b"ok")
            f.flush()
        return str(path)

    return check


def output_roots_check(degraded: Callable[[], Mapping[str, str]]) -> Check:
    """No output root is degraded in the write gate's shared state (every worker refuses writes under
    a degraded root until a probe finds it writable again). *degraded* returns root → cached error."""

    def check() -> str | None:
        roots = degraded()
        if roots:
            raise RuntimeError(
                "; ".join(f"output root {root} is degraded: {error}" for root, error in sorted(roots.items()))
            )
        return "no output root is degraded"

    return check


def unclean_exits_check(listing: Callable[[], list[Mapping[str, Any]]]) -> Check:
    """Report worker processes that ended uncleanly and await an operator's acknowledgement, without
    failing: a past crash does not make this process unready (a supervised fleet replaced the dead
    process), so readiness never flaps to 503 for it. *listing* returns the broker's unclean exits."""

    def check() -> str | None:
        exits = listing()
        if not exits:
            return "no unclean exits"
        generations = ", ".join(f"{e['host']}/{e['pid']}" for e in exits[:10])
        more = f" and {len(exits) - 10} more" if len(exits) > 10 else ""
        return f"{len(exits)} unclean exit(s) awaiting acknowledgement: {generations}{more}"

    return check


def database_check(at_head: Callable[[], object]) -> Check:
    """Wrap the job layer's "database reachable and at the head revision" callable.

    *at_head* raises when the database is unreachable or not at head; a falsy return also fails.
    A string return becomes the detail (e.g. the revision).
    """

    def check() -> str | None:
        result = at_head()
        if result is False or result is None:
            raise RuntimeError("database is not at the head revision")
        return result if isinstance(result, str) else None

    return check


def database_at_head_check(engine: Any) -> Check:
    """Tenure's job database is reachable and at this code's head revision (``jobs.check_database_at_head``)."""
    from jobs import check_database_at_head

    return database_check(lambda: check_database_at_head(engine))


def standard_checks(
    *,
    broker: Any = None,
    database: Callable[[], object] | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    output_roots: Callable[[], Mapping[str, str]] | None = None,
    unclean_exits: Callable[[], list[Mapping[str, Any]]] | None = None,
) -> dict[str, Check]:
    """The readiness checks Tenure's web app runs; components not given are left out."""
    checks: dict[str, Check] = {}
    if database is not None:
        checks["database"] = database_check(database)
    if broker is not None:
        checks["broker"] = broker_check(broker)
    if output_dir is not None:
        checks["output_dir"] = directory_writable_check(output_dir)
    if output_roots is not None:
        checks["output_roots"] = output_roots_check(output_roots)
    if unclean_exits is not None:
        checks["unclean_exits"] = unclean_exits_check(unclean_exits)
    return checks
