"""Marshmallow schemas of the JSON API; flask-smorest turns them into the OpenAPI document.

Integers in JSON bodies are ``strict`` (``1.5`` or ``2e-42`` is not an integer); in query strings
they cannot be, because every query value arrives as a string.
"""

from __future__ import annotations

import marshmallow as ma
from marshmallow import fields, validate

from ..activity_windows import GROUPS, WINDOWS
from ..gateway import STATUSES
from ..owners import event_data, owner_name, prefetch_owner_names, waiting
from ..uploads import MAX_FILES

ID_MAX = 100
#: Cursors are ``<created_at ms>.<job id>`` (opaque to clients, but documented so generators respect it).
CURSOR_PATTERN = r"^[0-9]{1,15}\.[0-9A-Za-z_-]{1,100}$"


class WholeNumber(fields.Integer):
    """An integer in a JSON body: ``3`` and ``3.0`` (JSON Schema's integers) are accepted; ``1.5``,
    ``2.58e-42``, ``true`` and ``"3"`` are not (marshmallow's non-strict Integer would truncate them)."""

    def _validated(self, value):  # type: ignore[no-untyped-def]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.make_error("invalid")
        if isinstance(value, float):
            if not value.is_integer():
                raise self.make_error("invalid")
            value = int(value)
        return super()._validated(value)


class JsonBoolean(fields.Boolean):
    """A boolean in a JSON body: ``true`` or ``false`` only. marshmallow's Boolean also takes ``0``, ``"no"``,
    ``"off"`` …, so a client meaning a dry run by a value it thinks truthy could run the action for real."""

    def _deserialize(self, value, attr, data, **kwargs):  # type: ignore[no-untyped-def]
        if not isinstance(value, bool):
            raise self.make_error("invalid", input=value)
        return value


class OwnerName(fields.String):
    """An owner id shown as its user's name (ids stay internal; an owner that is no user shows as recorded)."""

    def _serialize(self, value, attr, obj, **kwargs):  # type: ignore[no-untyped-def]
        return super()._serialize(owner_name(value), attr, obj, **kwargs)


class EventData(fields.Dict):
    """A timeline event's data, its ``by`` a user name where it names the user who acted."""

    def _serialize(self, value, attr, obj, **kwargs):  # type: ignore[no-untyped-def]
        return super()._serialize(event_data(obj.type, value), attr, obj, **kwargs)


class ErrorDetailSchema(ma.Schema):
    code = fields.String(required=True, metadata={"description": "machine-readable error code"})
    message = fields.String(required=True, metadata={"description": "human-readable explanation"})
    details = fields.Raw(allow_none=True, metadata={"description": "per-field validation messages, when any"})


class ErrorSchema(ma.Schema):
    """Every error response: ``{"error": {"code", "message"}}``."""

    error = fields.Nested(ErrorDetailSchema, required=True)


class JobSchema(ma.Schema):
    id = fields.String(required=True)
    owner = OwnerName(attribute="owner_id", required=True, metadata={"description": "the owner's user name"})
    kind = fields.String(required=True)
    status = fields.String(required=True, validate=validate.OneOf(STATUSES))
    queue = fields.String(required=True)
    priority = fields.Integer(required=True)
    attempt = fields.Integer(required=True)
    max_attempts = fields.Integer(required=True)
    created_at = fields.DateTime(required=True)
    started_at = fields.DateTime(allow_none=True)
    completed_at = fields.DateTime(allow_none=True)
    progress = fields.Float(allow_none=True)
    progress_message = fields.String(allow_none=True)
    cancel_requested = fields.Boolean(required=True)
    error = fields.String(allow_none=True)
    result = fields.Raw(allow_none=True)
    retry_of_job_id = fields.String(allow_none=True)
    parent_job_id = fields.String(allow_none=True, metadata={"description": "the workflow this job is a step of"})
    summary = fields.String(
        allow_none=True, metadata={"description": "the kind's short description of the job (never its payload)"}
    )
    files = fields.List(fields.String(), required=True)
    can_cancel = fields.Boolean(required=True, metadata={"description": "cancel is allowed now"})
    can_retry = fields.Boolean(required=True, metadata={"description": "retry is allowed now"})
    still_exiting = fields.Boolean(
        required=True,
        metadata={
            "description": "its last attempt timed out and its thread has not stopped yet: a retry answers 409 "
            "until it has"
        },
    )
    can_delete = fields.Boolean(
        required=True, metadata={"description": "finished and no workflow step: `DELETE` may remove it"}
    )
    waiting = fields.Function(
        lambda job: waiting(job.waiting),
        metadata={
            "type": ["object", "null"],
            "description": "a queued job that waits for admission (it has no broker message yet): `reason` "
            "(`concurrency`, `rate`, `fair_share`, `steps`) and what it waits on (`limit_name` and `key`, "
            "`queue`, `workflow`); a job's own answer also says what is in use (`running`/`limit`, "
            "`started`/`starts`/`period_s`) and `text`, the line the UI shows. null for any other job",
        },
    )


