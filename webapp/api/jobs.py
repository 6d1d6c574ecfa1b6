"""``/api/v1/jobs``: submit, list, get, cancel, retry, events, bulk actions; ``/api/v1/kinds``."""

from __future__ import annotations

from typing import Any

from flask import jsonify, send_file
from flask.views import MethodView
from werkzeug.datastructures import FileStorage

from .. import job_search
from ..audit_log import audited
from ..auth import READ_ALL, api_guard, require_identity
from ..bulk import bulk_apply
from ..errors import Forbidden, JobNotFoundError
from ..gateway import JobQuery
from ..owners import owner_filter
from ..permissions import permission, require
from ..services import services
from ..uploads import store as store_upload
from ..uploads import upload_max_bytes
from .blueprint import Blueprint
from .schemas import (
    ID_MAX,
    AttemptListSchema,
    BulkResultSchema,
    BulkSchema,
    CancelResultSchema,
    DeletedSchema,
    EventPageSchema,
    EventsQuerySchema,
    IdempotencyHeaderSchema,
    JobListQuerySchema,
    JobPageSchema,
    JobSchema,
    KindSchema,
    SubmitSchema,
    UploadFilesSchema,
    UploadSchema,
)

blp = Blueprint("jobs_api", __name__, url_prefix="/api/v1", description="Jobs: submit, watch, cancel, retry")
blp.before_request(api_guard)


def _job_id(job_id: str) -> str:
    # An absurd id cannot exist; answer exactly like any other missing job.
    if not job_id or len(job_id) > ID_MAX:
        raise JobNotFoundError()
    return job_id


def query_from(args: dict[str, Any]) -> JobQuery:
    """A :class:`JobQuery` from validated filter arguments and the search grammar of ``q``
    (:mod:`webapp.job_search`); ``owner`` (a user name) only for callers who see every owner's jobs."""
    identity = require_identity()
    owner = args.get("owner")
    if owner and READ_ALL not in identity.permissions:
        raise Forbidden(f"Filtering by owner needs the {READ_ALL} permission.")
    query = JobQuery(
        statuses=tuple(args.get("status") or ()),
        kind=args.get("kind") or None,
        queue=args.get("queue") or None,
        owner_id=owner_filter(owner) if owner else None,
        created_after=args.get("created_after"),
        created_before=args.get("created_before"),
        parent_job_id=args.get("parent") or None,
    )
    return job_search.apply(job_search.parse(args.get("q") or ""), query, identity, services().engine)


@blp.route("/kinds")
class Kinds(MethodView):
    @permission("jobs.read_own")
    @blp.response(200, KindSchema(many=True))
    def get(self):
        """Job kinds that can be submitted, with their input fields."""
        return services().jobs.kinds()


@blp.route("/jobs")
class Jobs(MethodView):
    @permission("jobs.read_own")
    @blp.arguments(JobListQuerySchema, location="query")
    @blp.response(200, JobPageSchema)
    def get(self, args):
        """List jobs (your own; with jobs.read_all everyone's), newest first, with cursor pagination."""
        identity = require_identity()
        page = services().jobs.list_jobs(
            identity.scope, query_from(args), cursor=args.get("cursor"), limit=args["limit"]
        )
        return {"items": page.items, "next_cursor": page.next_cursor}

    @permission("jobs.submit")
    @blp.arguments(IdempotencyHeaderSchema, location="headers")
    @blp.arguments(SubmitSchema)
    @blp.response(201, JobSchema, description="created")
    @blp.alt_response(200, schema=JobSchema, description="the job this idempotency key already created")
    @blp.alt_response(409, schema=None, description="the idempotency key was used for a different request")
    def post(self, headers, body):
        """Submit a job. With ``Idempotency-Key``, repeating the request returns the same job."""
        identity = require_identity()
        job, created = services().jobs.submit(
            owner_id=identity.user.owner_id,
            kind=body["kind"],
            payload=body["payload"],
            idempotency_key=headers.get("idempotency_key"),
            priority=body["priority"],
            delay_s=body["delay_s"],
        )
        return _job_answer(job, created)


def _job_answer(job: Any, created: bool) -> Any:
    """A job that may or may not be new: 201 when this request made it, 200 when an earlier one did."""
    response = jsonify(JobSchema().dump(job))
    response.status_code = 201 if created else 200
    response.headers["Location"] = f"/api/v1/jobs/{job.id}"
    return response


@blp.route("/jobs/<job_id>")
class JobById(MethodView):
    @permission("jobs.read_own")
    @blp.response(200, JobSchema)
    def get(self, job_id: str):
        """One job (404 when missing or not yours)."""
        return services().jobs.get(require_identity().scope, _job_id(job_id))

    @permission("jobs.cancel", audit_as="job.delete")
    @blp.response(200, DeletedSchema)
    @blp.alt_response(409, schema=None, description="the job has not finished, is a workflow step, or is referred to")
    def delete(self, job_id: str):
        """Delete a finished job (a workflow with its steps), its events and files: its owner, or anyone
        who sees every owner's jobs.

        A job that is queued or running, a step of a workflow (delete the workflow) or a job another
        job refers to (its retry) answers 409 with the reason; another user's job 404, like a missing one."""
        identity = require_identity()
        with audited("job.delete", target_type="job", target=job_id) as act:
            deleted = services().jobs.delete(
                identity.scope, _job_id(job_id), by=identity.user.owner_id, session=act.session
            )
            act.note(deleted=deleted)
        return {"deleted": deleted}


