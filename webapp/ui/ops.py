"""Operations pages (admin only): overview with charts, queues, dead letters, workers, schedules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from flask import flash, g, redirect, render_template, request, url_for

from .. import operations
from ..errors import ApiError, Forbidden
from ..services import services
from .blueprint import bp
from .charts import bar_chart, line_chart
from .forms import EmptyForm


def _admin() -> None:
    if not g.identity.is_admin:
        raise Forbidden("Operations need the admin role.")


@bp.route("/ops")
def ops():
    _admin()
    buckets = services().jobs.activity(None, since=datetime.now(UTC) - timedelta(hours=1), bucket_s=60)
    labels = [b.start.strftime("%H:%M") for b in buckets]
    charts = [
        bar_chart(
            "Throughput: finished jobs per minute",
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
            ],
            unit=" s",
        ),
        bar_chart(
            "Failures per minute (failed and interrupted)", labels, [("failed", "s-bad", [b.failed for b in buckets])]
        ),
    ]
    return render_template(
        "ops.html", charts=charts, queues=_safe(operations.queues), workers=_safe(operations.workers)
    )


def _safe(fn):  # type: ignore[no-untyped-def]
    try:
        return fn(services().broker)
    except ApiError:
        return None  # the broker has no such operation (Redis/RabbitMQ): the page says so


@bp.route("/ops/queues")
def ops_queues():
    _admin()
    return render_template("ops_queues.html", queues=_safe(operations.queues), form=EmptyForm())


@bp.route("/ops/queues/<name>/<action>", methods=["POST"])
def ops_queue_action(name: str, action: str):
    _admin()
    if action not in ("pause", "resume"):
        raise ApiError("Unknown action.")
    try:
        operations.set_paused(services().broker, name, action == "pause")
    except operations.PauseUnavailable as e:
        flash(e.message, "error")
    else:
        flash(f"Queue {name} {'paused' if action == 'pause' else 'resumed'}.", "info")
    return redirect(url_for("ui.ops_queues"))


@bp.route("/ops/dead")
def ops_dead():
    _admin()
    queue = (request.args.get("queue") or "").strip() or None
    try:
        after_id = max(0, int(request.args.get("after_id", "0")))
    except ValueError:
        after_id = 0
    try:
        letters = operations.dead_letters(services().broker, queue, after_id=after_id, limit=100)
    except ApiError:
        letters = None
    return render_template("ops_dead.html", letters=letters, queue=queue, form=EmptyForm())


@bp.route("/ops/dead/replay", methods=["POST"])
def ops_dead_replay():
    _admin()
    queue = request.form.get("queue", "")
    ids = [int(i) for i in request.form.getlist("ids") if i.isdigit()] or None
    n = operations.replay(services().broker, queue, ids)
    flash(f"Replayed {n} dead letter(s) from {queue}.", "info")
    return redirect(url_for("ui.ops_dead"))


@bp.route("/ops/workers")
def ops_workers():
    _admin()
    return render_template(
        "ops_workers.html",
        workers=_safe(operations.workers),
        slots=operations.worker_slots(services().worker_slots()),
    )


@bp.route("/ops/schedules")
def ops_schedules():
    _admin()
    return render_template("ops_schedules.html", schedules=services().jobs.schedules(), form=EmptyForm())


@bp.route("/ops/schedules/<name>/run", methods=["POST"])
def ops_schedule_run(name: str):
    _admin()
    fire = services().jobs.run_schedule_now(name, owner_id=g.identity.user.owner_id)
    if fire.get("job_id"):
        flash(f"Schedule {name} fired now as job {fire['job_id']}.", "info")
        return redirect(url_for("ui.job", job_id=fire["job_id"]))
    flash(f"Schedule {name} fired now (message {fire.get('message_id')}).", "info")
    return redirect(url_for("ui.ops_schedules"))


@bp.route("/ops/schedules/<name>/<action>", methods=["POST"])
def ops_schedule_pause(name: str, action: str):
    _admin()
    if action not in ("pause", "resume"):
        raise ApiError("Unknown action.")
    services().jobs.set_schedule_paused(name, action == "pause", by=g.identity.user.owner_id)
    flash(f"Schedule {name} {'paused' if action == 'pause' else 'resumed'}.", "info")
    return redirect(url_for("ui.ops_schedules"))
