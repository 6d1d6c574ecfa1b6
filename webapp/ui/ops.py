"""Operations pages: overview with charts, queues, dead letters, workers, schedules.

Reading them needs ``metrics.read``; each action its own permission, and it runs in one transaction
with its audit record (:func:`webapp.audit_log.audited`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import flash, g, redirect, render_template, request, url_for

from broker import DeadMatch

from .. import dead_letters, operations
from ..activity_windows import DEFAULT_WINDOW, GROUPS, WINDOWS, Window
from ..audit_log import audited
from ..errors import ApiError
from ..gateway import ActivityBucket, FireView
from ..permissions import permission
from ..services import services
from .blueprint import bp
from .charts import GROUP_COLOURS, bar_chart, line_chart
from .forms import EmptyForm

READ = "metrics.read"


@bp.route("/ops")
@permission(READ)
def ops():
    window = WINDOWS.get(request.args.get("window", ""), WINDOWS[DEFAULT_WINDOW])
    group_by = request.args.get("group") if request.args.get("group") in GROUPS else None
    buckets = services().jobs.activity(
        None, since=datetime.now(UTC) - timedelta(seconds=window.span_s), bucket_s=window.bucket_s, group_by=group_by
    )
    per = _span_words(window.bucket_s)
    charts = _grouped_charts(buckets, window, per) if group_by else _charts(buckets, window, per)
    return render_template(
        "ops.html",
        charts=charts,
        window=window,
        windows=WINDOWS.values(),
        group_by=group_by or "",
        groups=GROUPS,
        queues=_safe(operations.queues),
        workers=_safe(operations.workers),
    )


def _span_words(bucket_s: int) -> str:
    return {60: "minute", 3600: "hour"}.get(bucket_s, f"{bucket_s // 3600} hours")


def _charts(buckets: Sequence[ActivityBucket], window: Window, per: str) -> list[Any]:
    labels = [b.start.strftime(window.label_format) for b in buckets]
    return [
        bar_chart(
            f"Throughput: finished jobs per {per}",
            labels,
            [
                ("succeeded", "s-ok", [b.succeeded for b in buckets]),
                ("failed", "s-bad", [b.failed for b in buckets]),
                ("cancelled", "s-muted", [b.cancelled for b in buckets]),
            ],
        ),
        line_chart(
            "Latency: queue wait and run time (seconds)",
            labels,
            [
                ("wait p50", "l-wait", [b.wait_p50_s for b in buckets]),
                ("run p50", "l-run", [b.run_p50_s for b in buckets]),
                ("run p95", "l-run95", [b.run_p95_s for b in buckets]),
                ("run max", "l-max", [b.run_max_s for b in buckets]),
            ],
            unit=" s",
        ),
        bar_chart(
            f"Failures per {per} (failed and interrupted)", labels, [("failed", "s-bad", [b.failed for b in buckets])]
        ),
    ]


def _grouped_charts(buckets: Sequence[ActivityBucket], window: Window, per: str) -> list[Any]:
    """One series per queue or kind (the buckets come group by group within each time bucket)."""
    groups = sorted({b.group or "" for b in buckets})
    starts = sorted({b.start for b in buckets})
    labels = [t.strftime(window.label_format) for t in starts]
    at = {(b.start, b.group or ""): b for b in buckets}

    def series(value: Callable[[ActivityBucket | None], float | None]) -> list[tuple[str, str, list[Any]]]:
        return [
            (g or "—", f"g{i % GROUP_COLOURS}", [value(at.get((t, g))) for t in starts]) for i, g in enumerate(groups)
        ]

    return [
        bar_chart(
            f"Throughput: finished jobs per {per}",
            labels,
            series(lambda b: b.succeeded + b.failed + b.cancelled if b else 0),
        ),
        line_chart("Run time p95 (seconds)", labels, series(lambda b: b.run_p95_s if b else None), unit=" s"),
        bar_chart(f"Failures per {per} (failed and interrupted)", labels, series(lambda b: b.failed if b else 0)),
    ]


def _safe(fn):  # type: ignore[no-untyped-def]
    try:
        return fn(services().broker)
    except ApiError:
        return None  # the broker has no such operation (Redis/RabbitMQ): the page says so


@bp.route("/ops/queues")
@permission(READ)
def ops_queues():
    return render_template(
        "ops_queues.html", queues=_safe(operations.queues), admission=services().jobs.admission(), form=EmptyForm()
    )


@bp.route("/ops/queues/<name>/<action>", methods=["POST"])
@permission("queues.pause", audit_as="queue.{action}")
def ops_queue_action(name: str, action: str):
    if action not in ("pause", "resume"):
        raise ApiError("Unknown action.")
    try:
        with audited(f"queue.{action}", target_type="queue", target=name[:300]) as act:
            operations.set_paused(services().broker, name, action == "pause", act=act)
    except operations.PauseUnavailable as e:
        flash(e.message, "error")
    else:
        flash(f"Queue {name} {'paused' if action == 'pause' else 'resumed'}.", "info")
    return redirect(url_for("ui.ops_queues"))


#: Largest row id a form may name (SQLite integers are 64-bit).
_MAX_ROW_ID = 2**62


def _row_id(raw: str | None) -> int | None:
    """A row id from a form or query string (None unless plain digits; clamped to what SQLite holds)."""
    return min(int(raw), _MAX_ROW_ID) if raw and raw.isascii() and raw.isdigit() else None


def _dead_filter(values: Any) -> dict[str, str]:
    """The dead-letter page's filter (queue, actor) from a query string or form; blanks dropped."""
    found = {key: (values.get(key) or "").strip()[:100] for key in ("queue", "actor")}
    return {key: value for key, value in found.items() if value}


