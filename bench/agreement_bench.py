"""Agreement latency across DCs: submit at one DC -> ACCEPTED (ordered) at every DC.

    make bench-agreement        (or: .venv/bin/python -m bench.agreement_bench --help)

For each round-trip time, starts a cluster of real processes (a transaction-store and a
sync-coordinator per DC) whose coordinators talk through the link emulator with half the
RTT as one-way delay on every directed link. A client at each DC in turn submits one
transaction and waits until every DC's store reports it ACCEPTED; clients reach their
own and the other stores directly (a client is local to its DC; the stores answer
``Wait`` the moment the state is durable). Prints p50 and p99 per RTT next to the
target of PROTOCOL.md section 6 (about one round trip; the issue's bar: 1.5 RTT + 20 ms).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support.cluster import LocalCluster
from txsync.client import Client


def _statement(n: int) -> tuple[str, int]:
    return "UPDATE accounts SET balance = balance + 1 WHERE id = ?", n


def measure(rtt_ms: float, samples: int, root: Path) -> list[float]:
    cluster = LocalCluster(root, 3, one_way_delay_ms=rtt_ms / 2)
    # A client per DC (each asks its own DC only), without keys: a probe, not a writer.
    clients = [Client(dc.store.address, idempotent=False, timeout=30) for dc in cluster.dcs]
    latencies: list[float] = []
    try:
        with ThreadPoolExecutor(len(clients)) as pool:
            for n in range(samples + 5):
                origin = clients[n % len(clients)]
                started = time.perf_counter()
                tx_id = origin.submit(*_statement(n), wait=None).tx_id
                waits = [pool.submit(client.wait, tx_id, "accepted") for client in clients]
                for wait in waits:
                    wait.result()  # Timeout if not ACCEPTED there within 30 s
                elapsed = (time.perf_counter() - started) * 1000
                if n >= 5:  # the first few warm up connections
                    latencies.append(elapsed)
                time.sleep(0.02)
    finally:
        for client in clients:
            client.close()
        cluster.stop()
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtts", default="0,10,50", help="round-trip times in ms")
    parser.add_argument("--samples", type=int, default=60, help="transactions per RTT")
    options = parser.parse_args()
    print(
        f"machine: {platform.platform()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; 3 DCs on loopback, link emulator between coordinators"
    )
    print()
    print(
        "| RTT ms | samples | submit->ACCEPTED at all DCs p50 ms | p99 ms | bar 1.5 RTT + 20 ms |"
    )
    print("| ---: | ---: | ---: | ---: | ---: |")
    for rtt in (float(r) for r in options.rtts.split(",")):
        with tempfile.TemporaryDirectory(prefix="txsync-agree-") as tmp:
            latencies = sorted(measure(rtt, options.samples, Path(tmp)))
        p50 = statistics.median(latencies)
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        bar = 1.5 * rtt + 20
        verdict = "met" if p50 <= bar else "MISSED"
        print(
            f"| {rtt:.0f} | {len(latencies)} | {p50:.1f} | {p99:.1f} | {bar:.0f} ({verdict}) |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