@blp.route("/jobs/<job_id>/cancel")
class JobCancel(MethodView):
    @permission("jobs.cancel", audit_as="job.cancel")
    @blp.response(200, CancelResultSchema)
    @blp.alt_response(409, schema=None, description="the job already finished")
    def post(self, job_id: str):
        """Cancel: a queued job ends at once; a running one at its next checkpoint."""
        identity = require_identity()
        with audited("job.cancel", target_type="job", target=job_id) as act:
            job, outcome = services().jobs.cancel(
                identity.scope, _job_id(job_id), by=identity.user.owner_id, session=act.session
            )
            act.note(outcome=outcome)
        return {"outcome": outcome, "job": job}


@blp.route("/jobs/<job_id>/retry")
class JobRetry(MethodView):
    @permission("jobs.retry", audit_as="job.retry")
    @blp.response(201, JobSchema, description="the new job")
    @blp.alt_response(200, schema=JobSchema, description="the job was retried before: that retry, unchanged")
    @blp.alt_response(
        409, schema=None, description="the job's status does not allow a retry, or its execution is still exiting"
    )
    def post(self, job_id: str):
        """Retry a failed, cancelled or interrupted job as a NEW job (``retry_of_job_id`` set).

        A job is retried once: asking again returns the retry made the first time (200)."""
        identity = require_identity()
        with audited("job.retry", target_type="job", target=job_id) as act:
            job, created = services().jobs.retry(
                identity.scope, _job_id(job_id), by=identity.user.owner_id, session=act.session
            )
            act.note(retry=job.id, created=created)
        return _job_answer(job, created)


@blp.route("/jobs/<job_id>/attempts")
class JobAttempts(MethodView):
    @permission("jobs.read_own")
    @blp.response(200, AttemptListSchema)
    def get(self, job_id: str):
        """The job's attempts, oldest first: when each ran, how it ended, what happened next."""
        return {"items": services().jobs.attempts(require_identity().scope, _job_id(job_id))}


@blp.route("/jobs/<job_id>/events")
class JobEvents(MethodView):
    @permission("jobs.read_own")
    @blp.arguments(EventsQuerySchema, location="query")
    @blp.response(200, EventPageSchema)
    def get(self, args, job_id: str):
        """The job's timeline after sequence ``after``."""
        items = services().jobs.events(
            require_identity().scope, _job_id(job_id), after=args["after"], limit=args["limit"]
        )
        return {"items": items, "next_after": items[-1].sequence if items else args["after"]}


@blp.route("/jobs/<job_id>/files/<name>")
class JobFile(MethodView):
    @permission("jobs.read_own")
    @blp.response(
        200,
        {"type": "string", "format": "binary"},
        content_type="application/octet-stream",
        description="the file (one of the job's `files`)",
    )
    def get(self, job_id: str, name: str):
        """Download one of the files the job produced."""
        path = services().jobs.output_file(require_identity().scope, _job_id(job_id), name)
        return send_file(path, mimetype="application/octet-stream", as_attachment=True, download_name=path.name)


def run_bulk(action: str, args: dict[str, Any]) -> dict[str, Any]:
    """A bulk action over the filter: needs jobs.bulk (the route's) and the action's own permission.
    A dry run only counts; the action itself is recorded with its filter and counts."""
    audit_as = f"jobs.bulk_{action}"
    identity = require(f"jobs.{action}", audit_as=audit_as)
    assert identity is not None
    query = query_from(args["filter"])

    def run(session: Any = None) -> dict[str, Any]:
        return bulk_apply(
            services().jobs,
            identity.scope,
            identity.user.owner_id,
            query,
            action,
            limit=args["limit"],
            dry_run=args["dry_run"],
            session=session,
        )

    if args["dry_run"]:
        return run()
    with audited(audit_as, target_type="jobs", details={"filter": args["filter"], "limit": args["limit"]}) as act:
        result = run(act.session)
        act.note(matched=result["matched"], affected=result["affected"], skipped=result["skipped"])
    return result


@blp.route("/jobs/bulk/cancel")
class BulkCancel(MethodView):
    @permission("jobs.bulk", audit_as="jobs.bulk_cancel")
    @blp.arguments(BulkSchema)
    @blp.response(200, BulkResultSchema)
    def post(self, args):
        """Cancel every matching job that can still be cancelled (``dry_run`` only counts)."""
        return run_bulk("cancel", args)


@blp.route("/jobs/bulk/retry")
class BulkRetry(MethodView):
    @permission("jobs.bulk", audit_as="jobs.bulk_retry")
    @blp.arguments(BulkSchema)
    @blp.response(200, BulkResultSchema)
    def post(self, args):
        """Retry every matching failed/cancelled/interrupted job (``dry_run`` only counts)."""
        return run_bulk("retry", args)


@blp.route("/uploads")
class Uploads(MethodView):
    @permission("jobs.submit")
    @blp.arguments(UploadFilesSchema, location="files")
    @blp.response(201, UploadSchema, description="stored; submit import_recording with the returned payload")
    @blp.alt_response(413, schema=None, description="the upload exceeds UPLOAD_MAX_BYTES")
    def post(self, args):
        """Upload a recording's files (multipart ``files``: .flv/.mp4 segments and .xml danmaku).

        Every file is validated (name, extension, size, format signature) before anything is written.
        """
        identity = require_identity()  # the body's size limit: uploads.allow_upload_bodies
        parts = [f for f in args.get("files") or [] if isinstance(f, FileStorage)]
        upload = store_upload(services().output_root, identity.user.owner_id, parts, upload_max_bytes())
        return {
            "upload_id": upload.id,
            "folder": upload.reference,
            "files": list(upload.files),
            "payload": {"folder": upload.reference},
        }
