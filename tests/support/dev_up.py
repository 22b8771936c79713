"""Running `txsync dev up` in tests, and the client calls those tests make to it."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc

from tests.support.processes import DEV_UP_BASES, ephemeral_low, share_of_this_test_worker
from txsync.parent_watch import child_environment
from txsync.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    client_pb2,
    client_pb2_grpc,
    common_pb2,
    store_pb2,
    store_pb2_grpc,
)

UP_TIMEOUT_S = 360.0
"""Longer than dev up's own start timeout, which then reports what it waited for."""
PORTS_PER_DC = (1, 2, 3, 4, 5, 6, *range(11, 19), *range(21, 29))
"""Offsets from base+100n that `dev up` uses: its services, then up to 8 workers and
their metrics (``dev_cluster.layout_of``)."""


def free_base_port(dcs: int = 3) -> int:
    """A base port whose ports for ``dcs`` DCs are all free right now, and all below
    the ephemeral range: a port there can be taken by any outgoing connection between
    this probe and the service's bind (a worker's metrics port once was, in a
    fresh-clone CI run, and the cluster could not start)."""
    assert 100 * dcs + max(PORTS_PER_DC) < DEV_UP_BASES.step, "clusters would overlap"
    # Where the ephemeral range starts too low to leave room, any base will have to do.
    low = DEV_UP_BASES.stop <= ephemeral_low()
    bases = share_of_this_test_worker(DEV_UP_BASES if low else range(10_000, 60_000, 1000))
    rng = random.Random()
    for _ in range(50):
        base = rng.choice(bases)
        try:
            for port in (base + 100 * n + k for n in range(1, dcs + 1) for k in PORTS_PER_DC):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range")


def txsync(*args: str) -> subprocess.CompletedProcess[str]:
    """The `txsync` command line, run to completion."""
    return subprocess.run(
        [sys.executable, "-m", "txsync.cli.main", *args],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def up(
    data: Path,
    base: int | None = None,
    env: Mapping[str, str] | None = None,
    options: Sequence[str] = (),
) -> subprocess.Popen[str]:
    """`txsync dev up` on ``data``, returned once it has written cluster.json. It dies
    with the test run whatever happens (and its services with it: parent_watch); a test
    stops it with ``down`` in a ``finally``."""
    process = subprocess.Popen(
        [sys.executable, "-m", "txsync.cli.main", "dev", "up", "--data", str(data),
         "--base-port", str(base or free_base_port()), *options],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**child_environment(), **(env or {})},
    )  # fmt: skip
    deadline = time.monotonic() + UP_TIMEOUT_S
    while not (data / "cluster.json").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"dev up did not come up:\n{process.communicate()[0]}")
        time.sleep(0.1)
    return process


def down(process: subprocess.Popen[str]) -> str:
    """SIGTERM, as Ctrl-C would: every service must stop cleanly."""
    process.send_signal(signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    assert process.returncode == 0, output
    return output


def statement(sql: str, *params: int) -> common_pb2.TxBody:
    values = [common_pb2.SqlValue(int_value=p) for p in params]
    return common_pb2.TxBody(statements=[common_pb2.Statement(sql=sql, params=values)])


def submit_and_wait(
    address: str, bodies: Sequence[common_pb2.TxBody], ids: list[str] | None = None
) -> list[str]:
    """Submit each body at the store ``address``, then wait until each is OK; the ids
    are appended to ``ids`` (for callers in threads) as they are acknowledged."""
    ids = [] if ids is None else ids
    with grpc.insecure_channel(address) as channel:
        stub = client_pb2_grpc.ClientServiceStub(channel)
        for body in bodies:
            ids.append(stub.Submit(client_pb2.SubmitRequest(body=body), timeout=10).tx_id)
        for tx_id in ids:
            waited = stub.Wait(
                client_pb2.WaitRequest(tx_id=tx_id, state=common_pb2.TX_STATE_OK), timeout=60
            )
            assert waited.reached and waited.state == common_pb2.TX_STATE_OK, waited
    return ids


def synced_ids(address: str) -> list[str]:
    """The whole synced order of the store at ``address``."""
    with grpc.insecure_channel(address) as channel:
        stub = store_pb2_grpc.StoreInternalServiceStub(channel)
        ids: list[str] = []
        while True:
            page = stub.ReadSynced(
                store_pb2.ReadSyncedRequest(from_len=len(ids), count_max=1024), timeout=10
            )
            if not page.entries:
                return ids
            ids += [meta.tx_id for meta in page.entries]


def list_workers(address: str) -> list[admin_pb2.WorkerStatus]:
    """The workers of the DC whose store (or dispatch) is at ``address``."""
    with grpc.insecure_channel(address) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        return list(stub.ListWorkers(admin_pb2.ListWorkersRequest(), timeout=10).workers)
