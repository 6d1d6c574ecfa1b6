"""gunicorn settings for Tenure's web process: ``gunicorn -c gunicorn.conf.py 'webapp:create_app()'``.

gthread: each live-feed connection (WebSocket or SSE) holds one thread for its lifetime, so the
per-process feed limit must stay below ``threads`` or live clients would starve plain requests.
Unless ``TENURE_WEB_LIVE_MAX_CONNECTIONS`` is set, it becomes ``threads - 8`` here (24 with the
default 32 threads). ``sync`` workers would be killed by the arbiter's timeout while a WebSocket is
open; gevent would block every greenlet on SQLite's C calls.

Everything is overridable from the environment: ``PORT`` (bind 127.0.0.1:$PORT unless
``TENURE_WEB_BIND`` is set), ``TENURE_WEB_WORKERS``, ``TENURE_WEB_THREADS``.
"""

from __future__ import annotations

import os

# Imported here, when the master starts: a hook that imports while the master stops can take seconds on a loaded
# machine (monitoring.exposition pulls in the job layer's database code), and honcho SIGKILLs a process type
# that is not gone 5 s after its SIGTERM.
from prometheus_client.multiprocess import mark_process_dead

bind = os.environ.get("TENURE_WEB_BIND") or f"127.0.0.1:{os.environ.get('PORT', '8000')}"
worker_class = "gthread"
workers = int(os.environ.get("TENURE_WEB_WORKERS", "2"))
threads = int(os.environ.get("TENURE_WEB_THREADS", "32"))
os.environ.setdefault("TENURE_WEB_LIVE_MAX_CONNECTIONS", str(max(1, threads - 8)))
#: A slow request (or a stuck one) is killed after this; live feeds write a heartbeat every 10 s.
timeout = 30
#: On SIGTERM: finish requests for this long, then drop connections. Live feeds do not count against it:
#: they end at their next poll (post_worker_init) and their clients reconnect with their cursor.
graceful_timeout = 10
keepalive = 5
#: Longest request line gunicorn accepts (its maximum; longer lines get gunicorn's own HTML 414).
limit_request_line = 8190
#: gunicorn ≥ 23 opens a shared control socket under ~/.gunicorn by default; several instances
#: (tests, honcho scale) would fight over it.
control_socket_disable = True
accesslog = "-"
# No query strings in the access log: nothing secret belongs there, but a careless client might try.
access_log_format = '%(h)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(M)sms'
errorlog = "-"
proxy_allow_ips = "127.0.0.1"


def child_exit(server, worker):  # type: ignore[no-untyped-def]
    """Drop the exited worker's live Prometheus gauges (multiprocess mode; its counters stay)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        mark_process_dead(worker.pid)


def post_fork(server, worker):  # type: ignore[no-untyped-def]
    """Count this web worker in ``tenure_web_workers`` (a live gauge: child_exit drops it again)."""
    try:
        from monitoring import metrics
    except ImportError:
        return
    metrics.WEB_WORKERS.inc()


def post_worker_init(worker):  # type: ignore[no-untyped-def]
    """Chain the live feed's shutdown to the worker's SIGTERM (installed by gunicorn just before): a live
    stream runs as long as its client stays, so without this a graceful shutdown (a deploy, ``make run``
    stopped with a browser tab open) would wait out ``graceful_timeout`` for each one."""
    import signal

    end_live_streams = getattr(worker.wsgi, "extensions", {}).get("tenure.end_live_streams")
    if end_live_streams is None:  # an app without Tenure's live feed
        return
    graceful_exit = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame):  # type: ignore[no-untyped-def]
        end_live_streams()
        graceful_exit(signum, frame)

    signal.signal(signal.SIGTERM, on_sigterm)
