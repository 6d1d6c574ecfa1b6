"""Traces across processes: a job submitted over HTTP to a real gunicorn and run by a real ``tenure worker``
is ONE trace — the request, the submit, and on the worker the delivery, the claim, the actor's run and
the transaction that committed the outcome — received by an OTLP/HTTP receiver in the test from both
processes' real exporters (``TENURE_TRACING=1``, ``OTEL_EXPORTER_OTLP_ENDPOINT``). A retry's second
attempt, a workflow's steps, an actor's own ``result_transaction`` and its httpx request join the same
trace; no span carries the payload.

Two deployments: one SQLite file (jobs and messages in one transaction; a success commits with its
message's ack), and PostgreSQL + RabbitMQ (a private vhost; the message goes through the outbox and a
real ``tenure relay``).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.operations.support import Proc, Procs, processes, wait_for
from tests.acceptance.operations.web import free_port

from .otlp_receiver import ReceivedSpan, Receiver, otlp_receiver

APP = "tests.acceptance.tracing.trace_app:compose"
#: Put in every payload: it must appear in no span (attributes name jobs, never their payloads).
SECRET = "payload-secret-9f3b"
pytestmark = pytest.mark.xdist_group("tracing")


@dataclass
class Deployment:
    backend: str
    http: httpx.Client
    token: str
    receiver: Receiver
    procs: Procs
    env: dict[str, str]

    def submit(self, kind: str, **headers: str) -> str:
        response = self.http.post(
            "/api/v1/jobs",
            json={"kind": kind, "payload": {"text": SECRET}},
            headers={"Authorization": f"Bearer {self.token}", **headers},
        )
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def start_worker(self, service: str, queue: str, **env: str) -> Proc:
        """Another ``tenure worker``, for *queue* only, its spans under the service name *service*."""
        return self.procs.start(
            service, [*_worker_argv(), "--queues", queue], {**self.env, "OTEL_SERVICE_NAME": service, **env}
        )

    def wait_succeeded(self, job_id: str) -> None:
        self.wait_status(job_id, "succeeded")

    def wait_status(self, job_id: str, status: str) -> None:
        def reached() -> bool:
            job = self.http.get(f"/api/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {self.token}"}).json()
            assert job["status"] in ("queued", "running", "succeeded"), job
            return bool(job["status"] == status)

        wait_for(f"job {job_id} to be {status}", reached, 30, self.procs, poll_s=0.05)

    def trace(self, job_id: str, *names: str, counts: dict[str, int] | None = None) -> list[ReceivedSpan]:
        """The spans of the trace whose submit created *job_id*, once the request's server span and spans
        named *names* arrived for it (and, for each name in *counts*, at least that many: each process
        exports a span when it ends, so one span can arrive after a later one's — the request's span ends
        after its submit, and the worker may finish the job before the web's next batch is exported)."""

        def arrived() -> list[ReceivedSpan] | None:
            spans = self.receiver.spans()
            submit = [s for s in spans if s.name == "tenure.job.submit" and s.attributes.get("tenure.job.id") == job_id]
            if not submit:
                return None
            in_trace = [s for s in spans if s.trace_id == submit[0].trace_id]
            mine = [s.name for s in in_trace if s.attributes.get("tenure.job.id") == job_id]
            enough = all(mine.count(name) >= n for name, n in (counts or {}).items())
            requested = any(s.name == "POST /api/v1/jobs" for s in in_trace)
            return in_trace if requested and set(names) <= set(mine) and enough else None

        return wait_for(f"the spans {names} of job {job_id}", arrived, 20, self.procs, poll_s=0.05)


@contextmanager
def _databases(backend: str) -> Iterator[dict[str, str]]:
    """The deployment's ``TENURE_DATABASE_URL`` (and ``TENURE_BROKER_URL``), migrated."""
    from jobs import schema

    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/tenure.db"
            schema.upgrade(url)
            yield {"TENURE_DATABASE_URL": url}
        return
    from tests.acceptance.operations.fleet import rabbitmq_postgres

    with rabbitmq_postgres() as fleet:
        schema.upgrade(fleet.database_url)
        yield {"TENURE_DATABASE_URL": fleet.database_url, "TENURE_BROKER_URL": fleet.broker_url}


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=[pytest.mark.services, pytest.mark.slow])]
)
def deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    import accounts
    from jobs.db import make_engine

    backend = request.param
    tmp = tmp_path_factory.mktemp(f"tracing-{backend}")
    with _databases(backend) as urls, otlp_receiver() as (endpoint, receiver):
        engine = make_engine(urls["TENURE_DATABASE_URL"])
        user, _ = accounts.create_user(engine, "tracy", role="user")
        token = accounts.create_token(engine, user.id, "traces")[1]
        engine.dispose()
        port = free_port()
        env = {
            **os.environ,
            **urls,
            "TENURE_OUTPUT_ROOT": str(tmp / "outputs"),
            "TENURE_WEB_TASKS_APP": APP,
            "TENURE_SECRET_KEY": "tracing-secret",
            "PORT": str(port),
            "TENURE_WEB_WORKERS": "1",
            "TENURE_WEB_THREADS": "8",
            "TENURE_TRACING": "1",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            "TRACE_FETCH_URL": f"{endpoint}/fetched",
        }
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        gunicorn = str(Path(sys.executable).with_name("gunicorn"))
        with processes(tmp) as procs:
            procs.start(
                "web",
                [gunicorn, "-c", "gunicorn.conf.py", "webapp:create_app()"],
                {**env, "OTEL_SERVICE_NAME": "tenure-web"},
            )
            procs.start(
                "worker",
                [*_worker_argv(), "--queues", "traced"],
                {**env, "OTEL_SERVICE_NAME": "tenure-worker"},
            )
            if backend != "sqlite":
                procs.start("relay", [sys.executable, "-m", "tenure_cli", "relay", "--app", APP], env)
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base, timeout=10) as http:
                wait_for("gunicorn to answer", lambda: _answers(http), 30, procs, poll_s=0.1)
                yield Deployment(backend, http, token, receiver, procs, env)


