#!/usr/bin/env bash
# Debian packages the domain tests (tests/integration/domain) and the demo recording need:
#   ffmpeg             - system ffmpeg CLI (tasks.domain.ffmpeg prefers it; imageio-ffmpeg's static
#                        binary from pip is the fallback, so rendering works without it)
#   espeak-ng          - synthetic speech for the demo recording and the ASR accuracy test
#   fonts-wqy-microhei - a CJK font (5 MB) so Chinese subtitles/danmaku do not render as tofu boxes
# Idempotent: installs only what is missing, and runs apt-get update only when something is.
# Not root / no apt-get: prints what is missing and exits 0 (the tests skip with a clear reason).
set -euo pipefail

PACKAGES=(ffmpeg espeak-ng fonts-wqy-microhei)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_system_deps: all present (${PACKAGES[*]})"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" -ne 0 ]; then
  echo "install_system_deps: missing ${missing[*]} but cannot apt-get here (not root or not Debian); skipping" >&2
  exit 0
fi

echo "install_system_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install_system_deps: done"
