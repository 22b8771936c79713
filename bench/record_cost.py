"""What a transaction-store's records cost: bytes each, and the CPU of copying them out.

    .venv/bin/python -m bench.record_cost DATA_DIR [DATA_DIR ...]

Opens a copy of each store data directory given (a soak's or a dev cluster's
``dcN``, stopped or not: the copy is opened, never the original) as the store would at
a start, then prints, for the records it holds:

* their deep size: the bytes of every object a record reaches that no other record
  shares, by type (what the store's memory grows by with each record held);
* the time to build every record's snapshot form (``prepare_snapshot``, what a
  rotation does outside the lock) and every record's ``Get`` answer, best of 7.

Give two builds the same directory, one after the other
(``PYTHONPATH=<checkout>/services``), to compare them like for like.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import enum
import shutil
import sys
import tempfile
import time
from pathlib import Path

from txsync.transaction_store.service import record_to_get_response
from txsync.transaction_store.store import StoreConfig, TransactionStore

ROUNDS = 7


def _deep_size(found: object, seen: set[int], by_type: collections.Counter[str]) -> int:
    """``found``'s bytes and those of what it reaches, each object once (``seen``);
    shared constants (None, small ints, empty strings, enum members) count nothing."""
    if id(found) in seen or found is None or isinstance(found, (bool, enum.Enum)):
        return 0
    if isinstance(found, (str, bytes, tuple)) and not found:
        return 0
    if isinstance(found, int) and -5 <= found <= 256:
        return 0
    seen.add(id(found))
    size = sys.getsizeof(found)
    by_type[type(found).__name__] += size
    if isinstance(found, dict):
        return size + sum(
            _deep_size(k, seen, by_type) + _deep_size(v, seen, by_type) for k, v in found.items()
        )
    if isinstance(found, (list, tuple, set, frozenset)):
        return size + sum(_deep_size(item, seen, by_type) for item in found)
    for kind in type(found).__mro__:
        for name in getattr(kind, "__slots__", ()):
            if hasattr(found, name):
                size += _deep_size(getattr(found, name), seen, by_type)
    return size


async def _measure(data: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="record-cost-") as scratch:
        copy = Path(scratch) / "store"
        shutil.copytree(data, copy)
        store = await TransactionStore.open(StoreConfig(data_dir=copy, node_id="dc1"))
        try:
            records = list(store.state.txs.values())
            if not records:
                print(f"{data}: no records held")
                return
            seen: set[int] = set()
            by_type: collections.Counter[str] = collections.Counter()
            total = sum(_deep_size(record, seen, by_type) for record in records)
            finished = sum(1 for record in records if record.outcome is not None)
            print(f"{data}: {len(records):,} records ({finished:,} finished)")
            print(f"  deep size {total / len(records):,.0f} bytes a record, of which:")
            for name, size in by_type.most_common(8):
                print(f"    {name:<12} {size / len(records):6,.0f}")
            snapshot_s = get_s = float("inf")
            for _ in range(ROUNDS):
                kept = store.state.kept_records(0)
                started = time.perf_counter()
                store.state.prepare_snapshot(kept)
                snapshot_s = min(snapshot_s, time.perf_counter() - started)
                started = time.perf_counter()
                for record in records:
                    record_to_get_response(record, "dc1", None)
                get_s = min(get_s, time.perf_counter() - started)
            print(
                f"  snapshot forms {snapshot_s * 1e3:.1f} ms ({snapshot_s / len(records) * 1e6:.1f}"
                f" us each); Get answers {get_s * 1e3:.1f} ms"
                f" ({get_s / len(records) * 1e6:.1f} us each); best of {ROUNDS}"
            )
        finally:
            await store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.record_cost",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("data", nargs="+", type=Path, help="a transaction-store's --data")
    options = parser.parse_args(argv)
    for data in options.data:
        if not (data / "txlog").is_dir():
            parser.error(f"{data}: no txlog/ here; give a store's --data directory")
        asyncio.run(_measure(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
