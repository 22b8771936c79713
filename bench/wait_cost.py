"""What a waiting submit costs the store: its wait, apart from the ordering it waits on.

    .venv/bin/python -m bench.wait_cost      (--help for the options)

One store in this process (no gRPC, uvloop, fsync on), as ``SubmitBatch`` uses it:
``--batches`` batches of ``--batch`` submits, each submit waiting for ACCEPTED, then
one protocol step orders them all and the waits end. Three ways, each the best of
``--reps`` rounds, in CPU microseconds per submit for the step and the waits:

- ``none``: nobody waits (the step alone);
- ``each``: every submit waits on its own (``TransactionStore.wait``, as ``Submit``);
- ``batch``: a batch waits as one (``TransactionStore.wait_many``, as ``SubmitBatch``).

A wait's cost is its way's figure minus ``none``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path

import uvloop

from txsync.protocol import TxMeta, TxState
from txsync.transaction_store.step_rules import ProtocolStep, StateChangeRequest
from txsync.transaction_store.store import (
    StoreConfig,
    TransactionStore,
)
from txsync.v1 import common_pb2

WAYS = ("none", "each", "batch")
BODY = common_pb2.TxBody(statements=[common_pb2.Statement(sql="INSERT INTO t VALUES (1)")])


async def _round(store: TransactionStore, way: str, batch: int, batches: int) -> float:
    """CPU seconds from the waits' start to their end, the step included."""
    ids = []
    for _ in range(batches):
        results = await store.submit_many([(BODY, "", "")] * batch)
        ids.append([result.tx_id for result in results if not isinstance(result, Exception)])
    began = time.process_time()
    waits: list[Awaitable[object]] = []
    if way == "each":
        waits = [store.wait(tx_id, TxState.ACCEPTED, 60) for group in ids for tx_id in group]
    elif way == "batch":
        waits = [store.wait_many(group, TxState.ACCEPTED, 60) for group in ids]
    waiting = asyncio.gather(*waits)
    await asyncio.sleep(0)  # every wait is listed now
    first = store.state.counter + 1
    every = [tx_id for group in ids for tx_id in group]
    metas = [TxMeta(first + n, tx_id, "dc1") for n, tx_id in enumerate(every)]
    await store.persist_step(
        ProtocolStep(
            counter=metas[-1].ts,
            incoming=metas,
            synced_start=store.state.merge_base,
            synced=metas,
            changes=[StateChangeRequest(meta.tx_id, TxState.ACCEPTED) for meta in metas],
        )
    )
    await waiting
    return time.process_time() - began


async def _measure(way: str, batch: int, batches: int, reps: int) -> float:
    with tempfile.TemporaryDirectory(prefix="txsync-wait-") as root:
        store = await TransactionStore.open(StoreConfig(data_dir=Path(root), node_id="dc1"))
        try:
            best = min([await _round(store, way, batch, batches) for _ in range(reps)])
        finally:
            await store.close()
    return best / (batch * batches) * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.wait_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--batch", type=int, default=50, help="submits per batch (default 50)")
    parser.add_argument("--batches", type=int, default=40, help="batches per round (default 40)")
    parser.add_argument("--reps", type=int, default=7, help="rounds; the best kept (default 7)")
    args = parser.parse_args(argv)
    if not (1 <= args.batch <= 256 and 1 <= args.batches <= 100 and 1 <= args.reps <= 100):
        parser.error("--batch must be 1..256, --batches 1..100 and --reps 1..100")
    print(f"{args.batches} batches of {args.batch} submits waiting for ACCEPTED, one step "
          f"orders them; CPU us per submit, best of {args.reps}")  # fmt: skip
    for way in WAYS:
        figure = uvloop.run(_measure(way, args.batch, args.batches, args.reps))
        print(f"  {way:6}{figure:8.1f}")


if __name__ == "__main__":
    main()
