"""Operators' endpoints: queues, dead letters, workers, schedules, activity.

Reading them needs ``metrics.read``; acting needs ``queues.pause`` (queues, run-now, unclean exits),
``dead_letters.manage`` or ``schedules.manage``. Every action is recorded in the audit log in the
transaction that does it (:func:`webapp.audit_log.audited`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import marshmallow as ma
from flask.views import MethodView
from marshmallow import fields, validate

from broker import DeadMatch

from .. import dead_letters, operations
from ..activity_windows import WINDOWS
from ..audit_log import audited
from ..auth import api_guard, require_identity
from ..errors import JobNotFoundError, NotFound
from ..permissions import permission
from ..services import services
from .blueprint import Blueprint
from .schemas import (
    ID_MAX,
    AcknowledgedSchema,
    AcknowledgeSchema,
    ActivityBucketSchema,
    ActivityQuerySchema,
    AdmissionSchema,
    DeadBulkResultSchema,
    DeadBulkSchema,
    DeadLetterSchema,
    DeadQuerySchema,
    FireSchema,
    JobSchema,
    PausedSchema,
    QueueSchema,
    ReplayResultSchema,
    ReplaySchema,
    SchedulePausedSchema,
    ScheduleSchema,
    UncleanExitSchema,
    WholeNumber,
    WorkerSchema,
    WorkerSlotSchema,
)


class PurgeSchema(ReplaySchema):
    ids = fields.List(
        WholeNumber(validate=validate.Range(min=1, max=2**62)),
        validate=validate.Length(max=1000),
        metadata={"description": "dead-letter ids; omit to purge the whole queue"},
    )


class PurgeResultSchema(ma.Schema):
    purged = fields.Integer(required=True)


blp = Blueprint("ops_api", __name__, url_prefix="/api/v1", description="Operations (operators and admins)")
blp.before_request(api_guard)

READ = "metrics.read"


def _queue_name(name: str) -> str:
    if not name or len(name) > ID_MAX:
        raise NotFound(f"No queue named {name[:ID_MAX]!r}.")
    return name


@blp.route("/queues")
class Queues(MethodView):
    @permission(READ)
    @blp.response(200, QueueSchema(many=True))
    def get(self):
        """Each queue's depth by state, lag, consumers and pause flag, from the broker's own counters."""
        return operations.queues(services().broker)


@blp.route("/admission")
class Admission(MethodView):
    @permission(READ)
    @blp.response(200, AdmissionSchema)
    def get(self):
        """What waits for admission per queue and reason (jobs without a broker message yet), fair share's
        settings, and each concurrency and rate limit's use over its keys."""
        return services().jobs.admission()


@blp.route("/queues/<name>/pause")
class QueuePause(MethodView):
    @permission("queues.pause", audit_as="queue.pause")
    @blp.response(200, PausedSchema)
    @blp.alt_response(409, schema=None, description="pause_unavailable: this broker cannot pause queues (the reason)")
    def post(self, name: str):
        """Stop claims on the queue; its messages wait (409 with the reason when the broker cannot pause)."""
        with audited("queue.pause", target_type="queue", target=name) as act:
            return operations.set_paused(services().broker, _queue_name(name), True, act=act)


@blp.route("/queues/<name>/resume")
class QueueResume(MethodView):
    @permission("queues.pause", audit_as="queue.resume")
    @blp.response(200, PausedSchema)
    @blp.alt_response(409, schema=None, description="pause_unavailable: this broker cannot pause queues (the reason)")
    def post(self, name: str):
        """Resume claims on the queue."""
        with audited("queue.resume", target_type="queue", target=name) as act:
            return operations.set_paused(services().broker, _queue_name(name), False, act=act)


@blp.route("/dead")
class Dead(MethodView):
    @permission(READ)
    @blp.arguments(DeadQuerySchema, location="query")
    @blp.response(200, DeadLetterSchema(many=True))
    def get(self, args):
        """Dead letters, oldest first (``after_id`` pages on), each with a redacted preview of its message."""
        return dead_letters.dead_letters(
            services().broker,
            args.get("queue"),
            after_id=args["after_id"],
            limit=args["limit"],
            actor=args.get("actor"),
        )