class JobPageSchema(ma.Schema):
    items = fields.List(fields.Nested(JobSchema), required=True)

    @ma.pre_dump
    def _owner_names_at_once(self, page, **kwargs):  # type: ignore[no-untyped-def]
        prefetch_owner_names(job.owner_id for job in page["items"])
        return page

    next_cursor = fields.String(
        allow_none=True, required=True, metadata={"description": "pass as `cursor` for the next page"}
    )


class SubmitSchema(ma.Schema):
    kind = fields.String(required=True, validate=validate.Length(min=1, max=ID_MAX))
    payload = fields.Dict(keys=fields.String(), load_default=dict)
    priority = WholeNumber(load_default=0, validate=validate.Range(min=0, max=255))
    delay_s = fields.Float(
        load_default=0.0, allow_nan=False, validate=validate.Range(min=0, max=30 * 86400), metadata={"example": 0}
    )


class IdempotencyHeaderSchema(ma.Schema):
    class Meta:
        unknown = ma.EXCLUDE

    idempotency_key = fields.String(
        data_key="Idempotency-Key",
        validate=validate.Length(min=1, max=200),
        metadata={"description": "same key + same request → the same job (200); different request → 409"},
    )


class JobFilterSchema(ma.Schema):
    """Filters shared by the list and the bulk actions."""

    status = fields.List(fields.String(validate=validate.OneOf(STATUSES)), metadata={"description": "any of"})
    kind = fields.String(validate=validate.Length(max=ID_MAX))
    queue = fields.String(validate=validate.Length(max=ID_MAX))
    owner = fields.String(
        validate=validate.Length(max=ID_MAX),
        metadata={"description": "the owner's user name (admins only; a name nobody has matches nothing)"},
    )
    created_after = fields.AwareDateTime(default_timezone=None)
    created_before = fields.AwareDateTime(default_timezone=None)
    parent = fields.String(
        validate=validate.Length(max=ID_MAX), metadata={"description": "a workflow's id: list its steps"}
    )
    q = fields.String(
        validate=validate.Length(max=500),
        metadata={
            "description": "the search box: qualifiers `kind:` `status:` (may repeat) `owner:` (a user name) "
            '`queue:` `parent:` and text (words and "quoted phrases", each an id prefix or a substring of '
            "the kind, summary or error; a job matches all; a word of one or two ASCII characters: an id "
            "prefix only). An unknown qualifier or status, a short word that is no hex: 400",
            "example": 'kind:import_recording status:succeeded "session-2026"',
        },
    )


class JobListQuerySchema(JobFilterSchema):
    class Meta:
        unknown = ma.EXCLUDE

    cursor = fields.String(
        validate=validate.Regexp(CURSOR_PATTERN),
        metadata={"description": "the `next_cursor` of the previous page (opaque)"},
    )
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=200))


class BulkSchema(ma.Schema):
    # Required: a bulk action names what it acts on. A request without a body (or without a filter)
    # used to mean "every job you can see"; an explicit ``{}`` still does.
    filter = fields.Nested(
        JobFilterSchema, required=True, metadata={"description": "which jobs (`{}` for every job you can see)"}
    )
    dry_run = JsonBoolean(load_default=False, metadata={"description": "only count what would be affected"})
    limit = WholeNumber(load_default=500, validate=validate.Range(min=1, max=1000))


