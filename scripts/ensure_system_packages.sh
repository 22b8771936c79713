#!/usr/bin/env bash
# Debian packages the test suite runs for real: PostgreSQL (the PostgreSQL worker tests
# start a throwaway server from its binaries), debootstrap (the image's offline base;
# Docker itself: scripts/ensure_docker.sh) and Chromium (the pipeline report, headless). Installs what is missing; needs root (or sudo)
# only when something is missing.
set -euo pipefail
missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v runuser >/dev/null 2>&1 || missing+=(util-linux)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
[ -x /usr/bin/chromium ] || missing+=(chromium)  # the pipeline report's browser test
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing Debian packages: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
# The package starts a cluster of its own; the tests start theirs.
$sudo service postgresql stop >/dev/null 2>&1 || true