@bp.route("/ops/dead")
@permission(READ)
def ops_dead():
    filters = _dead_filter(request.args)
    after_id = _row_id(request.args.get("after_id")) or 0
    try:
        letters = dead_letters.dead_letters(
            services().broker, filters.get("queue"), after_id=after_id, limit=100, actor=filters.get("actor")
        )
    except ApiError:
        letters = None
    return render_template("ops_dead.html", letters=letters, filters=filters, form=EmptyForm())


@bp.route("/ops/dead/replay", methods=["POST"])
@permission("dead_letters.manage", audit_as="dead_letters.replay")
def ops_dead_replay():
    queue = request.form.get("queue", "")
    ids = [i for i in map(_row_id, request.form.getlist("ids")) if i is not None] or None
    with audited("dead_letters.replay", target_type="queue", target=queue[:300], details={"ids": ids}) as act:
        n = dead_letters.replay(services().broker, queue, ids, act=act)
        act.note(replayed=n)
    flash(f"Replayed {n} dead letter(s) from {queue}.", "info")
    return redirect(url_for("ui.ops_dead"))


@bp.route("/ops/dead/bulk", methods=["GET", "POST"])
@permission("dead_letters.manage")
def ops_dead_bulk():
    """Replay or purge every dead letter matching the filter: GET shows the dry run, POST acts on what it counted."""
    action = request.values.get("action")
    filters = _dead_filter(request.values)
    back = url_for("ui.ops_dead", **filters)
    if action not in dead_letters.BULK_ACTIONS:
        flash("Unknown dead-letter action.", "error")
        return redirect(back)
    dry_run = request.method == "GET"
    through_id = None if dry_run else _row_id(request.form.get("through_id"))
    if not dry_run and through_id is None:
        flash("Confirm the action from its dry run.", "error")
        return redirect(back)
    match = DeadMatch(queue=filters.get("queue"), actor=filters.get("actor"), through_id=through_id)
    try:
        if dry_run:
            result = dead_letters.bulk(services().broker, action, match, dry_run=True)
            sample = dead_letters.dead_letters(services().broker, match.queue, after_id=0, limit=10, actor=match.actor)
        else:
            details = {"filter": filters, "through_id": through_id}
            with audited(f"dead_letters.bulk_{action}", target_type="dead_letters", details=details) as act:
                result = dead_letters.bulk(services().broker, action, match, dry_run=False, act=act)
                act.note(matched=result["matched"], affected=result["affected"])
    except ApiError as exc:
        flash(exc.message, "error")
        return redirect(back)
    if dry_run:
        return render_template(
            "dead_bulk_confirm.html", action=action, result=result, filters=filters, sample=sample, form=EmptyForm()
        )
    verb = "Replayed" if action == "replay" else "Purged"
    flash(f"{verb} {result['affected']} of {result['matched']} matching dead letter(s).", "info")
    return redirect(back)