def _worker_argv() -> list[str]:
    threads = ["--processes", "1", "--threads", "2", "--worker-shutdown-timeout", "1000"]
    return [sys.executable, "-m", "tenure_cli", "worker", APP, *threads]


def _answers(http: httpx.Client) -> bool:
    try:
        return http.get("/api/health/live").is_success
    except httpx.HTTPError:
        return False


def _committed(deployment: Deployment) -> tuple[str, ...]:
    """The span that ends a successful attempt: its commit with the ack on SQLite, its completion elsewhere."""
    return ("tenure.job.commit",) if deployment.backend == "sqlite" else ("tenure.job.complete",)


def _one(spans: list[ReceivedSpan], name: str, **attributes: Any) -> ReceivedSpan:
    found = [s for s in spans if s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())]
    assert len(found) == 1, f"{len(found)} spans {name} {attributes} in {[(s.name, s.attributes) for s in spans]}"
    return found[0]


def _no_payload(spans: list[ReceivedSpan]) -> None:
    for s in spans:
        assert SECRET not in repr(s.attributes), (s.name, s.attributes)


def test_a_job_submitted_over_http_and_run_by_a_worker_is_one_trace(deployment: Deployment) -> None:
    job_id = deployment.submit("trace_echo")
    deployment.wait_succeeded(job_id)
    spans = deployment.trace(job_id, "tenure.job.claim", "tenure.job.run", *_committed(deployment))

    # The web process: the request's server span, the submit inside it.
    request = _one(spans, "POST /api/v1/jobs")
    assert (request.service, request.kind, request.parent_id) == ("tenure-web", "server", "")
    submit = _one(spans, "tenure.job.submit", **{"tenure.job.id": job_id})
    assert (submit.service, submit.kind, submit.parent_id) == ("tenure-web", "producer", request.span_id)
    assert submit.attributes["tenure.job.kind"] == "trace_echo" and submit.attributes["tenure.job.created"] is True
    # The submit's SQL (SQLAlchemy's instrumentation) is inside it.
    assert any(s.parent_id == submit.span_id and s.kind == "client" for s in spans)

    # The worker: the delivery continues the submit's trace; claim, run and completion are its children.
    process = _one(spans, "tenure.job.process", **{"tenure.job.id": job_id})
    assert (process.service, process.kind, process.parent_id) == ("tenure-worker", "consumer", submit.span_id)
    assert process.attributes["tenure.job.queue"] == "traced"
    claim = _one(spans, "tenure.job.claim", **{"tenure.job.id": job_id})
    run = _one(spans, "tenure.job.run", **{"tenure.job.id": job_id})
    complete = _one(spans, "tenure.job.complete", **{"tenure.job.id": job_id})
    for child in (claim, run, complete):
        assert (child.service, child.parent_id) == ("tenure-worker", process.span_id), child
        assert child.attributes["tenure.job.attempt"] == 1
    assert claim.attributes["tenure.job.claimed"] is True
    assert run.attributes["tenure.job.outcome"] == "succeeded" and not run.error
    if deployment.backend == "sqlite":
        # The success commits with the message's ack (a batch of the broker's ack writer).
        assert complete.attributes["tenure.job.final"] == "deferred"
        commit = _one(spans, "tenure.job.commit", **{"tenure.job.id": job_id})
        assert commit.parent_id == complete.span_id and commit.attributes["tenure.job.final"] == "succeeded"
    else:
        assert complete.attributes["tenure.job.final"] == "succeeded"
        # The completion's own transaction: its SQL is inside it.
        assert any(s.parent_id == complete.span_id and s.kind == "client" for s in spans)
    assert {s.trace_id for s in spans} == {request.trace_id}
    _no_payload(spans)
    # The health probes the fixture polled made no spans (excluded URLs).
    assert not [s for s in deployment.receiver.spans() if "/api/health" in s.name]


