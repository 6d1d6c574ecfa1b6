"""``GET /metrics``: Prometheus text format for this host's Tenure processes (see docs/monitoring.md).

The body comes from :mod:`monitoring.exposition`: this host's multiprocess files plus the gauges
computed from the database at scrape time — this endpoint is their one scrape target; a worker,
scheduler or relay with its own metrics port serves only its processes' metrics. It needs the
``metrics.read`` permission (the counts span every owner's jobs): Prometheus sends the API token of a
viewer, operator or admin (or a token carrying just ``metrics.read``) in its ``authorization`` block;
anyone else gets 403. ``TENURE_WEB_METRICS_PUBLIC=true`` opens it for a scraper on a private network.
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app, request

from .errors import Invalid
from .permissions import require
from .services import services

bp = Blueprint("metrics", __name__)


def _sources():  # type: ignore[no-untyped-def]
    from monitoring.collectors import JobsSource, ScheduleFireInfo, ScheduleSource, default_sources

    svc = services()

    def fires():  # type: ignore[no-untyped-def]
        return [
            ScheduleFireInfo(
                s.name,
                s.last_fire_at.timestamp() if s.last_fire_at else None,
                s.next_fire_at.timestamp() if s.next_fire_at else None,
            )
            for s in svc.jobs.schedules()
        ]

    return default_sources(svc.broker, jobs=JobsSource.for_engine(svc.engine), schedules=ScheduleSource(fires))


#: ``?collect=`` values: what one scrape of this endpoint includes.
COLLECT = ("all", "process", "database")
#: What a scrape needs (unless ``METRICS_PUBLIC``).
READ = "metrics.read"


@bp.route("/metrics")
def metrics() -> Response:
    """This host's processes' metrics and the database-derived gauges (``?collect=process|database``: one part).

    With several web hosts, scrape every one with ``collect=process`` and the database gauges once
    (``collect=database``, e.g. through the load balancer): see docs/monitoring.md.
    """
    if not current_app.config.get("METRICS_PUBLIC"):
        require(READ)
    collect = request.args.get("collect", "all")
    if collect not in COLLECT:
        raise Invalid(f"collect must be one of {', '.join(COLLECT)}.")
    from monitoring.exposition import render_metrics

    svc = services()
    if svc.metrics_sources is None:
        svc.metrics_sources = _sources()
    body, status, headers = render_metrics(
        svc.metrics_sources if collect != "process" else (), processes=collect != "database"
    )
    return Response(body, status=status, headers=headers)


# Named like a @permission view's: the check is conditional (METRICS_PUBLIC), so it is made inside.
metrics.permission = READ  # type: ignore[attr-defined]
