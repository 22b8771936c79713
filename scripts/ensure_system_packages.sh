#!/usr/bin/env bash
# Debian packages the test suite and the benchmarks run for real: PostgreSQL (the
# PostgreSQL worker tests start a throwaway server from its binaries), debootstrap (the
# image's offline base; Docker itself: scripts/ensure_docker.sh), Chromium (the pipeline
# report, headless), and the systems `make bench` compares TxSync with: etcd 3.4 and
# MariaDB + Galera 4 (rsync for its state transfers), and promtool (Prometheus's, which
# evaluates the chart's alert rules in tests). Installs what is missing; needs root (or
# sudo) only when something is missing.
set -euo pipefail
missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v runuser >/dev/null 2>&1 || missing+=(util-linux)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
[ -x /usr/bin/chromium ] || missing+=(chromium)  # the pipeline report's browser test
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
command -v mariadbd >/dev/null 2>&1 || missing+=(mariadb-server)
command -v mariadb >/dev/null 2>&1 || missing+=(mariadb-client)
[ -e /usr/lib/galera/libgalera_smm.so ] || missing+=(galera-4)
command -v rsync >/dev/null 2>&1 || missing+=(rsync)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing Debian packages: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
# The packages start servers of their own; the tests and benchmarks start theirs.
for service in postgresql mariadb etcd prometheus; do
  $sudo service "$service" stop >/dev/null 2>&1 || true
done
