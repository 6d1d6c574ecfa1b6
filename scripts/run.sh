#!/usr/bin/env bash
# `make run`: prepare the database and the metrics directory, make sure an admin exists, print the
# URL, then run every Procfile process with honcho (Ctrl-C stops them all).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export PORT="${PORT:-8000}"
mkdir -p var

tenure db upgrade
tenure users ensure-admin

# prometheus-client multiprocess mode: one directory for every process, wiped before they start
# (never from inside a process, which could delete a live sibling's files).
export PROMETHEUS_MULTIPROC_DIR="${PROMETHEUS_MULTIPROC_DIR:-$PWD/var/prometheus}"
rm -rf "$PROMETHEUS_MULTIPROC_DIR"
mkdir -p "$PROMETHEUS_MULTIPROC_DIR"

procfile=Procfile
case "${TENURE_BROKER_URL:-sqlite}" in
  sqlite*) ;;
  *) procfile=Procfile.fleet ;;  # Redis and RabbitMQ need the outbox relay (with the PostgreSQL broker it idles)
esac

echo
echo "Tenure is starting: open http://127.0.0.1:${PORT}/  (log in as admin; metrics at /metrics)"
echo
exec honcho -f "$procfile" start -p "$PORT" "$@"
