"""What the plumbing under a transaction costs alone: one gRPC message, one unary call,
one hop to a thread and back, one small fsynced append, one body file.

    make bench-messages     (or: .venv/bin/python -m bench.message_cost --help)

At one client per DC every TxSync service handles each message on its own (nothing to
gather it with), so a transaction's CPU is about its messages times what one costs,
plus the services' own work. This measures the first factor on this machine, with none
of TxSync's code: a server process (this module with ``--serve``) answers a client
process over loopback, both on uvloop as the services run (``TXSYNC_EVENT_LOOP``), one
request in flight at a time, as at low load. CPU is user + system time of both
processes over the measured requests (``/proc``), so the native work of gRPC's threads
counts too. The thread hop (``asyncio.to_thread``: how the store reaches its fsync and a
worker its database) and the synced appends (a txlog group commit of one small entry:
with ``fsync``, as the writer does, with ``fdatasync``, and with ``fdatasync`` into a
preallocated file, as etcd's WAL does) run in the client process alone, as do the body
file's rows: a 120-byte body gzipped by ``gzip.compress`` (zlib's default state) and by
the store's ``gzip_body``, and a whole body file as the store writes one
(``BodyStore.write``: gzip, create, write, rename).

The gRPC rows are measured on both of gRPC's transports, side by side in each run:
the poller-driven one the services run on (``GRPC_EXPERIMENTS``, set by ``txsync``'s
command line for them) and gRPC's default, the EventEngine. Each run is then a pair of
client processes, one per transport, each with its own server.

The "after 10 ms idle" rows (a tenth of ``--count`` each, services' transport) wait that
long before each operation, as the services' messages come at one client per DC: on
this machine a message or a hop after the processes slept costs about four times the
CPU of one back to back (docs/benchmarks.md, Tuning 21), which is why a message in the
cluster costs several times the bare figure above it. The row of the sleep alone gives
the client's share of it, to subtract.

Each figure is the median of ``--reps`` runs of ``--count`` operations after a warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench.proc_stats import cpu_seconds
from txsync.cli.main import GRPC_EXPERIMENTS
from txsync.rpc import run_service
from txsync.transaction_store.txlog.bodies import GZIP_LEVEL, BodyStore, gzip_body

PAYLOAD_BYTES = 300
"""About a post's or a state change's size at one client per DC."""
BODY = b"\n\x1c\n\x18INSERT INTO t VALUES (1)" * 4
"""A 120-byte encoded body: one short statement, as the benchmarks submit."""
SERVICE = "bench.MessageCost"
TRANSPORTS = {"the services' transport": GRPC_EXPERIMENTS, "gRPC's default": ""}
"""Each transport's ``GRPC_EXPERIMENTS``: the poller-driven one, and the EventEngine."""
GRPC_ROWS = ("stream: a message each way", "unary call")
IDLE_GAP_S = 0.01
"""The pause before each operation of the "after 10 ms idle" rows: about the gap between
one service's messages at one client per DC (~130 transactions/s over the cluster)."""
IDLE_COUNT_DIVISOR = 10
"""Those rows run a tenth of ``--count`` (each waits ``IDLE_GAP_S`` first)."""


def _same(data: bytes) -> bytes:
    return data