class BulkResultSchema(ma.Schema):
    dry_run = fields.Boolean(required=True)
    matched = fields.Integer(required=True, metadata={"description": "jobs matching the filter"})
    affected = fields.Integer(required=True, metadata={"description": "jobs the action changed (0 on a dry run)"})
    skipped = fields.Integer(required=True, metadata={"description": "matching jobs the action does not apply to"})
    job_ids = fields.List(fields.String(), required=True, metadata={"description": "changed (or new, for retry)"})


class DeletedSchema(ma.Schema):
    deleted = fields.List(
        fields.String(), required=True, metadata={"description": "the job's id, then its steps' (a workflow)"}
    )


class CancelResultSchema(ma.Schema):
    outcome = fields.String(required=True, validate=validate.OneOf(("cancelled", "cancel_requested")))
    job = fields.Nested(JobSchema, required=True)


class EventSchema(ma.Schema):
    sequence = fields.Integer(required=True)
    type = fields.String(required=True)
    data = EventData(required=True, metadata={"description": "`by`: the user name of who acted"})
    created_at = fields.DateTime(required=True)


class AttemptSchema(ma.Schema):
    attempt = fields.Integer(required=True)
    started_at = fields.DateTime(required=True)
    ended_at = fields.DateTime(allow_none=True, required=True)
    outcome = fields.String(
        required=True,
        metadata={
            "description": "running, succeeded, failed, timed out, timed out — still exiting, "
            "lease lost — worker died, cancelled"
        },
    )
    next = fields.String(
        allow_none=True,
        required=True,
        metadata={"description": "what the job did next: retry scheduled, requeued, failed, cancelled, interrupted"},
    )
    error = fields.String(allow_none=True, required=True)
    host = fields.String(allow_none=True, required=True, metadata={"description": "the host whose lease was lost"})


class AttemptListSchema(ma.Schema):
    items = fields.List(fields.Nested(AttemptSchema), required=True)


class EventsQuerySchema(ma.Schema):
    class Meta:
        unknown = ma.EXCLUDE

    after = fields.Integer(load_default=0, validate=validate.Range(min=0, max=2**62))
    limit = fields.Integer(load_default=100, validate=validate.Range(min=1, max=500))


class EventPageSchema(ma.Schema):
    items = fields.List(fields.Nested(EventSchema), required=True)
    next_after = fields.Integer(required=True, metadata={"description": "pass as `after` to read on"})


class KindFieldSchema(ma.Schema):
    name = fields.String(required=True)
    type = fields.String(required=True)
    label = fields.String(required=True)
    required = fields.Boolean(required=True)
    default = fields.Raw(allow_none=True)
    help = fields.String()
    unit = fields.String(allow_none=True)
    minimum = fields.Float(allow_none=True)
    maximum = fields.Float(allow_none=True)
    choices = fields.List(fields.String())


class KindSchema(ma.Schema):
    name = fields.String(required=True)
    title = fields.String(required=True)
    description = fields.String()
    queue = fields.String(required=True)
    fields_ = fields.List(fields.Nested(KindFieldSchema), data_key="fields", attribute="fields", required=True)
    payload_schema = fields.Dict(required=True, metadata={"description": "the payload's JSON Schema"})


class QueueSchema(ma.Schema):
    queue = fields.String(required=True)
    broker = fields.String(required=True, metadata={"description": "sqlite, redis or rabbitmq"})
    ready = fields.Integer(required=True)
    delayed = fields.Integer(allow_none=True, required=True, metadata={"description": "null: the broker cannot tell"})
    leased = fields.Integer(allow_none=True, required=True, metadata={"description": "in flight; null: unknown"})
    dead = fields.Integer(allow_none=True, required=True)
    oldest_ready_age_s = fields.Float(
        allow_none=True, required=True, metadata={"description": "lag (0: nothing waits; null: unknown)"}
    )
    consumers = fields.Integer(allow_none=True, required=True)
    paused = fields.Boolean(required=True)
    pause_unavailable = fields.String(
        allow_none=True, required=True, metadata={"description": "why this broker cannot pause queues"}
    )


class WaitingCountSchema(ma.Schema):
    queue = fields.String(required=True)
    reason = fields.String(
        required=True, validate=validate.OneOf(["fair_share", "concurrency", "rate", "steps"]),
        metadata={"description": "what the jobs wait for (steps: a workflow's earlier steps)"},
    )  # fmt: skip
    jobs = fields.Integer(required=True)


