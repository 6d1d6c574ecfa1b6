"""The shipped dashboard, alert rules and sample Prometheus configuration."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from monitoring.metrics import DB_METRICS, exposed_names

MONITORING = Path(__file__).resolve().parents[3] / "monitoring"
DASHBOARD = MONITORING / "grafana" / "tenure.json"
ALERTS = MONITORING / "prometheus" / "alerts.yml"
PROMETHEUS_YML = MONITORING / "prometheus" / "prometheus.yml"
ALERT_UNIT_TESTS = Path(__file__).with_name("alerts_test.yml")
METRIC_NAME = re.compile(r"\btenure_[a-z0-9_]+\b")


def dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    for variable in dashboard["templating"]["list"]:
        out.append((f"${variable['name']}", variable["definition"]))
    return out


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"] for rule in group["rules"]]


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (scripts/install_prometheus.sh)")
    return path


def test_promtool_accepts_the_alert_rules() -> None:
    result = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_promtool_unit_tests_cover_every_alert_rule_and_pass() -> None:
    # alerts_test.yml: synthetic series for the rule logic (the real processes: tests/acceptance/monitoring)
    unit = yaml.safe_load(ALERT_UNIT_TESTS.read_text(encoding="utf-8"))
    cases = [case for test in unit["tests"] for case in test["alert_rule_test"]]
    for rule in alert_rules():
        mine = [case for case in cases if case["alertname"] == rule["alert"]]
        assert any(case["exp_alerts"] for case in mine), f"{rule['alert']}: no case where it fires"
        assert any(not case["exp_alerts"] for case in mine), f"{rule['alert']}: no case where it stays quiet"
    result = subprocess.run(
        [promtool(), "test", "rules", ALERT_UNIT_TESTS.name],
        cwd=ALERT_UNIT_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("config", ["prometheus.yml", "fleet.yml", "fleet-file-sd.yml"])
def test_promtool_accepts_the_sample_configs(config: str) -> None:
    result = subprocess.run(
        [promtool(), "check", "config", config],
        cwd=PROMETHEUS_YML.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_fleet_configs_scrape_the_database_gauges_from_one_job_and_every_host_type() -> None:
    static = yaml.safe_load((PROMETHEUS_YML.parent / "fleet.yml").read_text(encoding="utf-8"))
    file_sd = yaml.safe_load((PROMETHEUS_YML.parent / "fleet-file-sd.yml").read_text(encoding="utf-8"))
    jobs = ["tenure", "tenure-worker", "tenure-scheduler", "tenure-relay"]
    assert [j["job_name"] for j in static["scrape_configs"]] == jobs
    assert [j["job_name"] for j in file_sd["scrape_configs"]] == jobs
    # the web job (database gauges) needs credentials; each job's file_sd targets file exists and parses
    assert static["scrape_configs"][0]["authorization"]["type"] == "Bearer"
    for job in file_sd["scrape_configs"]:
        (files,) = (c["files"] for c in job["file_sd_configs"])
        for name in files:
            groups = yaml.safe_load((PROMETHEUS_YML.parent / name).read_text(encoding="utf-8"))
            assert groups and all(set(g) <= {"targets", "labels"} and g["targets"] for g in groups), name


def test_dashboard_is_valid_grafana_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dashboard["title"] == "Tenure" and dashboard["uid"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    titles = {p["title"] for p in dashboard["panels"] if p["type"] == "row"}
    assert {"Throughput", "Latency", "Queues and lag", "Failures", "Leases", "Workers"} <= titles
    for panel in dashboard["panels"]:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert all(t["refId"] and t["expr"] for t in panel["targets"])


def test_every_dashboard_and_alert_query_names_a_defined_metric() -> None:
    known = exposed_names()
    queries = dashboard_queries() + [(r["alert"], r["expr"]) for r in alert_rules()]
    for where, expr in queries:
        names = set(METRIC_NAME.findall(expr))
        assert names or expr.startswith("up{job="), f"{where}: no tenure_ metric in {expr!r}"
        assert names <= known, f"{where}: unknown metrics {names - known}"


def test_exposed_names_cover_process_and_database_metrics() -> None:
    known = exposed_names()
    assert {"tenure_messages_processed_total", "tenure_message_duration_seconds_bucket"} <= known
    assert {"tenure_messages_in_progress", "tenure_lease_renewals_total", "tenure_stale_attempts_total"} <= known
    assert set(DB_METRICS) <= known
    assert all(name.startswith("tenure_") for name in known)


def test_alert_rules_cover_the_issue() -> None:
    names = {r["alert"] for r in alert_rules()}
    assert {
        "TenureQueueLagHigh",
        "TenureDeadLettersGrowing",
        "TenureLeasesExpiring",
        "TenureNoSchedulerFire",
        "TenureWorkersDown",
    } <= names
    for rule in alert_rules():
        assert rule["annotations"]["summary"] and rule["labels"]["severity"] in ("warning", "critical")
