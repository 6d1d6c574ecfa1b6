"""The web layer's gateway over the real job layer (migrated SQLite file, SQLiteBroker, local registry)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from jobs import JobContext, Step, WorkflowRequest, payloads, schema, workflow_steps
from jobs.db import make_engine
from jobs.registry import Registry
from settings.environment import Settings
from webapp.errors import Conflict, Invalid, JobNotFoundError, NotFound
from webapp.gateway import FeedLost, JobQuery
from webapp.jobs_adapter import JobLayerGateway


def build(ctx: JobContext, **payload: object) -> None:
    return None


BUILD = payloads.schema(
    "Build a thing",
    "Longer description.",
    name=payloads.field("string", "Name", required=True),
    count=payloads.field("integer", "Count", default=1),
    ratio=payloads.field("number", "Ratio", nullable=True),
    loud=payloads.field("boolean", "Loud"),
    tags=payloads.field("list", "Tags"),
    files=payloads.field("list", "Files", nullable=True),
    meta=payloads.field("object", "Meta", nullable=True),
    where=payloads.field("string", "Where", nullable=True),
)


def test_field_types_and_payload_checks() -> None:
    assert [f.type for f in BUILD.fields()] == [
        "string",
        "integer",
        "number",
        "boolean",
        "list",
        "list",
        "object",
        "string",
    ]
    assert BUILD.problems({"name": "x", "count": 2, "ratio": None, "tags": ["a"], "meta": {"k": 1}}) == {}
    problems = BUILD.problems({"count": 1.5, "loud": 1, "tags": "a", "meta": [], "extra": 1, "where": 3})
    assert set(problems) == {"name", "count", "loud", "tags", "meta", "extra", "where"}
    assert BUILD.problems({"name": "x", "count": None}) == {"count": ["Field may not be null."]}


@pytest.fixture()
def gateway(tmp_path: Path):  # type: ignore[no-untyped-def]
    from broker import SQLiteBroker

    url = f"sqlite:///{tmp_path / 't.db'}"
    schema.upgrade(url)
    engine = make_engine(url)
    broker = SQLiteBroker(url, middleware=[])
    registry = Registry()
    registry.kind("build", queue="builds", broker=broker, payload=BUILD)(build)
    echo_payload = payloads.schema("Echo", text=payloads.field("string", "Text", required=True))

    @registry.kind("echo", queue="echoes", broker=broker, payload=echo_payload)
    def echo(ctx: JobContext, *, text: str) -> dict:
        return {"text": text}

    settings = Settings(database_url=url, broker_url=url, output_root=str(tmp_path / "out"))
    gw = JobLayerGateway(engine=engine, broker=broker, settings=settings, registry=registry)
    yield gw
    broker.close()
    engine.dispose()


def _submit(gw, owner="1", kind="echo", key=None, **payload):  # type: ignore[no-untyped-def]
    return gw.submit(
        owner_id=owner, kind=kind, payload=payload or {"text": "t"}, idempotency_key=key, priority=0, delay_s=0
    )


def test_kinds_from_their_payload_schemas(gateway) -> None:  # type: ignore[no-untyped-def]
    kinds = {k.name: k for k in gateway.kinds()}
    b = kinds["build"]
    assert (b.title, b.description, b.queue) == ("Build a thing", "Longer description.", "builds")
    fields = {f.name: f for f in b.fields}
    assert fields["name"].required and fields["count"].default == 1 and fields["ratio"].nullable
    assert fields["tags"].type == "list" and fields["meta"].type == "object"
    assert fields["name"].label == "Name" and b.payload_schema == BUILD.json_schema()


def test_submit_answers(gateway) -> None:  # type: ignore[no-untyped-def]
    job, created = _submit(gateway, key="k")
    assert created and job.status == "queued" and job.queue == "echoes"
    again, created = _submit(gateway, key="k")
    assert not created and again.id == job.id
    with pytest.raises(Conflict):
        _submit(gateway, key="k", text="other")
    with pytest.raises(Invalid) as unknown:
        _submit(gateway, kind="nope")
    assert "kind" in unknown.value.details
    with pytest.raises(Invalid) as bad:
        gateway.submit(owner_id="1", kind="build", payload={"count": "x"}, idempotency_key=None, priority=0, delay_s=0)
    assert set(bad.value.details) == {"name", "count"}


def test_scoping_cancel_retry_events(gateway) -> None:  # type: ignore[no-untyped-def]
    job, _ = _submit(gateway, owner="1")
    with pytest.raises(JobNotFoundError):
        gateway.get("2", job.id)
    with pytest.raises(JobNotFoundError):
        gateway.cancel("2", job.id, by="2")
    assert gateway.get(None, job.id).id == job.id  # admins see everything
    cancelled, outcome = gateway.cancel("1", job.id, by="1")
    assert outcome == "cancelled" and cancelled.status == "cancelled" and cancelled.can_retry
    with pytest.raises(Conflict):
        gateway.cancel("1", job.id, by="1")
    new, created = gateway.retry("1", job.id, by="1")
    assert created and new.retry_of_job_id == job.id and new.status == "queued"
    assert gateway.retry("1", job.id, by="1") == (new, False)  # retried once: the same retry again
    with pytest.raises(Conflict):
        gateway.retry("1", new.id, by="1")
    assert [e.data["status"] for e in gateway.events("1", job.id, after=0, limit=10)] == ["queued", "cancelled"]
    with pytest.raises(JobNotFoundError):
        gateway.events("2", job.id, after=0, limit=10)


def test_list_filters_pagination_and_count(gateway) -> None:  # type: ignore[no-untyped-def]
    ids = [_submit(gateway, text=f"t{i}")[0].id for i in range(5)]
    other = gateway.submit(
        owner_id="1", kind="build", payload={"name": "b"}, idempotency_key=None, priority=0, delay_s=0
    )[0]
    gateway.cancel("1", ids[0], by="1")
    page = gateway.list_jobs("1", JobQuery(), cursor=None, limit=4)
    assert len(page.items) == 4 and page.next_cursor
    rest = gateway.list_jobs("1", JobQuery(), cursor=page.next_cursor, limit=4)
    assert len(rest.items) == 2 and rest.next_cursor is None
    listed = [j.id for j in page.items + rest.items]  # newest first; same-millisecond ties by id
    assert sorted(listed) == sorted([*ids, other.id])
    assert [(j.created_at, j.id) for j in page.items + rest.items] == sorted(
        ((j.created_at, j.id) for j in page.items + rest.items), reverse=True
    )
    assert [j.id for j in gateway.list_jobs("1", JobQuery(queue="builds"), cursor=None, limit=10).items] == [other.id]
    both = JobQuery(statuses=("cancelled", "queued"))
    assert gateway.count_jobs("1", both) == 6 and gateway.count_jobs("1", JobQuery(statuses=("cancelled",))) == 1
    assert gateway.list_jobs("1", JobQuery(search=ids[2][:12]), cursor=None, limit=10).items[0].id == ids[2]
    future = datetime.now(UTC) + timedelta(hours=1)
    assert gateway.list_jobs("1", JobQuery(created_after=future), cursor=None, limit=10).items == []
    assert len(gateway.list_jobs("1", JobQuery(created_before=future), cursor=None, limit=10).items) == 6
    assert gateway.list_jobs("2", JobQuery(), cursor=None, limit=10).items == []
    assert len(gateway.list_jobs(None, JobQuery(owner_id="1"), cursor=None, limit=10).items) == 6
    far = gateway.list_jobs("1", JobQuery(), cursor="999999999999999.zz", limit=10)  # clamped, not a 500
    assert len(far.items) == 6
    with pytest.raises(Invalid):
        gateway.list_jobs("1", JobQuery(), cursor="garbage", limit=10)


def test_live_feed_notices(gateway) -> None:  # type: ignore[no-untyped-def]
    feed = gateway.open_feed("user:1", "1")
    everything = gateway.open_feed("user:9", None)
    start = feed.cursor
    mine, _ = _submit(gateway, owner="1")
    theirs, _ = _submit(gateway, owner="2")
    notices = gateway.feed_notices(feed, limit=10)
    assert [(n.job_id, n.status, n.type, n.id) for n in notices] == [(mine.id, "queued", "status", f"{start[:16]}.1")]
    assert [n.job_id for n in gateway.feed_notices(everything, limit=10)] == [mine.id, theirs.id]
    gateway.cancel("1", mine.id, by="1")
    gateway.mark_feed(feed)
    later = gateway.feed_notices(feed, limit=10)
    assert [(n.job_id, n.status) for n in later] == [(mine.id, "cancelled")] and feed.cursor == later[0].id
    # The feed is the job layer's: a second gateway (another process) resumes its cursor.
    other = JobLayerGateway(engine=gateway.engine, broker=gateway.broker, settings=gateway.settings)
    resumed = other.resume_feed(notices[0].id, "user:1", "1")
    assert other.feed_notices(resumed, limit=10) == later
    # Only for the subscriber whose feed it is, seeing what it saw.
    for subscriber, scope in (("user:2", "1"), ("user:1", None)):
        with pytest.raises(FeedLost) as lost:
            other.resume_feed(notices[0].id, subscriber, scope)
        assert lost.value.reason == "cursor_unknown"
    assert not hasattr(later[0], "data") and not hasattr(later[0], "payload")


def test_output_files(gateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    job, _ = _submit(gateway)
    gateway.cancel("1", job.id, by="1")
    folder = tmp_path / "out" / job.id
    folder.mkdir(parents=True)
    (folder / "1-report.txt").write_text("hi")
    assert gateway.get("1", job.id).files == ("1-report.txt",)
    assert gateway.output_file("1", job.id, "1-report.txt").read_text() == "hi"
    with pytest.raises(NotFound):
        gateway.output_file("1", job.id, "../../t.db")
    with pytest.raises(JobNotFoundError):
        gateway.output_file("2", job.id, "1-report.txt")


def test_a_workflow_kind_is_listed_and_submitted_like_a_job_kind(gateway) -> None:  # type: ignore[no-untyped-def]
    schema = payloads.schema(
        "Echo, several times in a row",
        text=payloads.field("string", "Text", required=True),
        times=payloads.field("integer", "Times", default=2),
    )

    @gateway.registry.workflow("echo_twice", payload=schema)
    def echo_twice(request: WorkflowRequest, *, text: str, times: int = 2) -> list[Step]:
        return [Step(f"echo-{n}", "echo", {"text": text}, [f"echo-{n - 1}"] if n else []) for n in range(times)]

    kind = {k.name: k for k in gateway.kinds()}["echo_twice"]
    assert (kind.title, kind.queue) == ("Echo, several times in a row", "workflow")
    assert [(f.name, f.type, f.required) for f in kind.fields] == [
        ("text", "string", True),
        ("times", "integer", False),
    ]
    job, created = _submit(gateway, kind="echo_twice", key="w", text="hi", times=3)
    assert created and job.status == "running" and job.kind == "echo_twice" and job.queue == "workflow"
    steps = workflow_steps(gateway.engine, job.id, owner_id="1")
    assert [s.kind for s in steps] == ["echo"] * 3 and {s.parent_job_id for s in steps} == {job.id}
    again, created = _submit(gateway, kind="echo_twice", key="w", text="hi", times=3)
    assert not created and again.id == job.id
    with pytest.raises(Invalid) as bad:
        _submit(gateway, kind="echo_twice", times="x")
    assert set(bad.value.details) == {"text", "times"}
