#!/usr/bin/env bash
# make pipeline-demo: every pipeline job on a live local cluster.
#   1. `txsync dev up` (3 DCs x 2 SQLite workers) under build/pipeline-demo/data;
#   2. `pipeline load` of 20,000 generated rows through all three DCs;
#   3. waits until every worker has applied them; `pipeline export` through the admin API
#      (the only source of rounds), then stops the cluster;
#   4. `pipeline export` of the data directories, `audit-order`, `verify-replicas` and
#      `report` (on the admin API export) on what it left.
# Opens nothing; prints where the report is.
set -euo pipefail
cd "$(dirname "$0")/.."
txsync=.venv/bin/txsync
root=build/pipeline-demo
rm -rf "$root"
mkdir -p "$root"
"$txsync" dev up --data "$root/data" --base-port 27000 >"$root/dev-up.log" 2>&1 &
cluster=$!
trap 'kill -TERM $cluster 2>/dev/null || true' EXIT
for _ in $(seq 120); do [ -f "$root/data/cluster.json" ] && break; sleep 0.5; done
[ -f "$root/data/cluster.json" ] || { echo "the cluster did not come up: $root/dev-up.log" >&2; exit 1; }
endpoints="--endpoints $root/data/cluster.json"
stores=$(.venv/bin/python -c "import json,sys; print(','.join(d['store'] for d in json.load(open(sys.argv[1]))['dcs'].values()))" "$root/data/cluster.json")

"$txsync" submit $endpoints --sql 'CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner TEXT, balance INTEGER)' --wait ok
.venv/bin/python -c "
import sys
with open(sys.argv[1], 'w') as out:
    out.write('id,owner,balance\n')
    out.writelines(f'{n},owner {n % 97},{n * 7 % 1000}\n' for n in range(20_000))
" "$root/accounts.csv"
"$txsync" pipeline load --input "$root/accounts.csv" --columns id,owner,balance \
    --sql 'INSERT INTO accounts (id, owner, balance) VALUES (?, ?, ?)' \
    --rows-per-transaction 20 --endpoints "$stores" 2>/dev/null

echo "waiting for every worker to apply everything ..."
for _ in $(seq 300); do
    if "$txsync" status $endpoints -o json | .venv/bin/python -c "
import json, sys
dcs = json.load(sys.stdin)
sys.exit(0 if all(d['healthy'] and d['lag'] == 0 and d['synced'] == 1001 for d in dcs) else 1)
" && "$txsync" workers $endpoints -o json | .venv/bin/python -c "
import json, sys
workers = [w for ws in json.load(sys.stdin).values() for w in ws]
sys.exit(0 if workers and all(w['position'] == 1001 for w in workers) else 1)
"; then break; fi
    sleep 1
done
"$txsync" pipeline export $endpoints --out "$root/lake-live" 2>/dev/null
kill -TERM $cluster; wait $cluster || true; trap - EXIT

"$txsync" pipeline export --data "$root/data" --out "$root/lake" 2>/dev/null
"$txsync" pipeline audit-order --parquet "$root/lake" 2>/dev/null
"$txsync" pipeline verify-replicas --data "$root/data" 2>/dev/null
"$txsync" pipeline report --parquet "$root/lake-live" --out "$root/report" 2>/dev/null
echo "open $root/report/index.html"
