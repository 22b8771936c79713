"""worker-dispatch's feed gathers (``--feed-gather-ms``): what the store orders during the
pause after a feed message reaches the workers in the next one, so a DC that orders one
transaction at a time pays a feed message, an ``ApplyBatches`` round trip and a states
round trip per pause, not per transaction (docs/benchmarks.md, Tuning 26). Real
processes: a store, a coordinator, a dispatch and one SQLite worker serving its metrics."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from tests.support.cluster import LocalCluster
from tests.support.metrics import sample, scrape
from tests.support.processes import free_port, worker, worker_dispatch
from tests.support.waiting import wait_until
from txsync.v1 import client_pb2, client_pb2_grpc, common_pb2

pytestmark = pytest.mark.under_load  # a busy machine: see tests/conftest.py

GATHER_MS = 1_000
"""Long against a transaction's trip through one DC, so that several are ordered in
each pause even on a busy machine."""
TXS = 12
WAIT_S = 120.0


def _worker_batches(metrics_address: str) -> int:
    """``ApplyBatches`` messages the worker received so far (one per batch fed)."""
    text = scrape(metrics_address)
    if 'method="ApplyBatches"' not in text:
        return 0  # none yet: the counter appears with the first message
    labels = {"method": "ApplyBatches", "direction": "received"}
    return int(sample(text, "txsync_rpc_messages_total", **labels))


def test_transactions_ordered_during_the_pause_reach_the_worker_in_one_batch(
    tmp_path: Path,
) -> None:
    """Twelve transactions submitted one after another, each waiting for ACCEPTED (as a
    lone client does), reach the worker in at most one batch per pause begun while
    they were ordered: a feed message per transaction would be twelve batches."""
    cluster = LocalCluster(tmp_path, 1)
    metrics_port = free_port()
    the_worker = worker(
        tmp_path / "w1", "w1", "--metrics-listen", f"127.0.0.1:{metrics_port}", port=free_port()
    )
    metrics_address = f"127.0.0.1:{metrics_port}"
    dispatch = None
    try:
        the_worker.start()
        dispatch = worker_dispatch(
            tmp_path / "dispatch",
            cluster.dcs[0].store.address,
            {"w1": the_worker.address},
            "--feed-gather-ms",
            str(GATHER_MS),
        )
        dispatch.start()
        with grpc.insecure_channel(cluster.dcs[0].store.address) as channel:
            stub = client_pb2_grpc.ClientServiceStub(channel)

            def submit(sql: str, wait_for: common_pb2.TxState.ValueType) -> str:
                body = common_pb2.TxBody(statements=[common_pb2.Statement(sql=sql)])
                request = client_pb2.SubmitRequest(body=body, wait_for=wait_for)
                return stub.Submit(request, timeout=WAIT_S).tx_id

            submit("CREATE TABLE t (n INTEGER)", common_pb2.TX_STATE_OK)
            before = _worker_batches(metrics_address)
            started = time.monotonic()
            tx_ids = [
                submit(f"INSERT INTO t (n) VALUES ({n})", common_pb2.TX_STATE_ACCEPTED)
                for n in range(TXS)
            ]

            def every_one_ok() -> bool:
                answers = [stub.Get(client_pb2.GetRequest(tx_id=t), timeout=30) for t in tx_ids]
                return all(a.state == common_pb2.TX_STATE_OK for a in answers)

            wait_until("every transaction OK", every_one_ok, WAIT_S)
            elapsed_s = time.monotonic() - started
        batches = _worker_batches(metrics_address) - before
        # A feed message at most at the start and after each pause that began within
        # the run (the last one's pause may end after it): however slow the machine.
        most = 1 + int(elapsed_s / (GATHER_MS / 1000)) + 1
        assert 1 <= batches <= most, (batches, elapsed_s)
        assert dispatch.terminate() == 0, dispatch.log()
    finally:
        if dispatch is not None:
            dispatch.kill()
        the_worker.kill()
        cluster.stop()