def test_a_request_carrying_a_trace_context_continues_that_trace(deployment: Deployment) -> None:
    caller = "0af7651916cd43dd8448eb211c80319c"
    job_id = deployment.submit("trace_echo", traceparent=f"00-{caller}-b7ad6b7169203331-01")
    deployment.wait_succeeded(job_id)
    spans = deployment.trace(job_id, "tenure.job.run")
    assert _one(spans, "POST /api/v1/jobs").parent_id == "b7ad6b7169203331"
    assert {s.trace_id for s in spans} == {caller}


def test_a_retry_is_in_the_same_trace_after_the_failed_attempt(deployment: Deployment) -> None:
    job_id = deployment.submit("trace_flaky")
    deployment.wait_succeeded(job_id)
    spans = deployment.trace(job_id, *_committed(deployment), counts={"tenure.job.process": 2})
    first = _one(spans, "tenure.job.run", **{"tenure.job.id": job_id, "tenure.job.attempt": 1})
    assert first.error and first.attributes["tenure.job.outcome"] == "retry"
    failed = _one(spans, "tenure.job.complete", **{"tenure.job.id": job_id, "tenure.job.attempt": 1})
    assert failed.attributes["tenure.job.final"] == "retrying"
    # The second attempt's message was written inside the first's completion: its delivery is a child.
    processes = [s for s in spans if s.name == "tenure.job.process" and s.attributes.get("tenure.job.id") == job_id]
    assert len(processes) == 2
    second = next(p for p in processes if p.parent_id == failed.span_id)
    run = _one(spans, "tenure.job.run", **{"tenure.job.id": job_id, "tenure.job.attempt": 2})
    assert run.parent_id == second.span_id and run.attributes["tenure.job.outcome"] == "succeeded"
    _no_payload(spans)


def test_an_actors_own_result_transaction_is_a_span_of_its_run(deployment: Deployment) -> None:
    job_id = deployment.submit("trace_own_commit")
    deployment.wait_succeeded(job_id)
    spans = deployment.trace(job_id, "tenure.job.result_transaction")
    run = _one(spans, "tenure.job.run", **{"tenure.job.id": job_id})
    own = _one(spans, "tenure.job.result_transaction", **{"tenure.job.id": job_id})
    assert own.parent_id == run.span_id and not own.error
    # Completed inside the actor: nothing is left for the completer to record.
    assert not [s for s in spans if s.name == "tenure.job.complete" and s.attributes.get("tenure.job.id") == job_id]


