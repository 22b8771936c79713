"""Submit throughput and latency of one real transaction-store process, fsync on.

    make bench-store            (or: .venv/bin/python -m bench.store_bench --help)

Runs, one after another against the same server: single submits and batched submits
(SubmitBatch) at several client counts. Every submit is acknowledged only after its log
batch is fsynced and its body file is fsynced, exactly as in production. The clients run
in this process on asyncio, so they share the machine's cores with the server: the
figures are for the whole loop on one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

from tests.support.processes import transaction_store
from txsync.v1 import client_pb2, client_pb2_grpc, common_pb2


def _body(n: int) -> common_pb2.TxBody:
    return common_pb2.TxBody(
        statements=[
            common_pb2.Statement(
                sql="INSERT INTO accounts (id, balance) VALUES (?, ?)",
                params=[common_pb2.SqlValue(int_value=n), common_pb2.SqlValue(int_value=100)],
            )
        ]
    )


async def _run(address: str, clients: int, batch: int, txs: int) -> tuple[float, list[float]]:
    """Returns (seconds, per-call latencies in ms); each client sends its share."""
    latencies: list[float] = []
    per_client = max(1, txs // clients // batch)

    async def client(worker: int) -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = client_pb2_grpc.ClientServiceStub(channel)
            for n in range(per_client):
                started = time.perf_counter()
                if batch == 1:
                    await stub.Submit(client_pb2.SubmitRequest(body=_body(n)))
                else:
                    submits = [client_pb2.SubmitRequest(body=_body(i)) for i in range(batch)]
                    await stub.SubmitBatch(client_pb2.SubmitBatchRequest(submits=submits))
                latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(client(w) for w in range(clients)))
    return time.perf_counter() - started, latencies


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--txs", type=int, default=4000, help="transactions per point")
    parser.add_argument("--clients", default="1,8,32", help="client counts to run")
    parser.add_argument("--batch", type=int, default=100, help="submits per SubmitBatch")
    options = parser.parse_args()
    client_counts = [int(c) for c in options.clients.split(",")]
    with tempfile.TemporaryDirectory(prefix="txsync-bench-", dir=os.environ.get("TMPDIR")) as tmp:
        server = transaction_store(
            Path(tmp), "bench", "--incoming-max", "10000000", "--unfinished-max", "10000000"
        )
        server.start()
        try:
            print(f"machine: {platform.platform()}, {os.cpu_count()} cores, "
                  f"Python {platform.python_version()}; data on {tmp}")  # fmt: skip
            print()
            print("| mode | clients | txs | tx/s | call p50 ms | call p99 ms |")
            print("| --- | ---: | ---: | ---: | ---: | ---: |")
            for batch in (1, options.batch):
                for clients in client_counts:
                    seconds, latencies = asyncio.run(
                        _run(server.address, clients, batch, options.txs)
                    )
                    done = len(latencies) * batch
                    mode = "single" if batch == 1 else f"batch of {batch}"
                    p50 = statistics.median(latencies)
                    p99 = _percentile(latencies, 0.99)
                    print(
                        f"| {mode} | {clients} | {done} | {done / seconds:,.0f} | "
                        f"{p50:.2f} | {p99:.2f} |",
                        flush=True,
                    )
        finally:
            code = server.terminate()
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