@blp.route("/dead/replay")
class DeadReplay(MethodView):
    @permission("dead_letters.manage", audit_as="dead_letters.replay")
    @blp.arguments(ReplaySchema)
    @blp.response(200, ReplayResultSchema)
    def post(self, args):
        """Move dead letters (all of a queue, or the given ids) back to ready."""
        ids = args.get("ids")
        with audited("dead_letters.replay", target_type="queue", target=args["queue"], details={"ids": ids}) as act:
            replayed = dead_letters.replay(services().broker, args["queue"], ids, act=act)
            act.note(replayed=replayed)
        return {"replayed": replayed}


def run_dead_bulk(action: str, args: dict[str, Any]) -> dict[str, Any]:
    f = args["filter"]
    match = DeadMatch(
        queue=f.get("queue"),
        actor=f.get("actor"),
        dead_before=round(f["dead_before"].timestamp() * 1000) if f.get("dead_before") else None,
        through_id=args.get("through_id"),
    )
    broker = services().broker
    if args["dry_run"]:
        return dead_letters.bulk(broker, action, match, dry_run=True, limit=args["limit"])
    details = {"filter": f, "through_id": args.get("through_id"), "limit": args["limit"]}
    with audited(f"dead_letters.bulk_{action}", target_type="dead_letters", details=details) as act:
        result = dead_letters.bulk(broker, action, match, dry_run=False, limit=args["limit"], act=act)
        act.note(matched=result["matched"], affected=result["affected"])
    return result


@blp.route("/dead/bulk/replay")
class DeadBulkReplay(MethodView):
    @permission("dead_letters.manage", audit_as="dead_letters.bulk_replay")
    @blp.arguments(DeadBulkSchema)
    @blp.response(200, DeadBulkResultSchema)
    def post(self, args):
        """Replay every dead letter matching the filter (any queue), oldest first; ``dry_run`` only counts.

        Confirm a dry run with its ``through_id`` to act only on what it counted."""
        return run_dead_bulk("replay", args)


@blp.route("/dead/bulk/purge")
class DeadBulkPurge(MethodView):
    @permission("dead_letters.manage", audit_as="dead_letters.bulk_purge")
    @blp.arguments(DeadBulkSchema)
    @blp.response(200, DeadBulkResultSchema)
    def post(self, args):
        """Delete every dead letter matching the filter, oldest first; ``dry_run`` only counts.

        Confirm a dry run with its ``through_id`` to act only on what it counted."""
        return run_dead_bulk("purge", args)


@blp.route("/dead/purge")
class DeadPurge(MethodView):
    @permission("dead_letters.manage", audit_as="dead_letters.purge")
    @blp.arguments(PurgeSchema)
    @blp.response(200, PurgeResultSchema)
    def post(self, args):
        """Delete dead letters (all of a queue, or the given ids) for good."""
        ids = args.get("ids")
        with audited("dead_letters.purge", target_type="queue", target=args["queue"], details={"ids": ids}) as act:
            purged = dead_letters.purge(services().broker, args["queue"], ids, act=act)
            act.note(purged=purged)
        return {"purged": purged}


@blp.route("/jobs/<job_id>/run-now")
class JobRunNow(MethodView):
    @permission("queues.pause", audit_as="job.run_now")
    @blp.response(200, JobSchema)
    @blp.alt_response(409, schema=None, description="the job is not queued with a wait (a delay or a retry's backoff)")
    def post(self, job_id: str):
        """Start a queued job now instead of after its delay or retry backoff."""
        identity = require_identity()
        if not job_id or len(job_id) > ID_MAX:
            raise JobNotFoundError()
        with audited("job.run_now", target_type="job", target=job_id) as act:
            services().jobs.run_now(identity.scope, job_id, by=identity.user.owner_id, session=act.session)
        return services().jobs.get(identity.scope, job_id)


@blp.route("/workers")
class Workers(MethodView):
    @permission(READ)
    @blp.response(200, WorkerSchema(many=True))
    def get(self):
        """Live worker processes with their queues and in-flight messages."""
        return operations.workers(services().broker)


