"""The Dramatiq middleware recording Tenure's process metrics.

Works with any Dramatiq broker (SQLiteBroker, RedisBroker, RabbitmqBroker): it only observes
Dramatiq's signals. With a :class:`broker.SQLiteBroker` it also exports the broker's per-process
lease counters (renewals, lost leases) through a small poller thread.

Outcomes are decided when the delivery is settled (``after_ack`` / ``after_nack``), because
Dramatiq emits ``after_*`` signals in reverse middleware order: when this middleware's
``after_process_message`` runs, Retries may not have decided yet whether to retry. At settlement:

- ``dead_lettered``: nacked (Retries exhausted, ``throws``, a middleware failed it);
- ``retried``: raised, and Retries re-enqueued it (its ``retries`` option grew);
- ``error``: raised, and acked without a retry (no Retries middleware, ``max_retries=0`` with
  Retries removed…);
- ``ok``: returned;
- ``skipped``: a middleware raised ``SkipMessage`` (counted when skipped, not again at the ack).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from dramatiq.common import current_millis, q_name
from dramatiq.middleware import Middleware

from . import metrics as m
from .logs import install_metrics_handler

logger = logging.getLogger(__name__)

#: How often the SQLite broker's lease counters are copied into the metrics, in seconds.
LEASE_POLL_INTERVAL_S = 1.0


@dataclass
class _Delivery:
    queue: str
    actor: str
    started: float
    retries_before: int
    skipped: bool = False
    finished: bool = False


class MetricsMiddleware(Middleware):
    """Records Tenure's process metrics from Dramatiq's signals.

    Add it last (``broker.add_middleware(MetricsMiddleware())``); the order does not change what
    it counts.

    Parameters:
      lease_poll_interval_s: How often the SQLite broker's lease counters are exported.
    """

    def __init__(self, *, lease_poll_interval_s: float = LEASE_POLL_INTERVAL_S) -> None:
        self.lease_poll_interval_s = lease_poll_interval_s
        self._lock = threading.Lock()
        self._deliveries: dict[int, _Delivery] = {}
        self._delayed_ids: set[str] = set()
        self._poller: _LeaseCounterPoller | None = None
        self._worker_threads = 0

    # -- enqueue -----------------------------------------------------------------------------------
    def before_delay_message(self, broker: Any, message: Any) -> None:
        # Redis/RabbitMQ: the worker later moves the message from "q.DQ" to "q" with another
        # enqueue; that move is not a new message.
        with self._lock:
            self._delayed_ids.add(message.message_id)

    def after_enqueue(self, broker: Any, message: Any, delay: int | None) -> None:
        if delay is None:
            with self._lock:
                if message.message_id in self._delayed_ids:
                    self._delayed_ids.discard(message.message_id)
                    return
        m.MESSAGES_ENQUEUED.labels(q_name(message.queue_name), message.actor_name).inc()

    # -- processing --------------------------------------------------------------------------------
    def before_process_message(self, broker: Any, message: Any) -> None:
        queue, actor = q_name(message.queue_name), message.actor_name
        now_ms = current_millis()
        wait_s = _queue_wait_s(message, now_ms)
        if wait_s is not None:
            m.MESSAGE_QUEUE_WAIT.labels(queue, actor).observe(wait_s)
        m.MESSAGES_IN_PROGRESS.labels(queue, actor).inc()
        with self._lock:
            self._deliveries[id(message)] = _Delivery(
                queue, actor, time.perf_counter(), int(message.options.get("retries", 0) or 0)
            )

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        self._finish(message)

    def after_skip_message(self, broker: Any, message: Any) -> None:
        with self._lock:
            delivery = self._deliveries.get(id(message))
        if delivery is None:  # skipped before this middleware's before_process_message ran
            delivery = _Delivery(q_name(message.queue_name), message.actor_name, time.perf_counter(), 0, finished=True)
            with self._lock:
                self._deliveries[id(message)] = delivery
        delivery.skipped = True
        self._finish(message)
        m.MESSAGES_PROCESSED.labels(delivery.queue, delivery.actor, "skipped").inc()

    def _finish(self, message: Any) -> None:
        with self._lock:
            delivery = self._deliveries.get(id(message))
        if delivery is None or delivery.finished:
            return
        delivery.finished = True
        m.MESSAGE_DURATION.labels(delivery.queue, delivery.actor).observe(time.perf_counter() - delivery.started)
        m.MESSAGES_IN_PROGRESS.labels(delivery.queue, delivery.actor).dec()

    # -- settlement --------------------------------------------------------------------------------
    def after_ack(self, broker: Any, message: Any) -> None:
        delivery = self._settle(message)
        if delivery is None or delivery.skipped:
            return
        if getattr(message, "_exception", None) is None:
            outcome = "ok"
        elif int(message.options.get("retries", 0) or 0) > delivery.retries_before:
            outcome = "retried"
        else:
            outcome = "error"
        m.MESSAGES_PROCESSED.labels(delivery.queue, delivery.actor, outcome).inc()

    def after_nack(self, broker: Any, message: Any) -> None:
        delivery = self._settle(message)
        if delivery is not None and delivery.skipped:
            return
        queue = delivery.queue if delivery else q_name(message.queue_name)
        actor = delivery.actor if delivery else message.actor_name
        m.MESSAGES_PROCESSED.labels(queue, actor, "dead_lettered").inc()

    def _settle(self, message: Any) -> _Delivery | None:
        with self._lock:
            delivery = self._deliveries.pop(id(message), None)
        if delivery is not None:
            self._finish_popped(delivery)
        return delivery

    @staticmethod
    def _finish_popped(delivery: _Delivery) -> None:
        # A delivery settled without after_process_message (a middleware's before_process_message
        # failed it): close its in-progress count here.
        if not delivery.finished:
            delivery.finished = True
            m.MESSAGES_IN_PROGRESS.labels(delivery.queue, delivery.actor).dec()

    # -- process lifecycle -------------------------------------------------------------------------
    def after_process_boot(self, broker: Any) -> None:
        # Job-level events (emitted by the job layer as log records) become metrics in this process.
        install_metrics_handler()

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        install_metrics_handler()
        self._worker_threads = int(getattr(worker, "worker_threads", 0) or 0)
        m.WORKER_PROCESSES.inc()
        m.WORKER_THREADS.inc(self._worker_threads)
        if _has_lease_counters(broker):
            self._poller = _LeaseCounterPoller(broker, self.lease_poll_interval_s)

    def before_worker_shutdown(self, broker: Any, worker: Any) -> None:
        m.WORKER_PROCESSES.dec()
        m.WORKER_THREADS.dec(self._worker_threads)

    def after_worker_shutdown(self, broker: Any, worker: Any) -> None:
        if self._poller is not None:
            self._poller.stop()
            self._poller = None


def _queue_wait_s(message: Any, now_ms: int) -> float | None:
    """Seconds from when the message became due to now, or ``None`` when that time is unknown.

    Due time: the broker's ``eta`` when the delivery carries one, else ``options["eta"]``, else the
    enqueue time (``message_timestamp``). A retried delivery without an eta is not observed: its
    enqueue time would count the retry backoff as waiting.
    """
    eta = getattr(message, "eta", None)
    if not isinstance(eta, int | float):
        eta = message.options.get("eta")
    if not isinstance(eta, int | float):
        if message.options.get("retries"):
            return None
        eta = message.message_timestamp
    return max(0.0, (now_ms - eta) / 1000)


def _has_lease_counters(broker: Any) -> bool:
    return hasattr(broker, "leases_lost")


class _LeaseCounterPoller:
    """Copies the SQLite broker's lease counters (plain ints) into Prometheus counters.

    The broker counts in-process (``broker.leases_lost``, ``broker._keeper.renewals``); this thread
    adds the increase since its last look every *interval_s*, and once more when stopped. A counter
    that went down (the keeper was recreated) is taken as restarted from zero.
    """

    def __init__(self, broker: Any, interval_s: float) -> None:
        self._broker = broker
        self._interval_s = interval_s
        self._last_lost = int(getattr(broker, "leases_lost", 0))
        self._last_renewals = 0
        self._last_keeper: Any = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tenure-metrics-leases", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            self.poll()

    def poll(self) -> None:
        try:
            lost = int(getattr(self._broker, "leases_lost", 0))
            if lost > self._last_lost:
                m.LEASES_LOST.inc(lost - self._last_lost)
            self._last_lost = lost
            keeper = getattr(self._broker, "_keeper", None)
            if keeper is None:
                return
            renewals = int(getattr(keeper, "renewals", 0))
            if keeper is not self._last_keeper:
                self._last_keeper, self._last_renewals = keeper, 0
            if renewals > self._last_renewals:
                m.LEASE_RENEWALS.inc(renewals - self._last_renewals)
            self._last_renewals = renewals
        except Exception:
            logger.debug("Could not read the broker's lease counters.", exc_info=True)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=2.0)
        self.poll()
