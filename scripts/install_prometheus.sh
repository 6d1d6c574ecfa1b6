#!/usr/bin/env bash
# Prometheus server and promtool for the monitoring tests (tests/*/monitoring):
#   promtool   - `promtool check rules monitoring/prometheus/alerts.yml`
#   prometheus - a real server scrapes a running Tenure in tests/acceptance/monitoring
# Both come from the Debian package `prometheus`. Idempotent: does nothing when both binaries are
# on PATH, and runs apt-get update only when the package is missing. Not root / no apt-get: prints
# what is missing and exits 0 (the tests then skip with a clear reason).
set -euo pipefail

if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
  echo "install_prometheus: present ($(command -v prometheus))"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" -ne 0 ]; then
  echo "install_prometheus: prometheus/promtool missing but cannot apt-get here (not root or not Debian); skipping" >&2
  exit 0
fi

echo "install_prometheus: installing the Debian package prometheus"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# --no-install-recommends: no node exporter / extra services. policy-rc.d keeps the package's own
# service from being started in containers without an init system.
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
echo "install_prometheus: done ($(command -v prometheus))"
