"""``GET /metrics``: Prometheus text format for every Tenure process (see docs/monitoring.md).

The body comes from :mod:`monitoring.exposition` (multiprocess files + scrape-time database
gauges). Like every endpoint but ``/api/health/live`` it needs credentials (a bearer token in
Prometheus' ``authorization`` block); ``TENURE_WEB_METRICS_PUBLIC=true`` opens it for a scraper on a
private network.
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app

from .auth import require_identity
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


@bp.route("/metrics")
def metrics() -> Response:
    if not current_app.config.get("METRICS_PUBLIC"):
        require_identity()
    from monitoring.exposition import render_metrics

    svc = services()
    if svc.metrics_sources is None:
        svc.metrics_sources = _sources()
    body, status, headers = render_metrics(svc.metrics_sources)
    return Response(body, status=status, headers=headers)
