"""Where a transaction's time goes, hop by hop, read from the txlogs of a loaded cluster.

    make bench-breakdown    (or: .venv/bin/python -m bench.latency_breakdown --help)

Starts the benchmark's TxSync cluster (3 DCs, 1 SQLite worker each, link emulator),
loads it like ``make bench`` (single submits, ``--clients`` per DC, waiting for ACCEPTED)
or, with ``--one-at-a-time``, like the probe, then reads every DC's txlog. Each entry
carries the store's wall clock at its append (``at_unix_ms``, 1 ms resolution; every DC
runs on this machine, so the clocks agree). For every transaction it takes the time of
its submit at the origin as zero and prints, at the origin and at the peers, when each
later entry was appended: the meta (the coordinator persisting it), the body, the synced
append and each state. It also prints CPU per transaction by process kind, since on a
loaded 2-core machine the hops wait for CPU more than for the network.

With ``--client-legs`` it then loads the cluster again for ``--duration``, the same
clients as threads of one process of their own (not this one, whose link emulator
would hold the GIL as answers come), recording each transaction, and adds the client's
legs, joined with the transaction's entries: its send to the origin's submit
entry, the origin's ACCEPTED to its answer, and the whole wait. Entries carry whole
milliseconds, the client's times do not: a leg is up to 1 ms off, its median less.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench.load import txsync_client, value_of
from bench.suite import Point, Timing, measure, probe
from bench.systems import KEYS, TXSYNC_UPSERT, TxSyncSystem
from txsync.client import Client
from txsync.pipeline.txlog_rows import entries_of_dc
from txsync.transaction_store.state import StoreState

Times = dict[tuple[str, str], int]
"""(dc, what) -> at_unix_ms of the first such entry."""


def read_times(dcs: dict[str, Path]) -> tuple[dict[str, Times], dict[str, str]]:
    """Per transaction, when each DC appended what; and each transaction's origin."""
    times: dict[str, Times] = collections.defaultdict(dict)
    origins: dict[str, str] = {}
    for dc, data in dcs.items():
        replayed = StoreState(dc)  # the states, the implied ones too (``state.py``)
        for entry in entries_of_dc(data):
            kind, at = entry.WhichOneof("entry"), entry.at_unix_ms
            if kind == "submitted":
                times[entry.submitted.tx_id].setdefault((dc, "submit"), at)
                origins[entry.submitted.tx_id] = dc
            elif kind == "meta_known":
                times[entry.meta_known.meta.tx_id].setdefault((dc, "meta"), at)
            elif kind == "body_stored":
                times[entry.body_stored.tx_id].setdefault((dc, "body"), at)
            elif kind == "synced":
                for meta in entry.synced.metas:
                    times[meta.tx_id].setdefault((dc, "synced"), at)
            for moved in replayed.apply(entry):
                step = moved.step
                times[moved.record.tx_id].setdefault((dc, step.state.name), step.at_unix_ms)
    return times, origins


ORDER = ("submit", "meta", "body", "INCOMING", "synced", "ACCEPTED", "ENQUEUED", "TESTING",
         "OK", "FAILED")  # fmt: skip


def breakdown(times: dict[str, Times], origins: dict[str, str]) -> list[tuple[str, str, list[int]]]:
    """(where, what, sorted ms since the submit) for every kind of entry seen."""
    found: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
    for tx_id, seen in times.items():
        origin = origins.get(tx_id)
        if origin is None or (origin, "submit") not in seen:
            continue  # submitted before the txlog's oldest file
        start = seen[(origin, "submit")]
        for (dc, what), at in seen.items():
            found[("origin" if dc == origin else "peer", what)].append(at - start)
    rank = {what: n for n, what in enumerate(ORDER)}
    keys = sorted(found, key=lambda key: (key[0] != "origin", rank.get(key[1], 99), key[1]))
    return [(where, what, sorted(found[(where, what)])) for where, what in keys]


Sent = tuple[str, float, float]
"""A client's transaction: its id, when it was sent and when answered (unix ms)."""


