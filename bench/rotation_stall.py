"""What a txlog rotation costs the submits of one transaction-store, at a steady rate.

    make bench-rotation   (or: .venv/bin/python -m bench.rotation_stall --help)

Starts one real transaction-store (fsync on, no coordinator: every transaction stays
INCOMING, so each rotation keeps all of them and its snapshot grows as the run goes
on) with a small ``--log-file-bytes-max``, so that it rotates every few seconds. Paced
clients submit one transaction per call at ``--rate`` a second for ``--seconds``. It
prints the submit latency (p50, p99, max) of the submits that overlapped a rotation
and of the others, and what the rotations reported (how long each took, how long
it held the store's lock, how many transactions it kept).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import grpc

from tests.support.processes import transaction_store
from txsync.v1 import client_pb2, client_pb2_grpc, common_pb2

ROTATED = re.compile(
    r"^(\S+ \S+) INFO \S+ txlog rotated in (\d+) ms \(lock held (\d+) ms[^)]*\): .* (\d+) kept,"
)
CLIENTS = 8


def _quantile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) >= 20 else max(values)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=250.0, help="submits a second")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the run")
    parser.add_argument(
        "--log-file-bytes-max", type=int, default=512 * 1024, help="the store's flag"
    )
    options = parser.parse_args(argv)
    if options.rate <= 0 or options.seconds <= 0:
        parser.error("--rate and --seconds must be positive")
    with tempfile.TemporaryDirectory(prefix="txsync-rotation-") as root:
        store = transaction_store(
            Path(root), "dc1", "--log-file-bytes-max", str(options.log_file_bytes_max),
            "--incoming-max", "10000000", "--unfinished-max", "10000000",
        )  # fmt: skip
        store.start()
        submits: list[tuple[float, float]] = []  # (wall-clock start, seconds)
        lock = threading.Lock()
        stop = time.monotonic() + options.seconds
        interval = CLIENTS / options.rate

        def client(number: int) -> None:
            with grpc.insecure_channel(store.address) as channel:
                stub = client_pb2_grpc.ClientServiceStub(channel)
                due = time.monotonic() + number * interval / CLIENTS
                while due < stop:
                    time.sleep(max(0.0, due - time.monotonic()))
                    body = common_pb2.TxBody(
                        statements=[common_pb2.Statement(sql="INSERT INTO t VALUES (1)")]
                    )
                    started, wall = time.perf_counter(), time.time()
                    stub.Submit(client_pb2.SubmitRequest(body=body), timeout=120)
                    with lock:
                        submits.append((wall, time.perf_counter() - started))
                    due += interval

        try:
            threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            store.terminate()
        rotations = []
        for line in store.log().splitlines():
            match = ROTATED.match(line)
            if match:
                print("  " + line.split(" txlog ", 1)[1][:150])
                at, took, held, kept = match.groups()
                ended = datetime.strptime(at, "%Y-%m-%d %H:%M:%S,%f").timestamp()
                rotations.append((ended - int(took) / 1000, ended, int(took), int(held), int(kept)))
    during: list[float] = []
    other: list[float] = []
    for at, seconds in submits:
        overlaps = any(start <= at + seconds and at <= end for start, end, *_ in rotations)
        (during if overlaps else other).append(seconds * 1000)
    print(f"{len(submits):,} submits at {options.rate:g}/s; {len(rotations)} rotations")
    for name, values in (("overlapping a rotation", during), ("the others", other)):
        if values:
            print(
                f"  submits {name:<24} {len(values):6,}: p50 {_quantile(values, 50):6.1f} ms, "
                f"p99 {_quantile(values, 99):6.1f} ms, max {max(values):6.1f} ms"
            )
    if rotations:
        took = [r[2] for r in rotations]
        held = [r[3] for r in rotations]
        print(
            f"  rotations: took median {statistics.median(took):.0f} ms (longest {max(took)}), "
            f"lock held median {statistics.median(held):.0f} ms (longest {max(held)}), "
            f"kept up to {max(r[4] for r in rotations):,}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
