"""The UI's job pages: lists with filters and bulk actions, a job's page and partials, submit forms.

Every page and action names the permission it needs (:func:`webapp.permissions.permission`); the
templates show only the buttons and forms the caller may use (``can``). Cancel, retry, delete and the
bulk actions run in one transaction with their audit record (:func:`webapp.audit_log.audited`)."""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from flask import flash, g, redirect, render_template, request, send_file, url_for

from .. import job_search
from ..audit_log import audited
from ..auth import READ_ALL
from ..bulk import bulk_apply
from ..errors import ApiError, Conflict, Forbidden, Invalid, JobNotFoundError, NotFound
from ..gateway import STATUSES, JobQuery, JobView, Page
from ..job_search import SearchInvalid
from ..owners import owner_filter, prefetch_owner_names
from ..permissions import permission, require
from ..services import services
from ..uploads import UPLOAD_KIND, UploadTooLarge, upload_max_bytes
from ..uploads import store as store_upload
from .blueprint import PAGE_SIZE, bp
from .dag import dag_svg
from .forms import EmptyForm, datetime_field, payload_from, submit_form_for


def _is_htmx() -> bool:
    return request.headers.get("HX-Request") == "true"


def _filters(args: Any = None) -> tuple[JobQuery, dict[str, Any]]:
    """The list filters from the query string (or a form) and the search box's qualifiers
    (:mod:`webapp.job_search`); invalid values are dropped, never a 500.

    Raises:
      SearchInvalid, Forbidden: The search box cannot be understood (the page shows why).
    """
    args = request.args if args is None else args
    statuses = tuple(s for s in args.getlist("status") if s in STATUSES)
    created_after = datetime_field(args.get("created_after"))
    created_before = datetime_field(args.get("created_before"))
    owner = (args.get("owner") or "").strip()[:100] if READ_ALL in g.identity.permissions else ""
    owner_id = owner_filter(owner) if owner else None  # admins type a user name; jobs carry the user's id
    query = JobQuery(
        statuses=statuses,
        kind=(args.get("kind") or "").strip()[:100] or None,
        queue=(args.get("queue") or "").strip()[:100] or None,
        owner_id=owner_id,
        created_after=created_after,
        created_before=created_before,
        top_level=args.get("group") == "1",
    )
    q = (args.get("q") or "").strip()[: job_search.MAX_QUERY_CHARS]
    shown = {
        "status": statuses,
        "kind": query.kind or "",
        "queue": query.queue or "",
        "owner": owner,
        "q": q,
        "group": query.top_level,
        "created_after": args.get("created_after", "") if created_after else "",
        "created_before": args.get("created_before", "") if created_before else "",
    }
    return job_search.apply(job_search.parse(q), query, g.identity, services().engine), shown


@bp.route("/")
@permission("jobs.read_own")
def index():
    return redirect(url_for("ui.jobs"))


@bp.route("/jobs")
@permission("jobs.read_own")
def jobs():
    search_error = None
    try:
        query, shown = _filters()
    except (SearchInvalid, Forbidden) as exc:
        # The list shows the reason and no jobs: a list that ignored part of the search would mislead.
        search_error = exc.message
        shown = {"q": request.args.get("q", "")[: job_search.MAX_QUERY_CHARS], "status": (), "group": False}
        shown |= {key: "" for key in ("kind", "queue", "owner", "created_after", "created_before")}
        page, steps = Page([], None), {}
    else:
        cursor = request.args.get("cursor") or None
        page = services().jobs.list_jobs(g.identity.scope, query, cursor=cursor, limit=PAGE_SIZE)
        steps = services().jobs.steps_of(g.identity.scope, [j.id for j in page.items]) if query.top_level else {}
        if READ_ALL in g.identity.permissions:  # the owner column: every name of the page in one query
            prefetch_owner_names([j.owner_id for j in page.items] + [s.owner_id for v in steps.values() for s in v])
    kinds = services().jobs.kinds()
    template = "_job_table.html" if _is_htmx() else "jobs.html"
    args = {k: v for k, v in request.args.to_dict(flat=False).items() if k != "cursor"}
    next_url = (
        url_for("ui.jobs", **{**request.args.to_dict(flat=False), "cursor": page.next_cursor})
        if page.next_cursor
        else None
    )
    return render_template(
        template,
        page=page,
        steps=steps,
        filters=shown,
        kinds=kinds,
        suggestions=_suggestions(kinds),
        search_error=search_error,
        form=EmptyForm(),
        next_url=next_url,
        args=args,
    )