def client_legs(addresses: list[str], clients: int, duration_s: float) -> list[Sent]:
    """Every transaction ``clients`` threads per DC submitted in ``duration_s``, each
    waiting for its own DC's ACCEPTED, one ``Submit`` each, with a client library per DC
    shared by its threads (as ``bench.load``'s clients)."""
    sent: list[Sent] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + duration_s

    def submit_until_stop(client: Client, seed: int) -> None:
        rng = random.Random(seed)
        mine: list[Sent] = []
        while time.monotonic() < stop_at:
            started = time.time() * 1000
            submitted = client.submit(
                TXSYNC_UPSERT, rng.randrange(KEYS), value_of(rng), wait="accepted"
            )
            mine.append((submitted.tx_id, started, time.time() * 1000))
        with lock:
            sent.extend(mine)

    libraries = [txsync_client(address, clients, 1) for address in addresses]
    try:
        threads = [threading.Thread(target=submit_until_stop, args=(library, seed))
                   for seed, library in enumerate(libraries * clients)]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for library in libraries:
            library.close()
    return sent


def client_rows(
    sent: list[Sent], times: dict[str, Times], origins: dict[str, str]
) -> list[tuple[str, str, list[float]]]:
    """The client's legs, joined with each transaction's entries at its origin."""
    legs: dict[str, list[float]] = {"sent>submit": [], "ACCEPTED>answer": [], "answer": []}
    for tx_id, started, answered in sent:
        origin = origins.get(tx_id)
        seen = times.get(tx_id, {})
        if origin is None or (origin, "submit") not in seen or (origin, "ACCEPTED") not in seen:
            continue
        legs["sent>submit"].append(seen[(origin, "submit")] - started)
        legs["ACCEPTED>answer"].append(answered - seen[(origin, "ACCEPTED")])
        legs["answer"].append(answered - started)
    return [("client", what, sorted(values)) for what, values in legs.items() if values]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    parser.add_argument("--rtt", type=float, default=0.0, help="round-trip time, ms")
    parser.add_argument("--clients", type=int, default=1, help="single-submit clients per DC")
    parser.add_argument("--duration", type=float, default=6.0, help="measured seconds")
    parser.add_argument("--one-at-a-time", action="store_true",
                        help="the probe's load: one transaction in the cluster")  # fmt: skip
    parser.add_argument("--client-legs", action="store_true",
                        help="then load it again from here and add the client's legs")  # fmt: skip
    options = parser.parse_args()
    if options.client_legs and options.one_at_a_time:
        parser.error("--client-legs goes with the clients' load, not --one-at-a-time")
    system = TxSyncSystem(options.rtt / 2)
    try:
        nodes = system.start()
        if options.one_at_a_time:
            accepted_all = probe(system, 40)["accepted_all_p50_ms"]
            print(f"one at a time: ACCEPTED at every DC p50 {accepted_all:.1f} ms")
        else:
            run = measure(system, nodes, Point(options.clients), rtt_ms=options.rtt,
                          timing=Timing(options.duration, 1.5))  # fmt: skip
            print(f"{options.clients} client(s) per DC: {run.committed_per_s:.0f} tx/s, "
                  f"p50 {run.p50_ms:.1f} ms, p99 {run.p99_ms:.1f} ms")  # fmt: skip
            cpu = run.cpu_ms_per_1k_tx
            print("CPU per transaction: " + ", ".join(
                f"{kind} {ms / 1000:.1f} ms" for kind, ms in sorted(cpu.items())
            ) + f"; {sum(cpu.values()) / 1000:.1f} ms in all")  # fmt: skip
        sent = []
        if options.client_legs:
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(1, mp_context=context) as pool:
                sent = pool.submit(
                    client_legs, system.nodes_addresses(), options.clients, options.duration
                ).result()
        assert system.cluster is not None
        dcs = {dc: Path(entry["data"]) for dc, entry in system.cluster.layout["dcs"].items()}
        times, origins = read_times(dcs)
        rows: list[tuple[str, str, Sequence[float]]] = [
            *breakdown(times, origins),
            *client_rows(sent, times, origins),
        ]
    finally:
        system.stop()
    print(f"{'where':<7} {'appended':<15} {'count':>6} {'p50 ms':>7} {'p90 ms':>7}")
    for where, what, values in rows:
        p50, p90 = values[len(values) // 2], values[int(len(values) * 0.9)]
        print(f"{where:<7} {what:<15} {len(values):>6} {p50:>7.1f} {p90:>7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
