"""What txlog rotations leave in one transaction-store's memory, at rest.

    .venv/bin/python -m bench.rotation_memory --help

Starts one real transaction-store (no coordinator: every transaction stays INCOMING,
so every rotation keeps all of them), submits ``--kept`` one-row transactions in
batches, then asks for ``--rotations`` rotations one after another (the admin API's
``TruncateLog``, as an operator would) and prints the store's RSS before and after
each, and its peak while the rotation ran (``VmHWM``, reset before each through
``/proc/<pid>/clear_refs``). The live objects are the same after each rotation as
before it: what RSS gains is what the allocator keeps of the rotation's burst, and the
peak is what the rotation held at once. A store's rotation under a
batched load set its high-water mark for good (issue 47, ``docs/benchmarks.md``); at
rest the same burst shows, smaller, with nothing else running. To see pymalloc's
arenas as well, load ``bench/heap_probe`` (its docstring) and signal the store.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import grpc

from bench.proc_stats import peak_rss_mib, reset_peak_rss
from bench.soak import rss_mib
from tests.support.processes import transaction_store
from txsync.v1 import admin_pb2, admin_pb2_grpc, client_pb2, client_pb2_grpc, common_pb2

BATCH = 500
TIMEOUT_S = 300.0


def _batch(first: int, count: int) -> client_pb2.SubmitBatchRequest:
    return client_pb2.SubmitBatchRequest(
        submits=[
            client_pb2.SubmitRequest(
                body=common_pb2.TxBody(
                    statements=[common_pb2.Statement(sql=f"INSERT INTO kv VALUES ({k}, {k})")]
                )
            )
            for k in range(first, first + count)
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kept", type=int, default=6000, help="transactions every rotation keeps")
    parser.add_argument("--rotations", type=int, default=4, help="rotations one after another")
    options = parser.parse_args(argv)
    if options.kept < 1 or options.rotations < 1:
        parser.error("--kept and --rotations must be at least 1")
    with tempfile.TemporaryDirectory(prefix="txsync-rotation-memory-") as root:
        store = transaction_store(
            Path(root), "dc1", "--log-file-bytes-max", str(1 << 30),
            "--log-file-entries-max", "100000000",
            "--incoming-max", str(options.kept), "--unfinished-max", str(options.kept),
        )  # fmt: skip
        store.start()
        try:
            assert store.process is not None
            pid = store.process.pid
            with grpc.insecure_channel(store.address) as channel:
                submit = client_pb2_grpc.ClientServiceStub(channel).SubmitBatch
                for first in range(0, options.kept, BATCH):
                    submit(_batch(first, min(BATCH, options.kept - first)), timeout=TIMEOUT_S)
                before = rss_mib(pid)
                print(f"{options.kept:,} transactions held: RSS {before:.1f} MiB")
                truncate = admin_pb2_grpc.AdminServiceStub(channel).TruncateLog
                for number in range(1, options.rotations + 1):
                    reset_peak_rss(pid)
                    truncate(admin_pb2.TruncateLogRequest(), timeout=TIMEOUT_S)
                    print(
                        f"after rotation {number}: RSS {rss_mib(pid):.1f} MiB "
                        f"(at most {peak_rss_mib(pid):.1f} MiB while it ran)"
                    )
                print(f"the rotations left {rss_mib(pid) - before:+.1f} MiB")
        finally:
            store.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
