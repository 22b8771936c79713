"""The client library under many concurrent callers: what its batching buys.

    make bench-client         (or: .venv/bin/python -m bench.client_bench --help)

Starts `txsync dev up` (3 DCs, two SQLite workers each) and, one after another for
``--duration`` seconds each, runs ``--callers`` closed-loop callers (threads) against
dc1, each submitting a one-row upsert and waiting until it is ACCEPTED, then the next:

* ``raw Submit``: each caller its own unary ``Submit`` on a shared channel, no library
  (what the benchmark's clients did before the library);
* ``library, batching off``: ``Client(batch_max=1, in_flight_max=callers)``, one message
  per submit on the client's ``SubmitEach`` stream (failover and keys, no gathering);
* ``library, off, unary``: the same with ``submit_stream=False``, a unary ``Submit`` call
  per submit (the library before ``SubmitEach``);
* ``library (4 in flight)``: ``Client()`` as shipped (at most 4 calls in flight, the rest
  gathered into ``SubmitBatch`` calls of up to 256), and with 1 call in flight.

Every mode runs ``--rounds`` times, alternating, and the table prints each round: ordered
transactions per second, p50 and p99 of submit -> ACCEPTED as the caller saw it, submits
per call, and CPU per transaction of the cluster's processes and of the client's.
Nothing is asserted; the figures go to docs/client.md by hand, with the date.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import duration_pb2

from bench.proc_stats import cpu_seconds
from tests.support.dev_up import down, up
from txsync.client import Client
from txsync.v1 import client_pb2, client_pb2_grpc, common_pb2

UPSERT = "INSERT INTO bench (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v"
KEYS = 100_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--callers", type=int, default=48, help="concurrent callers (48)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per mode (8)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every mode (2)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-client-") as data:
        process = up(Path(data))
        try:
            cluster = Path(data) / "cluster.json"
            with Client(str(cluster), dc="dc1") as client:
                client.submit("CREATE TABLE bench (k INTEGER PRIMARY KEY, v TEXT)", wait="ok")
                address = client.current.address
            pids = _descendants(process.pid)
            print(f"{options.callers} callers at dc1, {options.duration:g} s per mode, "
                  f"submit -> ACCEPTED")  # fmt: skip
            print(f"{'mode':26} {'tx/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'per call':>8} "
                  f"{'cluster CPU ms/tx':>17} {'client CPU ms/tx':>16}")  # fmt: skip
            for _ in range(options.rounds):
                for mode in MODES:
                    row = _measure(mode, str(cluster), address, options, pids)
                    print(row, flush=True)
        finally:
            down(process)


def _measure(
    mode: str, cluster: str, address: str, options: argparse.Namespace, pids: list[int]
) -> str:
    callers: int = options.callers
    latencies: list[float] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + options.duration
    client = None
    calls: Callable[[], int]
    if mode == "raw Submit":
        channel = grpc.insecure_channel(address)
        stub = client_pb2_grpc.ClientServiceStub(channel)
        wait = duration_pb2.Duration(seconds=30)

        def submit(n: int) -> None:
            params = [common_pb2.SqlValue(int_value=n % KEYS),
                      common_pb2.SqlValue(text_value=uuid.uuid4().hex)]  # fmt: skip
            body = common_pb2.TxBody(statements=[common_pb2.Statement(sql=UPSERT, params=params)])
            answer = stub.Submit(
                client_pb2.SubmitRequest(body=body, wait_for=common_pb2.TX_STATE_ACCEPTED,
                                         wait_timeout=wait), timeout=40,
            )  # fmt: skip
            assert answer.reached

        made = [0]

        def count() -> int:
            return made[0]

        calls = count
    else:
        chosen = MODES[mode]
        settings: dict[str, Any] = (
            {"batch_max": 1, "in_flight_max": callers}
            if chosen is None or "submit_stream" in chosen
            else {}
        )
        settings.update(chosen or {})
        client = Client(cluster, dc="dc1", **settings)

        def submit(n: int) -> None:
            assert client is not None
            client.submit(UPSERT, n % KEYS, uuid.uuid4().hex)

        def library_calls() -> int:
            assert client is not None
            return client.calls

        calls = library_calls

    def caller(index: int) -> None:
        n = index
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            submit(n)
            took = (time.perf_counter() - started) * 1000
            with lock:
                latencies.append(took)
                if mode == "raw Submit":
                    made[0] += 1
            n += callers

    cpu_before = sum(_cpu(pid) for pid in pids)
    own_before = _own_cpu()
    calls_before = calls()
    started = time.monotonic()
    threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    done = len(latencies)
    cluster_cpu = sum(_cpu(pid) for pid in pids) - cpu_before
    own_cpu = _own_cpu() - own_before
    made_calls = calls() - calls_before
    if client is not None:
        client.close()
    else:
        channel.close()
    ordered = sorted(latencies)
    return (
        f"{mode:26} {done / elapsed:7.0f} {statistics.median(ordered):7.1f} "
        f"{ordered[int(len(ordered) * 0.99)]:7.1f} {done / max(made_calls, 1):8.1f} "
        f"{cluster_cpu * 1000 / done:17.2f} {own_cpu * 1000 / done:16.2f}"
    )


MODES: dict[str, dict[str, Any] | None] = {
    "raw Submit": None,
    "library, batching off": None,
    "library, off, unary": {"submit_stream": False},
    "library, 1 call in flight": {"in_flight_max": 1},
    "library (4 in flight)": {},
}


def _descendants(root: int) -> list[int]:
    """Every process under ``root`` (dev up's services and workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _cpu(pid: int) -> float:
    try:
        return cpu_seconds(pid)
    except OSError:
        return 0.0


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