@blp.route("/workers/unclean-exits")
class UncleanExits(MethodView):
    @permission(READ)
    @blp.response(200, UncleanExitSchema(many=True))
    @blp.alt_response(503, schema=None, description="the broker keeps no unclean-exit marker (Redis, RabbitMQ)")
    def get(self):
        """Worker processes that ended without closing the broker (SIGKILL, OOM, a crash), newest first,
        until acknowledged (SQLite broker)."""
        return operations.unclean_exits(services().broker)


@blp.route("/workers/unclean-exits/acknowledge")
class UncleanExitsAcknowledge(MethodView):
    @permission("queues.pause", audit_as="workers.acknowledge")
    @blp.arguments(AcknowledgeSchema)
    @blp.response(200, AcknowledgedSchema)
    def post(self, args):
        """Acknowledge unclean exits: they leave the Workers page and readiness."""
        by = require_identity().user.username
        owners = args["owners"]
        with audited("workers.acknowledge", target_type="workers", details={"owners": owners[:100]}) as act:
            count = operations.acknowledge_unclean_exits(services().broker, owners, by=by, act=act)
            act.note(acknowledged=count)
        return {"acknowledged": count}


@blp.route("/workers/slots")
class WorkerSlots(MethodView):
    @permission(READ)
    @blp.response(200, WorkerSlotSchema(many=True))
    def get(self):
        """Every live supervisor's slots (any broker): restarts, crashes in a row, slots given up."""
        return operations.worker_slots(services().worker_slots())


@blp.route("/schedules")
class Schedules(MethodView):
    @permission(READ)
    @blp.response(200, ScheduleSchema(many=True))
    def get(self):
        """Declared schedules with their next and last fire times."""
        return services().jobs.schedules()


@blp.route("/schedules/<name>/run")
class ScheduleRun(MethodView):
    @permission("schedules.manage", audit_as="schedule.run")
    @blp.response(201, FireSchema)
    def post(self, name: str):
        """Fire a schedule once now (outside its cron; also while paused)."""
        identity = require_identity()
        with audited("schedule.run", target_type="schedule", target=name) as act:
            fire = services().jobs.run_schedule_now(
                _queue_name(name), owner_id=identity.user.owner_id, session=act.session
            )
            act.note(job_id=fire["job_id"], message_id=fire["message_id"])
        return fire


@blp.route("/schedules/<name>/pause")
class SchedulePause(MethodView):
    @permission("schedules.manage", audit_as="schedule.pause")
    @blp.response(200, SchedulePausedSchema)
    def post(self, name: str):
        """Stop firing the schedule (every scheduler process, from its next tick)."""
        identity = require_identity()
        with audited("schedule.pause", target_type="schedule", target=name) as act:
            return services().jobs.set_schedule_paused(
                _queue_name(name), True, by=identity.user.owner_id, session=act.session
            )


@blp.route("/schedules/<name>/resume")
class ScheduleResume(MethodView):
    @permission("schedules.manage", audit_as="schedule.resume")
    @blp.response(200, SchedulePausedSchema)
    def post(self, name: str):
        """Fire the schedule again from its next tick (ticks missed while paused never fire)."""
        identity = require_identity()
        with audited("schedule.resume", target_type="schedule", target=name) as act:
            return services().jobs.set_schedule_paused(
                _queue_name(name), False, by=identity.user.owner_id, session=act.session
            )


@blp.route("/activity")
class Activity(MethodView):
    @permission(READ)
    @blp.arguments(ActivityQuerySchema, location="query")
    @blp.response(200, ActivityBucketSchema(many=True))
    def get(self, args):
        """Finished jobs per bucket (throughput, failures, latency) over a ``window`` or the last ``minutes``,
        by queue or kind with ``group_by``."""
        window = WINDOWS.get(args.get("window", ""))
        span_s, bucket_s = (window.span_s, window.bucket_s) if window else (args.get("minutes", 60) * 60, 60)
        since = datetime.now(UTC) - timedelta(seconds=span_s)
        return services().jobs.activity(None, since=since, bucket_s=bucket_s, group_by=args.get("group_by"))
