"""What a transaction costs TxSync in work, per service: gRPC messages by method, fsyncs,
txlog entries, body files, thread hops, database commits, CPU and context switches.

    make bench-rpcs         (or: .venv/bin/python -m bench.rpc_counts --help)

Starts the benchmark's TxSync cluster (3 DCs, 1 worker each, link emulator), loads it
like ``make bench`` does, and reads every process's work counters
(``txsync.telemetry.work``, served on its ``/metrics``) before and after the measured
window. Each figure is the whole cluster's (all DCs) divided by the transactions ordered
in the window. Context switches are the voluntary ones of all of a process's threads
(``/proc``): a thread waiting to be woken, as each handover between threads or processes
makes. gRPC messages are counted at the servers: a unary call is one message
received and one sent; a stream message is one received (client to server) or sent.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from prometheus_client.parser import text_string_to_metric_families

from bench import load
from bench.proc_stats import context_switches, cpu_seconds, kind_of
from bench.systems import TxSyncSystem

Counts = collections.defaultdict[tuple[str, str], float]
"""(service kind, what) -> count, summed over the cluster's processes."""

KINDS = ("transaction-store", "sync-coordinator", "worker-dispatch", "worker")


def metrics_addresses(system: TxSyncSystem) -> dict[str, str]:
    """Each process's metrics address, by a name whose first word is its kind."""
    assert system.cluster is not None
    found = {}
    for node, dc in system.cluster.layout["dcs"].items():
        for key, kind in (("store_metrics", "transaction-store"), ("metrics", "sync-coordinator"),
                          ("dispatch_metrics", "worker-dispatch")):  # fmt: skip
            if key in dc:
                found[f"{kind} {node}"] = dc[key]
        for worker, address in dc.get("worker_metrics", {}).items():
            found[f"worker {worker}"] = address
    return found


def scrape(addresses: dict[str, str], pids: dict[str, int]) -> Counts:
    counts: Counts = collections.defaultdict(float)
    for name, address in addresses.items():
        kind = kind_of(name)
        text = urllib.request.urlopen(f"http://{address}/metrics", timeout=30).read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "txsync_work_total":
                    counts[(kind, sample.labels["kind"].replace("_", " "))] += sample.value
                elif sample.name == "txsync_rpc_messages_total":
                    what = f"{sample.labels['method']} {sample.labels['direction']}"
                    counts[(kind, what)] += sample.value
                elif sample.name.startswith("txsync_rpc_message_bytes") and sample.name.endswith(
                    "_total"
                ):
                    what = f"{sample.labels['method']} bytes {sample.labels['direction']}"
                    counts[(kind, what)] += sample.value
    for name, pid in pids.items():
        counts[(kind_of(name), "CPU ms")] += cpu_seconds(pid) * 1000
        counts[(kind_of(name), "context switches")] += context_switches(pid)
    return counts


def report(counts: Counts, ordered: int) -> list[str]:
    """One row per kind of work, a column per service kind, per ordered transaction."""
    whats = sorted(
        {what for _, what in counts}, key=lambda w: (w != "CPU ms", "ed" in w, " bytes " in w, w)
    )
    lines = [f"  {'per ordered transaction':42}" + "".join(f"{k:>19}" for k in KINDS)]
    for what in whats:
        cells = [counts[(kind, what)] / max(1, ordered) for kind in KINDS]
        if any(cells):
            lines.append(f"  {what:42}" + "".join(f"{c:19.2f}" for c in cells))
    messages = sum(
        n
        for (_, what), n in counts.items()
        if what.endswith(("received", "sent")) and " bytes " not in what
    )
    lines.append(f"  gRPC messages, all services: {messages / max(1, ordered):.2f} per tx")
    peer_bytes = sum(
        n for (kind, what), n in counts.items()
        if kind == "sync-coordinator" and what.startswith("Exchange.") and "bytes received" in what
    )  # fmt: skip
    lines.append(f"  peer stream bytes (the WAN): {peer_bytes / max(1, ordered):.0f} per tx")
    return lines


def _with(coordinator_args: str) -> str:
    return f", coordinators with {coordinator_args}" if coordinator_args else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtt", type=float, default=0.0, help="round-trip time, ms")
    parser.add_argument("--clients", type=int, default=16, help="clients per DC")
    parser.add_argument("--batches", default="1,50", help="submits per call, each a run")
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds")
    parser.add_argument(
        "--coordinator-args", default="",
        help="extra flags for every sync-coordinator, one string (an A/B of a setting: "
        "run once without and once with, e.g. --coordinator-args='--busy-round-gap-ms 5')",
    )  # fmt: skip
    options = parser.parse_args()
    system = TxSyncSystem(options.rtt / 2, coordinator_args=tuple(options.coordinator_args.split()))
    nodes = system.start()
    try:
        addresses, pids = metrics_addresses(system), system.processes()
        for batch in (int(b) for b in options.batches.split(",")):
            start = time.time() + 4
            stop = start + options.duration
            plans = [load.Plan(system.name, n.name, n.address, options.clients, start, stop,
                               batch) for n in nodes]  # fmt: skip
            with ThreadPoolExecutor(1) as pool:
                loading = pool.submit(load.run, plans)
                time.sleep(max(0.0, start - time.time()))  # the clients start at ``start``
                before, committed = scrape(addresses, pids), system.committed()
                time.sleep(max(0.0, stop - time.time()))
                after, ordered = scrape(addresses, pids), system.committed() - committed
                loading.result()
            rate = ordered / options.duration
            print(
                f"{options.clients} clients per DC, {batch} submit(s) per call, "
                f"{options.rtt:.0f} ms RTT{_with(options.coordinator_args)}: {ordered} ordered "
                f"({rate:.0f}/s)"
            )
            spent: Counts = collections.defaultdict(float)
            for key, value in after.items():
                spent[key] = value - before[key]
            print("\n".join(report(spent, ordered)), flush=True)
    finally:
        system.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