class LimitUsageSchema(ma.Schema):
    name = fields.String(required=True, metadata={"description": "the limit's name (its runtime settings' name)"})
    type = fields.String(required=True, validate=validate.OneOf(["concurrency", "rate"]))
    limit = fields.Integer(required=True, metadata={"description": "per key: running jobs, or starts per period"})
    period_s = fields.Float(allow_none=True, required=True, metadata={"description": "a rate limit's period"})
    in_use = fields.Integer(
        required=True, metadata={"description": "over all keys: running jobs, or starts in the last period"}
    )
    waiting = fields.Integer(required=True, metadata={"description": "jobs waiting for a key of this limit"})
    keys_at_limit = fields.Integer(required=True)


class FairShareSchema(ma.Schema):
    enabled = fields.Boolean(required=True)
    window = fields.Integer(required=True, metadata={"description": "ready jobs of one queue in the broker"})


class AdmissionSchema(ma.Schema):
    fair_share = fields.Nested(FairShareSchema, required=True)
    waiting = fields.List(fields.Nested(WaitingCountSchema), required=True)
    limits = fields.List(fields.Nested(LimitUsageSchema), required=True)


class PausedSchema(ma.Schema):
    queue = fields.String(required=True)
    paused = fields.Boolean(required=True)


class DeadQuerySchema(ma.Schema):
    class Meta:
        unknown = ma.EXCLUDE

    queue = fields.String(validate=validate.Length(max=ID_MAX))
    actor = fields.String(validate=validate.Length(max=ID_MAX))
    after_id = fields.Integer(load_default=0, validate=validate.Range(min=0, max=2**62))
    limit = fields.Integer(load_default=100, validate=validate.Range(min=1, max=500))


class DeadLetterSchema(ma.Schema):
    """A dead letter and a redacted preview of its message (never the raw body or its options)."""

    id = fields.Integer(required=True)
    queue = fields.String(required=True)
    message_id = fields.String(allow_none=True)
    actor = fields.String(allow_none=True)
    reason = fields.String(allow_none=True, metadata={"description": "why it died (redacted)"})
    deliveries = fields.Integer(allow_none=True)
    dead_at = fields.DateTime(allow_none=True)
    decoded = fields.Boolean(required=True, metadata={"description": "false: the body is not a readable message"})
    enqueued_at = fields.DateTime(allow_none=True)
    job_id = fields.String(allow_none=True, metadata={"description": "the job this message runs"})
    schedule = fields.String(allow_none=True, metadata={"description": "the schedule that fired it"})
    retries = fields.Integer(allow_none=True)
    error = fields.String(allow_none=True, metadata={"description": "the exception's last line (redacted)"})
    args = fields.List(fields.String(), required=True, metadata={"description": "arguments, redacted and truncated"})
    kwargs = fields.Dict(
        keys=fields.String(),
        values=fields.String(),
        required=True,
        metadata={"description": "keyword arguments, redacted and truncated; secret-named ones masked"},
    )


class DeadFilterSchema(ma.Schema):
    """Which dead letters a bulk replay or purge takes (every given condition holds)."""

    queue = fields.String(validate=validate.Length(min=1, max=ID_MAX))
    actor = fields.String(validate=validate.Length(min=1, max=ID_MAX))
    dead_before = fields.AwareDateTime(default_timezone=None, metadata={"description": "dead-lettered before"})


class DeadBulkSchema(ma.Schema):
    filter = fields.Nested(
        DeadFilterSchema, required=True, metadata={"description": "which dead letters (`{}` for all of them)"}
    )
    dry_run = JsonBoolean(load_default=False, metadata={"description": "only count what would be affected"})
    through_id = WholeNumber(
        validate=validate.Range(min=1, max=2**62),
        metadata={"description": "act on rows up to this id only: the `through_id` a dry run answered"},
    )
    limit = WholeNumber(load_default=1000, validate=validate.Range(min=1, max=10_000))


class DeadBulkResultSchema(ma.Schema):
    action = fields.String(required=True, validate=validate.OneOf(("replay", "purge")))
    dry_run = fields.Boolean(required=True)
    matched = fields.Integer(required=True, metadata={"description": "dead letters matching the filter"})
    affected = fields.Integer(required=True, metadata={"description": "replayed or purged (would be, on a dry run)"})
    through_id = fields.Integer(allow_none=True, metadata={"description": "the newest row counted"})
    ids = fields.List(fields.Integer(), required=True, metadata={"description": "dry run: the first 100 affected"})


