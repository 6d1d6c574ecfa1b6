"""The ``/metrics`` response, and the bookkeeping of prometheus-client's multiprocess directory.

Multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set in the environment of *every* Tenure process
before it starts): each process writes ``{type}_{pid}.db`` mmap files; a scrape merges them.

- The launcher calls :func:`prepare_multiproc_dir` once, before any process starts (stale files
  from an earlier run would otherwise add their totals to this one).
- gunicorn's ``child_exit`` hook calls :func:`mark_dead` for the worker that exited.
- Every scrape also calls :func:`reap_dead_processes`: live-gauge files (``gauge_live*_{pid}.db``)
  whose pid no longer runs (a SIGKILLed Dramatiq worker, which no hook sees) are removed, so its
  in-progress gauge disappears; its counter and histogram files stay, so totals never go down.

The web app mounts the endpoint in one line, e.g. with Flask::

    app.add_url_rule("/metrics", "metrics", lambda: Response(*render_metrics(sources)))

or mounts :func:`make_wsgi_app` with werkzeug's ``DispatcherMiddleware``.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from . import metrics
from .collectors import DatabaseCollector, Source

logger = logging.getLogger(__name__)

#: The environment variable prometheus-client reads at import time.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_LIVE_FILE = re.compile(r"^gauge_live[a-z]+_(\d+)\.db$")


def multiproc_dir() -> str | None:
    """The multiprocess directory of this process's environment, or ``None`` (single-process mode)."""
    return os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower()) or None


def prepare_multiproc_dir(path: str | os.PathLike[str]) -> Path:
    """Create *path* empty (removing every file of an earlier run). Call before any process starts.

    Parameters:
      path: The directory every process will get as ``PROMETHEUS_MULTIPROC_DIR``.

    Returns:
      The directory, created if missing.
    """
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return directory


def mark_dead(pid: int, path: str | os.PathLike[str] | None = None) -> None:
    """Forget the live gauges of a process that exited (gunicorn ``child_exit``, a dead worker).

    Counters and histograms of *pid* are kept, so totals survive the process.
    """
    directory = path if path is not None else multiproc_dir()
    if directory:
        mark_process_dead(pid, str(directory))


def pid_alive(pid: int) -> bool:
    """Whether *pid* is a running (not zombie) process of this host's pid namespace."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            # "pid (comm) state …" — comm may contain spaces and parentheses, so split after the last ")".
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc: trust kill(0)


def reap_dead_processes(
    path: str | os.PathLike[str] | None = None, *, alive: Callable[[int], bool] = pid_alive
) -> list[int]:
    """Remove the live-gauge files of processes that no longer run; the pids reaped.

    Only correct when every process writing to the directory shares this process's pid namespace
    (one host, one container). Pass ``reap_dead=False`` to :func:`render_metrics` otherwise.
    """
    directory = path if path is not None else multiproc_dir()
    if not directory:
        return []
    dead: set[int] = set()
    for name in os.listdir(directory):
        match = _LIVE_FILE.match(name)
        if match and int(match.group(1)) not in dead and not alive(int(match.group(1))):
            dead.add(int(match.group(1)))
    for pid in sorted(dead):
        mark_process_dead(pid, str(directory))
        logger.info("Removed the live gauges of dead process %d.", pid)
    return sorted(dead)


class _ProcessRegistry:
    """This process's own metrics (single-process mode), as a collector of the scrape registry."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        return metrics.REGISTRY.collect()


def build_registry(
    sources: Sequence[Source] = (),
    *,
    path: str | os.PathLike[str] | None = None,
    reap_dead: bool = True,
    processes: bool = True,
) -> CollectorRegistry:
    """A fresh registry for one scrape: every process's metrics plus the scrape-time sources.

    Parameters:
      sources: Scrape-time sources (see :func:`monitoring.collectors.default_sources`).
      path: Multiprocess directory; default ``$PROMETHEUS_MULTIPROC_DIR``. Without one, this
        process's own metrics are exported (single-process mode).
      reap_dead: Remove the live gauges of dead pids first (see :func:`reap_dead_processes`).
      processes: Include the processes' metrics (``False``: the scrape-time sources only).
    """
    registry = CollectorRegistry()
    directory = str(path) if path is not None else multiproc_dir()
    if processes and directory:
        if reap_dead:
            reap_dead_processes(directory)
        MultiProcessCollector(registry, path=directory)
    elif processes:
        registry.register(_ProcessRegistry())
    if sources:
        registry.register(DatabaseCollector(sources))
    return registry


def render_metrics(
    sources: Sequence[Source] = (),
    *,
    path: str | os.PathLike[str] | None = None,
    reap_dead: bool = True,
    processes: bool = True,
) -> tuple[bytes, int, dict[str, str]]:
    """The ``/metrics`` response: ``(body, status, headers)`` in Prometheus' text format.

    Unpacks straight into a Flask ``Response(*render_metrics(sources))`` or a view's return value.
    Parameters as :func:`build_registry`.
    """
    body = generate_latest(build_registry(sources, path=path, reap_dead=reap_dead, processes=processes))
    return body, 200, {"Content-Type": CONTENT_TYPE_LATEST}


def make_wsgi_app(
    sources: Sequence[Source] | Callable[[], Sequence[Source]] = (), *, reap_dead: bool = True
) -> Callable[..., Iterable[bytes]]:
    """A WSGI app answering every GET with :func:`render_metrics`.

    Parameters:
      sources: The sources, or a callable returning them (called once, on the first request, so a
        forking server builds them in each worker after the fork).
    """
    built: list[Sequence[Source]] = []

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
            return [b""]
        if not built:
            built.append(sources() if callable(sources) else sources)
        body, _, headers = render_metrics(built[0], reap_dead=reap_dead)
        start_response("200 OK", [*headers.items(), ("Content-Length", str(len(body)))])
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]

    return app


def live_gauge_pids(path: str | os.PathLike[str] | None = None) -> list[int]:
    """Pids that currently have live-gauge files (for tests and diagnostics)."""
    directory = path if path is not None else multiproc_dir()
    if not directory:
        return []
    names = (os.path.basename(f) for f in glob.glob(os.path.join(directory, "gauge_live*_*.db")))
    return sorted({int(mt.group(1)) for n in names if (mt := _LIVE_FILE.match(n))})
