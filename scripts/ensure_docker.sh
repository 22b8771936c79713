#!/usr/bin/env bash
# A running Docker daemon: install Debian's docker.io if missing and start dockerd if no
# daemon answers (CI machines and fresh developer machines have neither). Idempotent.
set -euo pipefail

if docker info >/dev/null 2>&1; then
    exit 0
fi
as_root=()
if [ "$(id -u)" -ne 0 ]; then
    as_root=(sudo)
fi
if ! command -v dockerd >/dev/null 2>&1; then
    echo "installing Debian's docker.io ..."
    "${as_root[@]}" apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >/dev/null
fi
echo "starting dockerd (log: /tmp/txsync-dockerd.log) ..."
"${as_root[@]}" sh -c 'nohup dockerd >/tmp/txsync-dockerd.log 2>&1 &'
for _ in $(seq 60); do
    if docker info >/dev/null 2>&1; then
        exit 0
    fi
    sleep 1
done
echo "error: dockerd did not come up; see /tmp/txsync-dockerd.log" >&2
exit 1