def _suggestions(kinds: list[Any]) -> list[str]:
    """What the search box suggests: each qualifier, each status, kind and queue as a qualifier."""
    queues = sorted({k.queue for k in kinds})
    return [
        *(f"{name}:" for name in job_search.QUALIFIERS),
        *(f"status:{s}" for s in STATUSES),
        *(f"kind:{k.name}" for k in kinds),
        *(f"queue:{q}" for q in queues),
    ]


def _detail(template: str, job_id: str, notice: tuple[str, str] | None = None):  # type: ignore[no-untyped-def]
    record = services().jobs.get(g.identity.scope, job_id)
    events = services().jobs.events(g.identity.scope, job_id, after=0, limit=500)
    attempts = services().jobs.attempts(g.identity.scope, job_id)
    return render_template(
        template,
        job=record,
        events=events,
        attempts=attempts,
        form=EmptyForm(),
        notice=notice,
        **_workflow_context(record),
    )


def _workflow_context(job: JobView) -> dict[str, Any]:
    """What the workflow section shows: the DAG, its outputs, and the step name of a step's parent."""
    workflow = services().jobs.workflow(g.identity.scope, job.id)
    outputs = []
    for step in workflow.steps if workflow else ():
        files = [_output(step.job, name) for name in step.job.files]
        if files:
            outputs.append({"step": step, "files": files})
    return {
        "workflow": workflow,
        "dag": dag_svg(workflow, lambda i: url_for("ui.job", job_id=i)) if workflow else None,
        "outputs": outputs,
    }


#: Files the page shows inline (served by :func:`media`, never as HTML); others are downloads.
INLINE_MEDIA = {".mp4": "video/mp4", ".webm": "video/webm", ".jpg": "image/jpeg", ".png": "image/png"}


def _output(job: JobView, name: str) -> dict[str, Any]:
    suffix = PurePath(name).suffix.lower()
    kind = {".mp4": "video", ".webm": "video", ".jpg": "image", ".png": "image", ".srt": "transcript"}.get(suffix)
    cues = services().jobs.transcript(g.identity.scope, job.id, name) if kind == "transcript" else []
    return {"name": name, "kind": kind or "file", "cues": cues, "stem": PurePath(name).stem}


@bp.route("/jobs/<job_id>/workflow")
@permission("jobs.read_own")
def job_workflow(job_id: str):
    """The live workflow section of a workflow's page (its DAG and its steps' outputs)."""
    record = services().jobs.get(g.identity.scope, job_id)
    return render_template("_workflow.html", job=record, **_workflow_context(record))


@bp.route("/jobs/<job_id>/media/<path:name>")
@permission("jobs.read_own")
def media(job_id: str, name: str):
    """A video or picture one of the job's outputs is, inline (with range requests) for the page to play."""
    mimetype = INLINE_MEDIA.get(PurePath(name).suffix.lower())
    if mimetype is None:
        raise NotFound("Only videos and pictures are shown inline; download other files.")
    path = services().jobs.output_file(g.identity.scope, job_id, name)
    return send_file(path, mimetype=mimetype, conditional=True)


@bp.route("/jobs/<job_id>")
@permission("jobs.read_own")
def job(job_id: str):
    return _detail("job.html", job_id)


@bp.route("/jobs/<job_id>/panel")
@permission("jobs.read_own")
def job_panel(job_id: str):
    """The live part of the detail page (status, progress, buttons, result, attempts, timeline)."""
    return _detail("_job_panel.html", job_id)


@bp.route("/jobs/<job_id>/row")
@permission("jobs.read_own")
def job_row(job_id: str):
    record = services().jobs.get(g.identity.scope, job_id)
    return render_template("_job_row.html", job=record)


def _after_action(job_id: str, message: str, category: str):  # type: ignore[no-untyped-def]
    """htmx swaps the panel (the message goes inside it); a plain form post redirects with a flash."""
    if _is_htmx():
        return _detail("_job_panel.html", job_id, notice=(category, message))
    flash(message, category)
    return redirect(url_for("ui.job", job_id=job_id))


