"""What the pipeline tests share: one real local SparkSession (Java 17 is on these
machines) and one `txsync dev up` run whose txlogs and worker databases the jobs read."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from pyspark.sql import SparkSession

from tests.dev_cluster.test_dev_up import _free_base_port
from txsync.pipeline.session import spark_session
from txsync.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    client_pb2,
    client_pb2_grpc,
    common_pb2,
    store_pb2,
    store_pb2_grpc,
)

DCS = ("dc1", "dc2", "dc3")
ROWS_PER_DC = 20
ROWS = len(DCS) * ROWS_PER_DC
"""Rows of table t in every worker's database."""
TXS = 1 + ROWS
"""Transactions: the CREATE and one INSERT per row."""


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session("local[2]", "txsync-tests")
    yield session
    session.stop()


@dataclass(frozen=True)
class DevRun:
    data: Path
    order: list[str]


@pytest.fixture(scope="session")
def dev_cluster(tmp_path_factory: pytest.TempPathFactory) -> DevRun:
    """A `txsync dev up` cluster (3 DCs x 2 SQLite workers) after a CREATE and ROWS_PER_DC
    inserts at each DC, applied by every worker, then stopped: its data directory (the
    jobs read its txlogs and workers' databases) and the order it agreed on."""
    data = tmp_path_factory.mktemp("dev-up") / "data"
    process = subprocess.Popen(
        [sys.executable, "-m", "txsync.cli.main", "dev", "up", "--data", str(data),
         "--base-port", str(_free_base_port())],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (data / "cluster.json").exists():
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, "dev up did not come up"
            time.sleep(0.1)
        dcs = json.loads((data / "cluster.json").read_text())["dcs"]
        _submit_and_wait(
            dcs["dc1"]["store"], ["CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT, c REAL)"]
        )
        clients = [
            threading.Thread(
                target=_submit_and_wait,
                args=(
                    dcs[dc]["store"],
                    [
                        f"INSERT INTO t VALUES ({n}, 'row {n}', {n / 4})"
                        for n in range(index * ROWS_PER_DC, (index + 1) * ROWS_PER_DC)
                    ],
                ),
            )
            for index, dc in enumerate(DCS)
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join(timeout=120)
        deadline = time.monotonic() + 60
        while not all(
            w.position == TXS for dc in DCS for w in _workers(dcs[dc]["store"])
        ):  # fmt: skip
            assert time.monotonic() < deadline, "workers did not apply everything"
            time.sleep(0.2)
        order = _synced(dcs["dc1"]["store"])
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    assert len(order) == TXS
    return DevRun(data, order)


def _submit_and_wait(store: str, sqls: list[str]) -> None:
    with grpc.insecure_channel(store) as channel:
        stub = client_pb2_grpc.ClientServiceStub(channel)
        ids = []
        for sql in sqls:
            body = common_pb2.TxBody(statements=[common_pb2.Statement(sql=sql)])
            ids.append(stub.Submit(client_pb2.SubmitRequest(body=body), timeout=10).tx_id)
        for tx_id in ids:
            waited = stub.Wait(
                client_pb2.WaitRequest(tx_id=tx_id, state=common_pb2.TX_STATE_OK), timeout=60
            )
            assert waited.reached, waited


def _workers(store: str) -> list[admin_pb2.WorkerStatus]:
    with grpc.insecure_channel(store) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        return list(stub.ListWorkers(admin_pb2.ListWorkersRequest(), timeout=5).workers)


def _synced(store: str) -> list[str]:
    with grpc.insecure_channel(store) as channel:
        stub = store_pb2_grpc.StoreInternalServiceStub(channel)
        page = stub.ReadSynced(store_pb2.ReadSyncedRequest(from_len=0, count_max=1024))
        return [meta.tx_id for meta in page.entries]
