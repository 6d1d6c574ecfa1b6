#!/usr/bin/env bash
# socat and iproute2 (`ip`) for the multi-host test (tests/acceptance/multihost): network namespaces
# stand in for hosts, socat forwards the services into them. Idempotent: does nothing when both are
# on PATH. Without root or apt-get it says what is missing and exits 0: the test then fails with the
# same reason (it needs root anyway), unless TENURE_TEST_SKIP_MULTIHOST=1 asks to skip it.
set -euo pipefail
PATH="$PATH:/usr/sbin:/sbin"

if command -v socat >/dev/null 2>&1 && command -v ip >/dev/null 2>&1; then
  echo "install_network_tools: present ($(command -v socat), $(command -v ip))"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" -ne 0 ]; then
  echo "install_network_tools: socat/ip missing but cannot apt-get here (not root or not Debian)" >&2
  exit 0
fi

echo "install_network_tools: installing the Debian packages socat and iproute2"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends socat iproute2 >/dev/null
echo "install_network_tools: done ($(command -v socat), $(command -v ip))"