def test_workflow_steps_join_the_trace_of_the_workflows_submit(deployment: Deployment) -> None:
    parent_id = deployment.submit("trace_flow")
    deployment.wait_succeeded(parent_id)
    spans = wait_for("both steps completed", lambda: _completed(deployment.trace(parent_id), 2), 20, deployment.procs)
    submit = _one(spans, "tenure.job.submit", **{"tenure.job.id": parent_id})
    processes = [s for s in spans if s.name == "tenure.job.process"]
    assert len(processes) == 2, [(s.name, s.attributes) for s in spans]
    # The first step's message was written by the submit; the second's when the first step completed.
    first = next(p for p in processes if p.parent_id == submit.span_id)
    second = next(p for p in processes if p is not first)
    first_complete = _one(spans, "tenure.job.complete", **{"tenure.job.id": first.attributes["tenure.job.id"]})
    assert first_complete.attributes["tenure.job.final"] == "succeeded"  # a step completes inline, never deferred
    assert second.parent_id == first_complete.span_id
    _no_payload(spans)


def _completed(spans: list[ReceivedSpan], steps: int) -> list[ReceivedSpan] | None:
    return spans if len([s for s in spans if s.name == "tenure.job.complete"]) == steps else None


def test_an_actors_httpx_request_is_a_client_span_carrying_the_trace(deployment: Deployment) -> None:
    job_id = deployment.submit("trace_fetch")
    deployment.wait_succeeded(job_id)
    spans = deployment.trace(job_id, "tenure.job.run")
    run = _one(spans, "tenure.job.run", **{"tenure.job.id": job_id})
    wait_for("the GET's span", lambda: [s for s in deployment.trace(job_id) if s.name == "GET"], 20, deployment.procs)
    get = _one(deployment.trace(job_id), "GET")
    assert (get.kind, get.parent_id) == ("client", run.span_id)
    # The receiver got the request with the client span's context.
    assert f"-{get.trace_id}-{get.span_id}-" in str(deployment.receiver.fetched)


def test_a_stopping_worker_flushes_the_spans_it_still_holds(deployment: Deployment) -> None:
    if deployment.backend != "sqlite":
        pytest.skip("the flush does not depend on the backend: one deployment checks it")
    # Given a worker whose finished spans would wait ten minutes before their batch is exported
    worker = deployment.start_worker("tenure-flush-worker", "traced_flush", OTEL_BSP_SCHEDULE_DELAY="600000")
    job_id = deployment.submit("trace_flush")
    deployment.wait_succeeded(job_id)
    deployment.trace(job_id)  # the web's spans arrived
    assert not [s for s in deployment.receiver.spans() if s.service == "tenure-flush-worker"]
    # When it stops (SIGTERM, as honcho and the supervisor stop it), its spans are exported on the way out.
    deployment.procs.signal(worker, signal.SIGTERM)
    assert worker.popen.wait(30) == 0
    spans = deployment.trace(job_id, "tenure.job.process", "tenure.job.claim", "tenure.job.run", "tenure.job.commit")
    assert {s.service for s in spans if s.name.startswith("tenure.job.") and s.name != "tenure.job.submit"} == {
        "tenure-flush-worker"
    }


def test_an_attempt_recovered_after_its_worker_was_lost_stays_in_the_submits_trace(deployment: Deployment) -> None:
    if deployment.backend != "sqlite":
        pytest.skip("recovery's message is written the same way on every backend: one deployment checks it")
    # Given a job running on a worker (1 s job leases) that is then SIGKILLed whole
    lost = deployment.start_worker("tenure-lost-worker", "traced_lost", TENURE_JOB_LEASE_TTL_S="1")
    job_id = deployment.submit("trace_lost")
    deployment.wait_status(job_id, "running")
    deployment.procs.signal(lost, signal.SIGKILL, group=True)
    lost.popen.wait(10)
    # When another worker's keeper recovers it (a fresh message, written outside any span) and runs attempt 2
    rescuer = deployment.start_worker("tenure-rescuer", "traced_lost", TENURE_RECOVERY_INTERVAL_S="0.2")
    deployment.wait_succeeded(job_id)
    # Then that attempt's delivery is a child of the submit, through the context the job's row kept
    spans = deployment.trace(job_id, "tenure.job.commit")
    submit = _one(spans, "tenure.job.submit", **{"tenure.job.id": job_id})
    run = _one(spans, "tenure.job.run", **{"tenure.job.id": job_id, "tenure.job.attempt": 2})
    process = next(s for s in spans if s.span_id == run.parent_id)
    assert (process.name, process.service) == ("tenure.job.process", "tenure-rescuer")
    assert process.parent_id == submit.span_id
    deployment.procs.signal(rescuer, signal.SIGTERM, group=True)