@bp.route("/jobs/<job_id>/cancel", methods=["POST"])
@permission("jobs.cancel", audit_as="job.cancel")
def cancel(job_id: str):
    try:
        with audited("job.cancel", target_type="job", target=job_id) as act:
            _, outcome = services().jobs.cancel(
                g.identity.scope, job_id, by=g.identity.user.owner_id, session=act.session
            )
            act.note(outcome=outcome)
    except Conflict as exc:
        return _after_action(job_id, exc.message, "error")
    message = "Cancelled." if outcome == "cancelled" else "Cancel requested; the job stops at its next checkpoint."
    return _after_action(job_id, message, "info")


@bp.route("/jobs/<job_id>/retry", methods=["POST"])
@permission("jobs.retry", audit_as="job.retry")
def retry(job_id: str):
    try:
        with audited("job.retry", target_type="job", target=job_id) as act:
            new, created = services().jobs.retry(
                g.identity.scope, job_id, by=g.identity.user.owner_id, session=act.session
            )
            act.note(retry=new.id, created=created)
    except Conflict as exc:
        return _after_action(job_id, exc.message, "error")
    flash(f"Retrying as job {new.id}." if created else f"Already retried as job {new.id}.", "info")
    return redirect(url_for("ui.job", job_id=new.id))


@bp.route("/jobs/<job_id>/delete", methods=["POST"])
@permission("jobs.cancel", audit_as="job.delete")
def delete(job_id: str):
    try:
        with audited("job.delete", target_type="job", target=job_id) as act:
            deleted = services().jobs.delete(g.identity.scope, job_id, by=g.identity.user.owner_id, session=act.session)
            act.note(deleted=deleted)
    except Conflict as exc:
        return _after_action(job_id, exc.message, "error")
    steps = f" and its {len(deleted) - 1} step(s)" if len(deleted) > 1 else ""
    flash(f"Deleted job {job_id}{steps}.", "info")
    if _is_htmx():
        response = redirect(url_for("ui.jobs"))
        response.headers["HX-Redirect"] = url_for("ui.jobs")
        return response
    return redirect(url_for("ui.jobs"))


@bp.route("/jobs/bulk", methods=["POST"])
@permission("jobs.bulk")
def bulk():
    action = request.form.get("action")
    ids = [i for i in request.form.getlist("ids") if i][:500]
    if action not in ("cancel", "retry") or not ids:
        flash("Select jobs and an action.", "error")
        return redirect(url_for("ui.jobs"))
    require(f"jobs.{action}", audit_as=f"jobs.bulk_{action}")
    done = skipped = 0
    with audited(f"jobs.bulk_{action}", target_type="jobs", details={"selected": len(ids)}) as act:
        for job_id in ids:
            try:
                with act.session.begin_nested():  # a job that cannot be changed does not undo the others
                    if action == "cancel":
                        services().jobs.cancel(
                            g.identity.scope, job_id, by=g.identity.user.owner_id, session=act.session
                        )
                    elif not services().jobs.retry(
                        g.identity.scope, job_id, by=g.identity.user.owner_id, session=act.session
                    )[1]:
                        skipped += 1  # retried before: its earlier retry was answered, nothing new started
                        continue
                done += 1
            except (Conflict, JobNotFoundError):
                skipped += 1
        act.note(affected=done, skipped=skipped)
    verb = "Cancelled" if action == "cancel" else "Retried"
    flash(
        f"{verb} {done} job(s)"
        + (f"; {skipped} skipped (not allowed in their status, or retried before)." if skipped else "."),
        "info",
    )
    return redirect(
        request.form.get("back") if (request.form.get("back") or "").startswith("/jobs") else url_for("ui.jobs")
    )