@bp.route("/ops/workers")
@permission(READ)
def ops_workers():
    return render_template(
        "ops_workers.html",
        workers=_safe(operations.workers),
        slots=operations.worker_slots(services().worker_slots()),
        unclean=_safe(operations.unclean_exits),
        form=EmptyForm(),
    )


@bp.route("/ops/workers/unclean-exits/acknowledge", methods=["POST"])
@permission("queues.pause", audit_as="workers.acknowledge")
def ops_unclean_acknowledge():
    """Acknowledge the unclean exits the page listed (their owners are the form's ``owner`` fields)."""
    owners = [o[:200] for o in request.form.getlist("owner") if o][:1000]
    if not owners:
        flash("No unclean exits to acknowledge.", "error")
        return redirect(url_for("ui.ops_workers"))
    try:
        with audited("workers.acknowledge", target_type="workers", details={"owners": owners[:100]}) as act:
            count = operations.acknowledge_unclean_exits(
                services().broker, owners, by=g.identity.user.username, act=act
            )
            act.note(acknowledged=count)
    except ApiError as exc:
        flash(exc.message, "error")
    else:
        flash(f"Acknowledged {count} unclean exit(s).", "info")
    return redirect(url_for("ui.ops_workers"))


#: What each catch-up policy does after downtime, in the words of docs/schedules.md.
CATCHUP_WORDS = {
    "latest": "after downtime, the most recent missed tick fires once",
    "all": "after downtime, every missed tick fires, in order (at most 100 per wake)",
    "none": "only ticks on time (at most 10 s late) fire; missed ones are skipped",
}
_CAUSE_WORDS = {"schedule": "on time", "catchup": "catch-up", "manual": "run now"}


def fire_entries(fires: Sequence[FireView]) -> list[dict[str, Any]]:
    """A schedule's history, newest first: each fire, then the duplicate attempts at its tick and the
    ticks it skipped, as entries with a ``result`` of ``fired``, ``duplicate`` or ``skipped``."""
    entries: list[dict[str, Any]] = []
    for f in fires:
        entries.append({"result": "fired", "at": f.tick, "fire": f, "note": _CAUSE_WORDS.get(f.cause, f.cause)})
        if f.duplicates:
            entries.append(
                {
                    "result": "duplicate",
                    "at": f.tick,
                    "fire": f,
                    "note": f"{f.duplicates} other attempt(s) at this tick refused: it had fired",
                }
            )
        if f.skipped:
            count = f"more than {f.skipped}" if f.skipped_more else str(f.skipped)
            entries.append(
                {
                    "result": "skipped",
                    "at": f.skipped_from,
                    "fire": f,
                    "note": f"{count} tick(s) before this fire never fired (missed while no scheduler ran)",
                }
            )
    return entries


@bp.route("/ops/schedules")
@permission(READ)
def ops_schedules():
    return render_template(
        "ops_schedules.html",
        schedules=services().jobs.schedules(),
        history=fire_entries,
        catchup_words=CATCHUP_WORDS,
        form=EmptyForm(),
    )


@bp.route("/ops/schedules/<name>/run", methods=["POST"])
@permission("schedules.manage", audit_as="schedule.run")
def ops_schedule_run(name: str):
    with audited("schedule.run", target_type="schedule", target=name[:300]) as act:
        fire = services().jobs.run_schedule_now(name, owner_id=g.identity.user.owner_id, session=act.session)
        act.note(job_id=fire["job_id"], message_id=fire["message_id"])
    if fire.get("job_id"):
        flash(f"Schedule {name} fired now as job {fire['job_id']}.", "info")
        return redirect(url_for("ui.job", job_id=fire["job_id"]))
    flash(f"Schedule {name} fired now (message {fire.get('message_id')}).", "info")
    return redirect(url_for("ui.ops_schedules"))


@bp.route("/ops/schedules/<name>/<action>", methods=["POST"])
@permission("schedules.manage", audit_as="schedule.{action}")
def ops_schedule_pause(name: str, action: str):
    if action not in ("pause", "resume"):
        raise ApiError("Unknown action.")
    with audited(f"schedule.{action}", target_type="schedule", target=name[:300]) as act:
        services().jobs.set_schedule_paused(name, action == "pause", by=g.identity.user.owner_id, session=act.session)
    flash(f"Schedule {name} {'paused' if action == 'pause' else 'resumed'}.", "info")
    return redirect(url_for("ui.ops_schedules"))
