"""Queue depth on Redis and RabbitMQ: 500 messages show as 500 in /metrics, the API and the Queues page,
with their lag; a real worker holding some shows them in flight there (ready + in flight = 500); then
the counts fall to 0 while it drains them. Pausing is refused there with the reason.

A real gunicorn serves the web app (jobs on a fresh PostgreSQL database, the broker of ``depth_app``;
RabbitMQ with its management API, ``TENURE_RABBITMQ_MANAGEMENT_URL``, which samples its statistics
every 5 s: the in-flight count and the lag appear up to then later); the page is read by Chromium,
logged in as an admin; ``tenure worker`` drains, each message waiting for a gate file first.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import dramatiq
import pytest

from tests.e2e.conftest import CHROMIUM

from .support import ROOT, Processes, Samples, free_port, parse_samples, total, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.services, pytest.mark.timeout(180)]

APP = "tests.acceptance.monitoring.depth_app"
QUEUE = "depth"
MESSAGES = 500


@dataclass
class Web:
    base_url: str
    token: str
    admin_password: str

    def get(self, path: str) -> tuple[int, bytes]:
        request = urllib.request.Request(self.base_url + path, headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def post(self, path: str) -> tuple[int, dict]:
        request = urllib.request.Request(
            self.base_url + path, data=b"", method="POST", headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def metrics(self, collect: str = "database") -> Samples:
        status, body = self.get(f"/metrics?collect={collect}")
        assert status == 200, body[:300]
        return parse_samples(body.decode())

    def queue(self) -> dict:
        status, body = self.get("/api/v1/queues")
        assert status == 200, body[:300]
        return next(q for q in json.loads(body) if q["queue"] == QUEUE)


@contextmanager
def broker_url(kind: str) -> Iterator[str]:
    if kind == "redis":
        yield os.environ.get("TENURE_TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
    else:
        from tests.acceptance.operations.fleet import rabbitmq_vhost

        with rabbitmq_vhost() as url:
            yield url


@pytest.fixture(params=["redis", "rabbitmq"])
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Web, Processes, dict]]:
    import accounts
    from jobs.db import make_engine
    from tests.integration.jobs.support import postgres_database

    kind = request.param
    (tmp_path / "logs").mkdir()
    procs = Processes(tmp_path / "logs")
    namespace = f"tenure-depth-{uuid.uuid4().hex[:8]}"
    with broker_url(kind) as url, postgres_database(migrated=True) as database_url:
        engine = make_engine(database_url)
        admin, _ = accounts.create_user(engine, "admin", "admin-password-depth", role="admin")
        _, token = accounts.create_token(engine, admin.id, "depth")
        engine.dispose()
        port = free_port()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("TENURE_", "PROMETHEUS_"))},
            "PYTHONPATH": str(ROOT),
            "TENURE_DATABASE_URL": database_url,
            "TENURE_BROKER_URL": url,
            "TENURE_TEST_REDIS_NAMESPACE": namespace,
            "TENURE_WEB_TASKS_APP": APP,
            "TENURE_SECRET_KEY": "depth-secret",
            "TENURE_OUTPUT_ROOT": str(tmp_path / "outputs"),
            "PORT": str(port),
            "TENURE_WEB_WORKERS": "1",
            "TENURE_WEB_THREADS": "8",
            "DEPTH_GATE": str(tmp_path / "gate"),
        }
        if kind == "rabbitmq":
            from tests.acceptance.operations.fleet import RABBITMQ_MANAGEMENT_URL

            env["TENURE_RABBITMQ_MANAGEMENT_URL"] = RABBITMQ_MANAGEMENT_URL
        gunicorn = str(Path(sys.executable).with_name("gunicorn"))
        web_proc = procs.start("web", [gunicorn, "-c", "gunicorn.conf.py", "webapp:create_app()"], env)
        web = Web(f"http://127.0.0.1:{port}", token, "admin-password-depth")

        def live() -> bool:
            assert web_proc.poll() is None, procs.log("web")
            try:
                return web.get("/api/health/live")[0] == 200
            except OSError:
                return False

        wait_for(live, "the web process")
        try:
            yield kind, web, procs, env
        finally:
            procs.stop_all()
            if kind == "redis":
                import redis

                client = redis.Redis.from_url(url)
                keys = list(client.scan_iter(f"{namespace}:*"))
                if keys:
                    client.delete(*keys)
                client.close()


def page_row(page, web: Web) -> dict[str, str]:  # type: ignore[no-untyped-def]
    page.goto(web.base_url + "/ops/queues")
    row = page.locator(f"#queue-{QUEUE}")
    return {c: row.locator(f"td.{c}").inner_text().strip() for c in ("ready", "leased", "delayed", "dead", "lag")}


def counts(samples: Samples) -> dict[str, float | None]:
    """The queue's ``tenure_queue_*`` samples: each state's count and the lag (``None``: no sample)."""
    found: dict[str, float | None] = {state: None for state in ("ready", "delayed", "leased", "dead", "lag")}
    for (name, labels), value in samples.items():
        tags = dict(labels)
        if tags.get("queue") != QUEUE:
            continue
        if name == "tenure_queue_messages":
            found[tags["state"]] = value
        elif name == "tenure_queue_oldest_ready_age_seconds":
            found["lag"] = value
    return found


def test_500_queued_messages_show_as_500_then_in_flight_and_fall_to_0_as_a_worker_drains(deployment) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import sync_playwright

    kind, web, procs, env = deployment
    gate = Path(env["DEPTH_GATE"])
    # Given: 500 messages enqueued on the broker, no worker
    from broker import make_broker

    options = {"namespace": env["TENURE_TEST_REDIS_NAMESPACE"]} if kind == "redis" else {}
    producer = make_broker(env["TENURE_BROKER_URL"], middleware=[], **options)
    producer.declare_queue(QUEUE)
    enqueued_at = time.monotonic()
    for i in range(MESSAGES):
        producer.enqueue(dramatiq.Message(queue_name=QUEUE, actor_name="drain", args=(i,), kwargs={}, options={}))
    producer.close()

    # Then: the web's /metrics says 500 ready at once; nothing in flight, and a lag, once the broker
    # has the numbers (RabbitMQ's management API: at its next sample)
    assert counts(web.metrics())["ready"] == MESSAGES
    seen = wait_for(
        lambda: (c := counts(web.metrics()))["leased"] is not None and c["lag"] is not None and c,
        "the in-flight count and the lag",
    )
    assert seen == {"ready": MESSAGES, "delayed": 0, "leased": 0, "dead": 0, "lag": seen["lag"]}
    assert 0 <= seen["lag"] <= time.monotonic() - enqueued_at + 1  # RabbitMQ's: whole seconds
    samples = web.metrics()
    assert total(samples, "tenure_queue_paused", queue=QUEUE) == 0
    # …and the two parts of the endpoint split as documented
    assert total(web.metrics("process"), "tenure_queue_messages") == 0
    assert web.get("/metrics?collect=everything")[0] == 422
    # the API agrees, and refuses a pause with the reason instead of a 503
    row = web.queue()
    assert (row["broker"], row["ready"], row["leased"], row["paused"]) == (kind, MESSAGES, 0, False)
    assert row["oldest_ready_age_s"] is not None
    status, answer = web.post(f"/api/v1/queues/{QUEUE}/pause")
    assert status == 409 and answer["error"]["code"] == "pause_unavailable", answer
    assert "cannot be paused" in answer["error"]["message"]
    assert answer["error"]["message"] == row["pause_unavailable"]

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-background-networking"])
        page = browser.new_page()
        page.goto(web.base_url + "/login")
        page.fill("#username", "admin")
        page.fill("#password", web.admin_password)
        page.click("button[type=submit]")
        page.wait_for_url(lambda u: "/login" not in u)
        # and so does the Queues page, which explains why there is no Pause button
        shown = page_row(page, web)
        assert (shown["ready"], shown["leased"], shown["delayed"], shown["dead"]) == (str(MESSAGES), "0", "0", "0")
        assert shown["lag"].endswith(" s") and float(shown["lag"].removesuffix(" s")) >= 0
        assert page.locator(f"#pause-{QUEUE}").count() == 0
        assert "cannot be paused" in page.inner_text("#pause-unavailable")
        if kind == "rabbitmq":
            assert "management API" in page.inner_text("#queue-counts-source")

        # When: a worker takes messages, each waiting for the gate
        procs.start(
            "worker",
            [sys.executable, "-m", "tenure_cli", "worker", APP, "-p", "1", "-t", "2", "-Q", QUEUE,
             "--worker-shutdown-timeout", "1000"],
            env,
        )  # fmt: skip
        # Then: the messages it holds are in flight, the rest ready, in metrics, the API and on the page
        held = wait_for(
            lambda: (c := counts(web.metrics()))["leased"] and c["ready"] + c["leased"] == MESSAGES and c,
            "messages in flight, the rest ready",
            60,
        )
        assert 0 < held["leased"] < MESSAGES and held["lag"] is not None
        row = web.queue()
        assert (row["ready"], row["leased"]) == (held["ready"], held["leased"])
        shown = page_row(page, web)
        assert (shown["ready"], shown["leased"]) == (str(int(held["ready"])), str(int(held["leased"])))

        # When: the gate opens and the worker drains the queue
        gate.touch()
        seen_ready: list[float] = []
        seen_leased: list[float] = []
        deadline = time.monotonic() + 90
        while True:
            c = counts(web.metrics())
            seen_ready.append(c["ready"])
            seen_leased.append(c["leased"])
            if c["ready"] == 0 and c["leased"] == 0:
                break
            assert time.monotonic() < deadline, (seen_ready[-5:], seen_leased[-5:], procs.log("worker"))
            time.sleep(0.1)
        # Then: the count fell to 0 through the values in between, and the page shows 0 too
        assert any(0 < r < held["ready"] for r in seen_ready), seen_ready
        assert seen_ready == sorted(seen_ready, reverse=True), "a queue only a worker drains never grows"
        final = page_row(page, web)
        assert (final["ready"], final["leased"], final["lag"]) == ("0", "0", "0.0 s")
        browser.close()