@bp.route("/jobs/bulk-by-filter", methods=["GET", "POST"])
@permission("jobs.bulk")
def bulk_by_filter():
    """Cancel or retry every job matching the list's filters: GET shows the dry-run count, POST acts."""
    action = request.values.get("action")
    if action not in ("cancel", "retry"):
        flash("Unknown bulk action.", "error")
        return redirect(url_for("ui.jobs"))
    require(f"jobs.{action}", audit_as=f"jobs.bulk_{action}")
    try:
        query, shown = _filters(request.args if request.method == "GET" else request.form)
    except (SearchInvalid, Forbidden) as exc:
        flash(exc.message, "error")
        return redirect(url_for("ui.jobs"))
    if request.method == "GET":
        result = bulk_apply(
            services().jobs, g.identity.scope, g.identity.user.owner_id, query, action, limit=1000, dry_run=True
        )
        return render_template("bulk_confirm.html", action=action, result=result, filters=shown, form=EmptyForm())
    filters = {k: v for k, v in shown.items() if v}
    with audited(f"jobs.bulk_{action}", target_type="jobs", details={"filter": filters, "limit": 1000}) as act:
        result = bulk_apply(
            services().jobs,
            g.identity.scope,
            g.identity.user.owner_id,
            query,
            action,
            limit=1000,
            dry_run=False,
            session=act.session,
        )
        act.note(matched=result["matched"], affected=result["affected"], skipped=result["skipped"])
    verb = "Cancelled" if action == "cancel" else "Retried"
    flash(f"{verb} {result['affected']} of {result['matched']} matching job(s).", "info")
    return redirect(url_for("ui.jobs"))


@bp.route("/jobs/<job_id>/files/<path:name>")
@permission("jobs.read_own")
def download(job_id: str, name: str):
    path = services().jobs.output_file(g.identity.scope, job_id, name)
    return send_file(path, as_attachment=True, download_name=path.name)


class UploadRejected(Exception):
    """An upload failed its checks; the form shows every reason (nothing was stored)."""

    def __init__(self, exc: ApiError) -> None:
        details = exc.details if isinstance(exc.details, dict) else {}
        reasons = [str(m) for ms in details.values() for m in (ms if isinstance(ms, list) else [ms])]
        self.reasons = [exc.message, *reasons]
        super().__init__(exc.message)


@bp.route("/submit")
@permission("jobs.submit")
def submit_index():
    return render_template("submit_index.html", kinds=services().jobs.kinds())


@bp.route("/submit/<kind_name>", methods=["GET", "POST"])
@permission("jobs.submit")
def submit(kind_name: str):
    kinds = {k.name: k for k in services().jobs.kinds()}
    kind = kinds.get(kind_name)
    if kind is None:
        raise JobNotFoundError(f"No job kind named {kind_name!r}.")
    form = submit_form_for(kind, request.form if request.method == "POST" else None)
    # A form shown again with its validation messages is a 200 page (a 4xx would be a console error).
    if request.method == "POST":
        if form.validate():
            try:
                payload = payload_from(kind, form)
                uploaded = [f for f in request.files.getlist("upload") if f and f.filename]
                if kind.name == UPLOAD_KIND and uploaded:
                    # Validated as a whole before anything is written; the job imports the stored folder.
                    try:
                        upload = store_upload(
                            services().output_root, g.identity.user.owner_id, uploaded, upload_max_bytes()
                        )
                    except (Invalid, UploadTooLarge) as exc:
                        raise UploadRejected(exc) from None
                    payload = {k: v for k, v in payload.items() if k not in ("folder", "files")}
                    payload["folder"] = upload.reference
                record, created = services().jobs.submit(
                    owner_id=g.identity.user.owner_id,
                    kind=kind.name,
                    payload=payload,
                    idempotency_key=form.idempotency_key.data or None,
                    priority=form.priority.data or 0,
                    delay_s=form.delay_s.data or 0.0,
                )
            except UploadRejected as exc:
                form.form_errors.extend(exc.reasons)
            except Invalid as exc:
                _attach_errors(form, exc)
            except Conflict as exc:
                form.form_errors.append(exc.message)
            else:
                flash(f"Submitted job {record.id}." if created else f"Already submitted as job {record.id}.", "info")
                return redirect(url_for("ui.job", job_id=record.id))
    return render_template("submit.html", kind=kind, form=form, upload=kind.name == UPLOAD_KIND)


def _attach_errors(form: Any, exc: ApiError) -> None:
    details = exc.details if isinstance(exc.details, dict) else {}
    attached = False
    for name, messages in details.items():
        field = getattr(form, f"p_{name}", None)
        if field is not None:
            field.errors = list(field.errors) + [
                str(m) for m in (messages if isinstance(messages, list) else [messages])
            ]
            attached = True
    if not attached:
        form.form_errors.append(exc.message)