async def _serve() -> None:
    async def echo_stream(
        requests: AsyncIterator[bytes], _: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    async def echo(request: bytes, _: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return request

    handlers = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Stream": grpc.stream_stream_rpc_method_handler(echo_stream, _same, _same),
            "Unary": grpc.unary_unary_rpc_method_handler(echo, _same, _same),
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handlers,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)  # the client reads the port, then our CPU, while we serve
    await server.wait_for_termination()


@dataclass(frozen=True)
class Cost:
    what: str
    client_us: float
    server_us: float
    wall_us: float

    @property
    def total_us(self) -> float:
        return self.client_us + self.server_us


async def _timed(
    what: str, operation: Callable[[], Awaitable[object]], count: int, server_pid: int | None
) -> Cost:
    for _ in range(min(count, 200)):
        await operation()  # warm-up: connections, caches, the allocator
    server_before = cpu_seconds(server_pid) if server_pid else 0.0
    cpu_before, wall_before = time.process_time(), time.perf_counter()
    for _ in range(count):
        await operation()
    cpu, wall = time.process_time() - cpu_before, time.perf_counter() - wall_before
    server = cpu_seconds(server_pid) - server_before if server_pid else 0.0
    return Cost(what, cpu / count * 1e6, server / count * 1e6, wall / count * 1e6)


def _after_idle(operation: Callable[[], Awaitable[object]]) -> Callable[[], Awaitable[None]]:
    """``operation`` after ``IDLE_GAP_S`` of nothing: both processes sleep in between, as
    the services do between the messages of one client per DC. (The client's column
    also holds the wake of its own sleep's timer; the server's holds nothing else.)"""

    async def idle_then() -> None:
        await asyncio.sleep(IDLE_GAP_S)
        await operation()

    return idle_then


def _idle_count(count: int) -> int:
    return max(1, count // IDLE_COUNT_DIVISOR)


async def _nothing() -> None:
    pass


async def _measure(port: int, server_pid: int, count: int) -> list[Cost]:
    payload = b"x" * PAYLOAD_BYTES
    costs = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stream = channel.stream_stream(
            f"/{SERVICE}/Stream", request_serializer=_same, response_deserializer=_same
        )()
        unary = channel.unary_unary(
            f"/{SERVICE}/Unary", request_serializer=_same, response_deserializer=_same
        )

        async def round_trip() -> None:
            await stream.write(payload)
            await stream.read()

        costs.append(await _timed("stream: a message each way", round_trip, count, server_pid))
        costs.append(await _timed("unary call", lambda: unary(payload), count, server_pid))
        costs.append(
            await _timed(
                f"stream: a message each way, after {IDLE_GAP_S * 1000:.0f} ms idle",
                _after_idle(round_trip),
                _idle_count(count),
                server_pid,
            )
        )
        await stream.done_writing()
    costs.append(
        await _timed(
            f"nothing, after {IDLE_GAP_S * 1000:.0f} ms idle (the sleep's own wake)",
            _after_idle(_nothing),
            _idle_count(count),
            None,
        )
    )
    costs.append(await _timed("thread hop (asyncio.to_thread)", _hop, count, None))
    costs.append(
        await _timed(
            f"thread hop, after {IDLE_GAP_S * 1000:.0f} ms idle",
            _after_idle(_hop),
            _idle_count(count),
            None,
        )
    )
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as scratch:
        for sync_name, sync, preallocated in SYNC_MODES:
            costs.append(await _appends(Path(scratch), sync_name, sync, preallocated, count))
        bodies = BodyStore(Path(scratch) / "bodies")

        async def default_gzip() -> None:
            gzip.compress(BODY, compresslevel=GZIP_LEVEL, mtime=0)

        async def store_gzip() -> None:
            gzip_body(BODY)

        async def body_file() -> None:
            # Random ids, as the store's: files spread over its 4,096 prefix directories,
            # which costs the kernel far more than files sharing one (Tuning 17).
            bodies.write(str(uuid.uuid4()), BODY)

        costs.append(await _timed("gzip.compress, 120-byte body", default_gzip, count, None))
        costs.append(await _timed("gzip_body (the store's), same body", store_gzip, count, None))
        costs.append(await _timed("body file (BodyStore.write)", body_file, count, None))
    return costs


SYNC_MODES: tuple[tuple[str, Callable[[int], None], bool], ...] = (
    ("fsync", os.fsync, False),
    ("fdatasync", os.fdatasync, False),
    ("fdatasync, preallocated", os.fdatasync, True),
)
"""The txlog's writer appends and calls ``fsync`` (the first row); issue 52 asked whether
``fdatasync`` into a preallocated file, as etcd's WAL does, would pay: the file's size
then does not change with each append, so the sync has no metadata to write."""
PREALLOCATED_BYTES = 64 * 1024 * 1024


async def _appends(
    scratch: Path, name: str, sync: Callable[[int], None], preallocated: bool, count: int
) -> Cost:
    """One small append and its sync, in a thread, as the writer does it."""
    path = scratch / f"log-{name.replace(', ', '-')}"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT)
    payload = b"x" * PAYLOAD_BYTES
    offset = 0
    try:
        if preallocated:
            os.posix_fallocate(descriptor, 0, PREALLOCATED_BYTES)
            os.fsync(descriptor)

        def append() -> None:
            nonlocal offset
            if offset + len(payload) > PREALLOCATED_BYTES:
                offset = 0  # a long run wraps within the preallocated bytes
            os.pwrite(descriptor, payload, offset)
            offset += len(payload)
            sync(descriptor)

        return await _timed(
            f"append {PAYLOAD_BYTES} B + {name}, in a thread",
            lambda: asyncio.to_thread(append),
            count,
            None,
        )
    finally:
        os.close(descriptor)
        path.unlink()


async def _hop() -> None:
    await asyncio.to_thread(int)


def measure_once(count: int) -> list[Cost]:
    """One run, in this process (its gRPC on whatever ``GRPC_EXPERIMENTS`` says)."""
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.message_cost", "--serve"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line.strip().isdigit():
            raise SystemExit(f"the server process did not start (it printed {line!r})")
        return run_service(_measure(int(line), server.pid, count))
    finally:
        server.kill()
        server.wait()


def measure_on(experiments: str, count: int) -> list[Cost]:
    """One run in a client process of its own whose gRPC (and its server's) has
    ``GRPC_EXPERIMENTS`` set to ``experiments`` before it starts."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.message_cost", "--measure", "--count", str(count)],
        env={**os.environ, "GRPC_EXPERIMENTS": experiments},
        capture_output=True, text=True, check=False, timeout=3600,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"a measuring process failed:\n{result.stderr[-2000:]}")
    return [Cost(**fields) for fields in json.loads(result.stdout)]


def _rows(runs: dict[str, list[Cost]]) -> list[Cost]:
    """The gRPC rows of every transport, then the rest from the services' transport."""
    rows = []
    for what in GRPC_ROWS:
        for transport, run in runs.items():
            (cost,) = (cost for cost in run if cost.what == what)
            rows.append(dataclasses.replace(cost, what=f"{what} ({transport})"))
    services = runs[next(iter(TRANSPORTS))]
    return rows + [cost for cost in services if cost.what not in GRPC_ROWS]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.message_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--count", type=int, default=3000, help="operations per run (default 3000)")
    parser.add_argument("--reps", type=int, default=3, help="runs; medians shown (default 3)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        run_service(_serve())
        return
    if not 1 <= args.count <= 1_000_000 or not 1 <= args.reps <= 100:
        parser.error("--count must be 1..1,000,000 and --reps 1..100")
    if args.measure:
        print(json.dumps([dataclasses.asdict(cost) for cost in measure_once(args.count)]))
        return
    runs = []
    for rep in range(args.reps):
        print(f"run {rep + 1} of {args.reps} ...", file=sys.stderr, flush=True)
        runs.append(_rows({transport: measure_on(experiments, args.count)
                           for transport, experiments in TRANSPORTS.items()}))  # fmt: skip
    print(f"{args.count} operations per run, one in flight; medians of {args.reps} runs")
    print(f"  {'per operation':56}{'client CPU us':>14}{'server CPU us':>14}"
          f"{'both us':>10}{'wall us':>10}")  # fmt: skip
    for index, first in enumerate(runs[0]):
        cells = [statistics.median(getattr(run[index], field) for run in runs)
                 for field in ("client_us", "server_us", "total_us", "wall_us")]  # fmt: skip
        print(f"  {first.what:56}" + "".join(f"{cell:14.1f}" for cell in cells[:2])
              + "".join(f"{cell:10.1f}" for cell in cells[2:]))  # fmt: skip


if __name__ == "__main__":
    main()