class ReplaySchema(ma.Schema):
    queue = fields.String(required=True, validate=validate.Length(min=1, max=ID_MAX))
    ids = fields.List(
        WholeNumber(validate=validate.Range(min=1, max=2**62)),
        validate=validate.Length(max=1000),
        metadata={"description": "dead-letter ids; omit to replay the whole queue"},
    )


class ReplayResultSchema(ma.Schema):
    replayed = fields.Integer(required=True)


class WorkerSchema(ma.Schema):
    owner = fields.String(required=True)
    host = fields.String(allow_none=True)
    pid = fields.Integer(allow_none=True)
    queues = fields.List(fields.String(), required=True)
    started_at = fields.DateTime(allow_none=True)
    heartbeat_at = fields.DateTime(allow_none=True)
    leased = fields.Integer(required=True, metadata={"description": "messages in flight"})


class UncleanExitSchema(ma.Schema):
    owner = fields.String(required=True, metadata={"description": "the consumer process's lease-owner id"})
    host = fields.String(required=True)
    pid = fields.Integer(required=True)
    started_at = fields.DateTime(required=True)
    last_heartbeat_at = fields.DateTime(required=True)
    detected_at = fields.DateTime(required=True, metadata={"description": "when a later process found it dead"})


class AcknowledgeSchema(ma.Schema):
    owners = fields.List(
        fields.String(validate=validate.Length(min=1, max=ID_MAX)),
        required=True,
        validate=validate.Length(min=1, max=1000),
        metadata={"description": "the unclean exits to acknowledge (their `owner`)"},
    )


class AcknowledgedSchema(ma.Schema):
    acknowledged = fields.Integer(required=True, metadata={"description": "unclean exits removed"})


class WorkerSlotSchema(ma.Schema):
    role = fields.String(
        required=True, metadata={"description": "the supervisor's --role (worker, asr, scheduler, relay…)"}
    )
    host = fields.String(required=True)
    supervisor_pid = fields.Integer(required=True)
    slot = fields.Integer(required=True)
    state = fields.String(
        required=True, metadata={"description": "running, restarting (waiting out its backoff), given_up, stopped"}
    )
    pid = fields.Integer(allow_none=True, metadata={"description": "the child process now running in the slot"})
    restarts = fields.Integer(required=True, metadata={"description": "replacement processes started in the slot"})
    crashes = fields.Integer(required=True, metadata={"description": "crashes in a row"})
    last_exit = fields.String(allow_none=True, metadata={"description": "e.g. killed by SIGKILL, exited with code 1"})
    last_exit_at = fields.DateTime(allow_none=True)
    restart_at = fields.DateTime(allow_none=True)
    started_at = fields.DateTime(required=True)
    heartbeat_at = fields.DateTime(required=True)


class ScheduleFireSchema(ma.Schema):
    tick = fields.DateTime(required=True, metadata={"description": "the nominal tick (or the run-now instant)"})
    cause = fields.String(required=True, validate=validate.OneOf(("schedule", "catchup", "manual")))
    fired_at = fields.DateTime(required=True)
    due_at = fields.DateTime(required=True, metadata={"description": "delivery time: the tick plus jitter"})
    fired_by = OwnerName(required=True, metadata={"description": "the user who ran it now, or the scheduler"})
    job_id = fields.String(allow_none=True, metadata={"description": "the job this fire submitted"})
    message_id = fields.String(allow_none=True)
    duplicates = fields.Integer(
        required=True, metadata={"description": "other attempts at this tick, refused because it had fired"}
    )
    skipped = fields.Integer(
        required=True,
        metadata={"description": "scheduled ticks before this one that never fired (catch-up policy, grace)"},
    )
    skipped_more = fields.Boolean(required=True, metadata={"description": "more than `skipped` (counting stopped)"})
    skipped_from = fields.DateTime(allow_none=True, metadata={"description": "the earliest skipped tick"})


