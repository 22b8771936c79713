"""Applying the agreed order: one DC with 1, 2 and 4 SQLite workers.

    make bench-apply        (or: .venv/bin/python -m bench.apply_bench --help)

For each worker count, starts one DC of real processes (transaction-store, sync-coordinator,
worker-dispatch, workers) and measures, in one run:

* **sustained applied/s**: ``--txs`` single-row transactions (half inserts, half updates)
  submitted in batches of 100 as fast as the store takes them; the rate is the count over
  the time from the first submit until every worker has applied the last one;
* **ENQUEUED -> OK** (the testing worker's verdict), p50 and p99, from the store's history;
* **ENQUEUED -> applied on all workers**, p50 and p99, one transaction at a time
  (``--samples``), polling the dispatch's view of every worker's position every 2 ms.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
from google.protobuf import duration_pb2

from tests.support.cluster import LocalCluster
from tests.support.processes import ServiceProcess, free_port, worker, worker_dispatch
from txsync.v1 import admin_pb2, admin_pb2_grpc, client_pb2, client_pb2_grpc, common_pb2

BATCH = 100


def _statement(sql: str, *params: int) -> common_pb2.TxBody:
    values = [common_pb2.SqlValue(int_value=p) for p in params]
    return common_pb2.TxBody(statements=[common_pb2.Statement(sql=sql, params=values)])


def _ms(history: client_pb2.GetResponse, state: int) -> float:
    step = next(t for t in history.history if t.state == state)
    return float(step.at.ToMilliseconds())


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(
    workers: int, txs: int, samples: int, root: Path, worker_args: Sequence[str] = ()
) -> dict[str, float]:
    cluster = LocalCluster(root, 1)
    processes: list[ServiceProcess] = []
    try:
        for n in range(workers):
            process = worker(root / f"w{n + 1}", f"w{n + 1}", *worker_args, port=free_port())
            process.start()
            processes.append(process)
        dispatch = worker_dispatch(
            root / "dispatch",
            cluster.dcs[0].store.address,
            {f"w{n + 1}": p.address for n, p in enumerate(processes)},
        )
        dispatch.start()
        processes.append(dispatch)
        with (
            grpc.insecure_channel(cluster.dcs[0].store.address) as store_channel,
            grpc.insecure_channel(dispatch.address) as dispatch_channel,
        ):
            client = client_pb2_grpc.ClientServiceStub(store_channel)
            admin = admin_pb2_grpc.AdminServiceStub(dispatch_channel)

            def positions() -> list[int]:
                answer = admin.ListWorkers(admin_pb2.ListWorkersRequest())
                return [w.position for w in answer.workers]

            def wait_applied(position: int) -> None:
                while min(positions()) < position:
                    time.sleep(0.002)

            def wait_ok(tx_id: str) -> None:
                client.Wait(
                    client_pb2.WaitRequest(
                        tx_id=tx_id,
                        state=common_pb2.TX_STATE_OK,
                        timeout=duration_pb2.Duration(seconds=60),
                    )
                )

            table = "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)"
            first = client.Submit(client_pb2.SubmitRequest(body=_statement(table))).tx_id
            wait_ok(first)
            wait_applied(1)

            started = time.perf_counter()
            ids: list[str] = []
            for start in range(0, txs, BATCH):
                bodies = []
                for n in range(start, min(txs, start + BATCH)):
                    if n < txs // 2:
                        bodies.append(_statement("INSERT INTO accounts VALUES (?, ?)", n, 100))
                    else:
                        bodies.append(
                            _statement(
                                "UPDATE accounts SET balance = balance + 1 WHERE id = ?",
                                n - txs // 2,
                            )
                        )
                answer = client.SubmitBatch(
                    client_pb2.SubmitBatchRequest(
                        submits=[client_pb2.SubmitRequest(body=b) for b in bodies]
                    )
                )
                ids.extend(r.accepted.tx_id for r in answer.results)
            wait_applied(1 + txs)
            elapsed = time.perf_counter() - started
            verdicts = [
                _ms(h, common_pb2.TX_STATE_OK) - _ms(h, common_pb2.TX_STATE_ENQUEUED)
                for h in (client.Get(client_pb2.GetRequest(tx_id=t)) for t in ids)
            ]

            everywhere: list[float] = []
            for n in range(samples):
                sql = "UPDATE accounts SET balance = balance - 1 WHERE id = ?"
                tx_id = client.Submit(client_pb2.SubmitRequest(body=_statement(sql, n))).tx_id
                wait_ok(tx_id)
                got = client.Get(client_pb2.GetRequest(tx_id=tx_id))
                wait_applied(got.position)
                done_ms = time.time() * 1000
                everywhere.append(done_ms - _ms(got, common_pb2.TX_STATE_ENQUEUED))
        return {
            "applied_per_s": txs / elapsed,
            "ok_p50": statistics.median(verdicts),
            "ok_p99": _percentile(verdicts, 0.99),
            "all_p50": statistics.median(everywhere),
            "all_p99": _percentile(everywhere, 0.99),
        }
    finally:
        for process in reversed(processes):
            if process.process is not None and process.process.poll() is None:
                process.terminate()
        cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--txs", type=int, default=4_000, help="transactions per worker count")
    parser.add_argument("--samples", type=int, default=40, help="one-at-a-time latency samples")
    parser.add_argument(
        "--worker-args", default="",
        help="flags for every worker, as one string (A/B a worker setting: "
        "--worker-args='--touched-digest 0')",
    )  # fmt: skip
    options = parser.parse_args()
    print(
        f"machine: {platform.platform()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; one DC on loopback, SQLite workers (WAL)\n"
    )
    print(
        "| workers | applied/s | ENQUEUED->OK p50 ms | p99 ms "
        "| ENQUEUED->all workers p50 ms | p99 ms |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for count in options.workers:
        with tempfile.TemporaryDirectory(prefix="txsync-apply-") as root:
            figures = measure(
                count, options.txs, options.samples, Path(root), options.worker_args.split()
            )
        print(
            f"| {count} | {figures['applied_per_s']:,.0f} | {figures['ok_p50']:.1f} | "
            f"{figures['ok_p99']:.1f} | {figures['all_p50']:.1f} | {figures['all_p99']:.1f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
