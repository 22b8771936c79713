"""CPU per transaction of a SQLite worker's apply path, in-process, setting beside setting.

    make bench-apply-cost   (or: .venv/bin/python -m bench.apply_cost --help)

No gRPC and no other process: one ``SqliteBackend`` applies ``--txs`` one-statement
upserts (1,000 keys, 50-byte values) in batches of ``--batch``, as dispatch hands them
over, and the process's CPU time is divided by the count. Each setting runs
``--rounds`` times, interleaved (A, B, A, B ...), so a busy moment of the machine falls
on both; every run is printed, then the median per setting.

It measures what the cluster benchmark (``bench.apply_bench``) cannot separate: the
work of the guard, the touched digest (``--touched-digest``) and the bookkeeping per
transaction, without the noise of eleven other processes. Every client submit carries
an idempotency key (the library makes one), so the keyed settings are what a cluster
runs: a key remembered by positions only (``--idempotency-window-s 0``), and one with
the default window of an hour (a row in ``_txsync_key_windows`` as well).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from txsync.worker.backend import ToApply
from txsync.worker.sqlite_backend import SqliteBackend
from txsync.worker.transactions import Statement, Transaction, transaction

KEYS = 1_000
WINDOW_MS = 3_600_000
"""The store's default ``--idempotency-window-s``, as the body carries it."""
SETTINGS = {
    "touched digest off": (False, None),
    "touched digest on": (True, None),
    "keyed, positions": (True, 0),
    "keyed, 1 h window": (True, WINDOW_MS),
}
"""Setting -> (touched digest, key window in ms: None for no key)."""


def cpu_us_per_transaction(
    directory: Path, *, touched: bool, window_ms: int | None, txs: int, batch: int
) -> float:
    backend = SqliteBackend(directory / "worker.db", touched_digest=touched)
    try:
        backend.apply(1, "setup", transaction("CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT)"))
        position = 2
        taken_ms = int(time.time() * 1000)
        started = time.process_time()
        for _ in range(0, txs, batch):
            items = [
                ToApply(
                    position + n,
                    f"tx{position + n}",
                    Transaction(
                        (Statement(
                            "INSERT OR REPLACE INTO kv VALUES (?, ?)",
                            ((position + n) % KEYS, "v" * 50),
                        ),),
                        "" if window_ms is None else f"key-{position + n:032x}",
                        0,
                        window_ms or 0,
                        taken_ms + position + n,
                    ),
                )
                for n in range(batch)
            ]  # fmt: skip
            outcomes, failure = backend.apply_many(items)
            if failure is not None or not all(o.ok for o in outcomes):
                raise SystemExit(f"apply failed: {failure or outcomes}")
            position += batch
        return (time.process_time() - started) / (position - 2) * 1e6
    finally:
        backend.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--txs", type=int, default=6_000, help="transactions per run")
    parser.add_argument("--batch", type=int, default=50, help="transactions per apply_many")
    parser.add_argument("--rounds", type=int, default=3, help="runs per setting, interleaved")
    options = parser.parse_args(argv)
    if options.txs < options.batch or options.batch < 1 or options.rounds < 1:
        parser.error("--txs must be at least --batch, and both and --rounds positive")
    runs: dict[str, list[float]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="txsync-apply-cost-") as root:
        for round_no in range(options.rounds):
            for number, (name, (touched, window_ms)) in enumerate(SETTINGS.items()):
                directory = Path(root) / f"{round_no}-{number}"
                directory.mkdir()
                cost = cpu_us_per_transaction(
                    directory, touched=touched, window_ms=window_ms, txs=options.txs,
                    batch=options.batch,
                )  # fmt: skip
                runs[name].append(cost)
                print(f"round {round_no + 1}: {name:<20} {cost:7.1f} us CPU per transaction")
    print()
    for name, costs in runs.items():
        print(f"{name:<20} median {statistics.median(costs):7.1f} us CPU per transaction")
    return 0


if __name__ == "__main__":
    sys.exit(main())