class ScheduleSchema(ma.Schema):
    name = fields.String(required=True)
    cron = fields.String(required=True)
    kind = fields.String(allow_none=True, metadata={"description": "the actor a fire sends a message to"})
    job_kind = fields.String(allow_none=True, metadata={"description": "the job kind a fire submits"})
    next_fire_at = fields.DateTime(
        allow_none=True, metadata={"description": "the next tick that will fire; null while paused"}
    )
    last_fire_at = fields.DateTime(allow_none=True)
    paused = fields.Boolean(required=True)
    paused_by = OwnerName(allow_none=True, metadata={"description": "the user name of who paused it"})
    paused_at = fields.DateTime(allow_none=True)
    queue = fields.String(allow_none=True)
    declared = fields.Boolean(required=True)
    catchup = fields.String(allow_none=True, validate=validate.OneOf(("latest", "all", "none")))
    grace_s = fields.Float(allow_none=True)
    jitter_s = fields.Float(allow_none=True)
    jitter_offset_s = fields.Float(required=True, metadata={"description": "this schedule's delay after each tick"})
    max_staleness_s = fields.Float(allow_none=True)
    fires = fields.List(
        fields.Nested(ScheduleFireSchema), required=True, metadata={"description": "the newest fires, newest first"}
    )


class FireSchema(ma.Schema):
    schedule = fields.String(required=True)
    job_id = fields.String(allow_none=True, required=True, metadata={"description": "for schedules that submit a job"})
    message_id = fields.String(allow_none=True, required=True)
    fired_at = fields.DateTime(required=True)


class SchedulePausedSchema(ma.Schema):
    name = fields.String(required=True)
    paused = fields.Boolean(required=True)


class ActivityQuerySchema(ma.Schema):
    class Meta:
        unknown = ma.EXCLUDE

    minutes = fields.Integer(
        validate=validate.Range(min=5, max=24 * 60),
        metadata={"description": "the last this many minutes, per minute (default 60; ignored with `window`)"},
    )
    window = fields.String(
        validate=validate.OneOf(tuple(WINDOWS)),
        metadata={"description": "1h (per minute), 24h (per hour) or 7d (per 6 hours)"},
    )
    group_by = fields.String(
        validate=validate.OneOf(GROUPS), metadata={"description": "one bucket per time and queue or kind"}
    )


class ActivityBucketSchema(ma.Schema):
    start = fields.DateTime(required=True)
    group = fields.String(allow_none=True, metadata={"description": "the queue or kind (with `group_by`)"})
    succeeded = fields.Integer(required=True)
    failed = fields.Integer(required=True, metadata={"description": "failed and interrupted"})
    cancelled = fields.Integer(required=True)
    wait_p50_s = fields.Float(allow_none=True)
    run_p50_s = fields.Float(allow_none=True)
    run_p95_s = fields.Float(
        allow_none=True, metadata={"description": "nearest-rank: one of the run times, never above `run_max_s`"}
    )
    run_max_s = fields.Float(allow_none=True)


class ComponentSchema(ma.Schema):
    status = fields.String(required=True, validate=validate.OneOf(("ok", "fail")))
    detail = fields.String(allow_none=True, metadata={"description": "admins only"})
    duration_ms = fields.Float(metadata={"description": "admins only"})


class HealthSchema(ma.Schema):
    status = fields.String(required=True, validate=validate.OneOf(("ok", "fail")))
    components = fields.Dict(keys=fields.String(), values=fields.Nested(ComponentSchema))


class UploadFilesSchema(ma.Schema):
    """``multipart/form-data``: one or more ``files`` parts (the recording's .flv/.mp4/.xml files)."""

    files = fields.List(
        fields.Raw(metadata={"type": "string", "format": "binary"}),
        required=True,
        validate=validate.Length(min=1, max=MAX_FILES),
        metadata={
            "description": "the recording's segment (.flv/.mp4) and danmaku (.xml) files, at least one segment; "
            "each part is checked beyond this schema: a plain file name with one of those extensions and the "
            "format's signature (FLV header, MP4 `ftyp` box, XML without DOCTYPE), else 422"
        },
    )


class UploadSchema(ma.Schema):
    """A stored upload: pass ``payload`` as an ``import_recording`` job's payload."""

    upload_id = fields.String(required=True)
    folder = fields.String(
        required=True, metadata={"description": "the upload's reference, `upload:<upload_id>` (no server path)"}
    )
    files = fields.List(fields.String(), required=True, metadata={"description": "the stored file names"})
    payload = fields.Dict(required=True, metadata={"description": '{"folder": <folder>} for import_recording'})
