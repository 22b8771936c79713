"""verify-replicas at size: 3 DCs x 2 workers, ``--rows`` rows per replica (default 1M).

    make bench-verify        (or: .venv/bin/python -m bench.verify_bench --help)

Writes six SQLite databases shaped like workers' (a keyed table, WAL), equal but for
three rows altered in one (one changed, one deleted, one added), then runs the
``verify-replicas`` job on a local Spark (``local[*]``: every core) and prints the time,
the rows read per second and what it found (it must find exactly those three rows).
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import tempfile
import time
from pathlib import Path

from txsync.pipeline.replicas import verify_replicas
from txsync.pipeline.session import spark_session

REPLICAS = [f"dc{dc}/w{w}" for dc in (1, 2, 3) for w in (1, 2)]


def _write(path: Path, rows: int) -> None:
    db = sqlite3.connect(path)
    with db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(
            "CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner TEXT, balance INTEGER, rate REAL)"
        )
        db.executemany(
            "INSERT INTO accounts VALUES (?, ?, ?, ?)",
            ((n, f"owner-{n % 9973}", n * 7 % 100_003, n / 1024) for n in range(rows)),
        )
    db.close()  # the last connection closing checkpoints the WAL: the file is whole


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per replica")
    parser.add_argument("--master", default="local[*]")
    options = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores; "
          f"{len(REPLICAS)} replicas x {options.rows:,} rows")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="txsync-verify-") as scratch:
        root = Path(scratch)
        started = time.monotonic()
        first = root / "first.sqlite"
        _write(first, options.rows)
        replicas = {}
        for name in REPLICAS:
            path = root / (name.replace("/", "-") + ".sqlite")
            path.write_bytes(first.read_bytes())
            replicas[name] = path
        with sqlite3.connect(replicas["dc3/w2"]) as db:
            db.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 123456 % ?",
                       (options.rows,))  # fmt: skip
            db.execute("DELETE FROM accounts WHERE id = ?", (options.rows // 2,))
            db.execute("INSERT INTO accounts VALUES (?, 'stray', 0, 0)", (options.rows + 7,))
        print(f"databases written in {time.monotonic() - started:.1f} s")
        spark = spark_session(options.master, "txsync-verify-bench")
        started = time.monotonic()
        report = verify_replicas(spark, replicas)
        found = sorted((r["replica"], r["key"], r["kind"]) for r in report.differences.collect())
        elapsed = time.monotonic() - started
        total = sum(report.rows.values())
        print(f"verify-replicas: {total:,} rows in {elapsed:.1f} s "
              f"({total / elapsed:,.0f} rows/s) on {options.master}")  # fmt: skip
        print(f"differences found: {found}")
        spark.stop()
        expected = 3
        return 0 if len(found) == expected else 1


if __name__ == "__main__":
    raise SystemExit(main())
