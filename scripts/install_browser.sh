#!/usr/bin/env bash
# Installs Debian's chromium for the Playwright browser tests (tests/e2e).
# `playwright install` cannot download its own browser builds here, so the tests launch
# /usr/bin/chromium via executable_path. Idempotent: does nothing when chromium is present.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install_browser.sh: chromium missing and not root; run: sudo apt-get install -y chromium" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
command -v chromium
