"""How many gRPC calls a transaction costs TxSync, by service and method.

    make bench-rpcs         (or: .venv/bin/python -m bench.rpc_counts --help)

Starts the benchmark's TxSync cluster (3 DCs, 1 worker each, link emulator) with every
service exporting traces to an in-process OTLP collector, loads it like ``make bench``
does, and divides the server spans started inside the measured window by the
transactions ordered in it. Streams (the store's feeds to the coordinator and the
dispatch, the dispatch's to the workers) count once per stream, not per message; health
checks and worker heartbeats are not traced. Tracing costs CPU itself, so the rates
printed here are lower than ``make bench``'s: read the calls, not the speed.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from bench import load
from bench.systems import TxSyncSystem
from tests.support.otlp_collector import OtlpCollector

SERVER_SPAN = 2
"""``Span.SpanKind.SPAN_KIND_SERVER`` in OTLP."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtt", type=float, default=10.0, help="round-trip time, ms")
    parser.add_argument("--clients", type=int, default=4, help="clients per DC")
    parser.add_argument("--batches", default="1,20", help="submits per call, each a run")
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds")
    options = parser.parse_args()
    with OtlpCollector() as collector:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.endpoint  # the services inherit it
        os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "200"
        system = TxSyncSystem(options.rtt / 2)
        nodes = system.start()
        try:
            for batch in (int(b) for b in options.batches.split(",")):
                start = time.time() + 4
                stop = start + options.duration
                plans = [load.Plan(system.name, n.name, n.address, options.clients, start, stop,
                                   batch) for n in nodes]  # fmt: skip
                with ThreadPoolExecutor(1) as pool:
                    loading = pool.submit(load.run, plans)
                    time.sleep(max(0.0, start - time.time()))
                    before, began = system.committed(), time.time()
                    time.sleep(max(0.0, stop - time.time()))
                    ordered, ended = system.committed() - before, time.time()
                    loading.result()
                time.sleep(2)  # the last spans' export
                calls: collections.Counter[tuple[str, str]] = collections.Counter()
                for span in collector.spans(lambda s: s.span.kind == SERVER_SPAN):
                    if began <= span.span.start_time_unix_nano / 1e9 < ended:
                        calls[(span.service, span.name.rsplit("/", 1)[-1])] += 1
                rate = ordered / (ended - began)
                print(
                    f"{options.clients} clients per DC, {batch} submit(s) per call, "
                    f"{options.rtt:.0f} ms RTT: {ordered} ordered ({rate:.0f}/s, traced)"
                )
                for (service, method), count in calls.most_common():
                    print(f"  {service:18} {method:20} {count / max(1, ordered):6.2f} per tx")
                print(f"  all server calls: {sum(calls.values()) / max(1, ordered):.2f} per tx")
        finally:
            system.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
