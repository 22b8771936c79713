"""What every service process exports, read from a real transaction-store's ``/metrics``:
its gRPC calls by method and status (rate, errors, latency), its txlog's fsyncs, its
build, and the ``dc`` label on every series (issue 51)."""

from __future__ import annotations

from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from tests.support.metrics import sample, scrape, series_without_dc
from tests.support.processes import ServiceProcess, free_port, transaction_store
from tests.support.waiting import wait_until
from txsync.settings import UNFINISHED_TXS_MAX_DEFAULT, UNPASSED_MAX_DEFAULT
from txsync.telemetry.metrics import build_commit
from txsync.v1 import client_pb2, client_pb2_grpc, common_pb2, store_pb2, store_pb2_grpc

WAIT_S = 0.3
"""How long the measured Wait waits: no coordinator runs, so it waits all of it."""


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[ServiceProcess, str]]:
    metrics = f"127.0.0.1:{free_port()}"
    process = transaction_store(tmp_path / "store", "dc1", "--metrics-listen", metrics)
    process.start()
    yield process, metrics
    process.terminate()


def test_calls_fsyncs_and_build_are_measured_with_the_dc_on_every_series(
    store: tuple[ServiceProcess, str], tmp_path: Path
) -> None:
    process, metrics = store
    with grpc.insecure_channel(process.address) as channel:
        client = client_pb2_grpc.ClientServiceStub(channel)
        body = common_pb2.TxBody(statements=[common_pb2.Statement(sql="CREATE TABLE t (a)")])
        tx_ids = [client.Submit(client_pb2.SubmitRequest(body=body)).tx_id for _ in range(3)]
        waited = client.Wait(
            client_pb2.WaitRequest(
                tx_id=tx_ids[0], state=common_pb2.TX_STATE_OK, timeout=Duration(nanos=300_000_000)
            )
        )
        assert waited.state == common_pb2.TX_STATE_INCOMING  # the wait ran out
        with pytest.raises(grpc.RpcError) as refused:
            client.Wait(client_pb2.WaitRequest(tx_id="not an id", state=common_pb2.TX_STATE_OK))
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        # A stream the caller leaves: the server's handler is cancelled.
        follow = store_pb2_grpc.StoreInternalServiceStub(channel).FollowEnqueued(
            store_pb2.FollowEnqueuedRequest(from_position=1)
        )
        follow.initial_metadata()  # the server has the call: it sees it cancelled
        follow.cancel()

    def handled(method: str, code: str) -> float:
        try:
            return sample(scrape(metrics), "grpc_server_handled_total",
                          grpc_method=method, grpc_code=code)  # fmt: skip
        except AssertionError:  # no such series yet
            return 0

    wait_until("the left stream counted as cancelled",
               lambda: handled("FollowEnqueued", "CANCELLED") == 1, timeout_s=60)  # fmt: skip
    text = scrape(metrics)
    calls = {"grpc_service": "txsync.v1.ClientService", "grpc_type": "unary"}
    assert sample(text, "grpc_server_handled_total", grpc_method="Submit", grpc_code="OK",
                  **calls) == 3  # fmt: skip
    assert sample(text, "grpc_server_handled_total", grpc_method="Wait",
                  grpc_code="INVALID_ARGUMENT") == 1  # fmt: skip
    # The latency histogram against a known timing: the Wait of 0.3 s cannot end sooner,
    # so it is above the 0.25 s bucket; a loaded machine may only make it later.
    bucket = "grpc_server_handling_seconds_bucket"
    wait_ok = {"grpc_method": "Wait", "grpc_code": "OK"}
    assert sample(text, bucket, le="0.25", **wait_ok) == 0
    assert sample(text, bucket, le="+Inf", **wait_ok) == 1
    assert sample(text, "grpc_server_handling_seconds_sum", **wait_ok) >= WAIT_S
    streamed = {"grpc_method": "FollowEnqueued", "grpc_type": "server_stream"}
    assert sample(text, "grpc_server_handled_total", grpc_code="CANCELLED", **streamed) == 1

    # Each submit was made durable: fsyncs of the log, their bytes all in its file.
    fsyncs = sample(text, "txsync_txlog_fsync_duration_seconds_count")
    assert fsyncs >= 1
    assert sample(text, "txsync_txlog_fsync_size_bytes_count") == fsyncs
    appended = sample(text, "txsync_txlog_fsync_size_bytes_sum")
    log_files = list((tmp_path / "store").rglob("log-*.dat"))
    assert 0 < appended <= sum(f.stat().st_size for f in log_files)

    # The backlog against its limit: the 3 submits wait to be ordered (no coordinator).
    assert sample(text, "txsync_store_unfinished") == 3
    assert sample(text, "txsync_store_unfinished_limit") == UNFINISHED_TXS_MAX_DEFAULT
    assert sample(text, "txsync_store_unpassed") == 0  # no coordinator or dispatch reported
    assert sample(text, "txsync_store_unpassed_limit") == UNPASSED_MAX_DEFAULT

    assert sample(text, "txsync_build_info", version=metadata.version("txsync"),
                  commit=build_commit(), service="transaction-store") == 1  # fmt: skip
    assert build_commit() != "unknown", "the tests run from a git checkout"

    assert not series_without_dc(text, "dc1")
