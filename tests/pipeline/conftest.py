"""One real local SparkSession for the pipeline tests (Java 17 is on these machines)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from pyspark.sql import SparkSession

from tests.support.cluster import LocalCluster
from tests.support.processes import free_port, worker, worker_dispatch
from txsync.pipeline.session import spark_session
from txsync.v1 import client_pb2, client_pb2_grpc, common_pb2

ROWS = 60


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session("local[2]", "txsync-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def dc_with_workers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One DC of real processes (store, coordinator, dispatch, workers w1 and w2) after a
    CREATE and ROWS inserts, every process stopped: its data directory."""
    root = tmp_path_factory.mktemp("dc")
    cluster = LocalCluster(root, 1)
    workers = {name: worker(root / name, name, port=free_port()) for name in ("w1", "w2")}
    try:
        for process in workers.values():
            process.start()
        addresses = {name: process.address for name, process in workers.items()}
        dispatch = worker_dispatch(root / "dispatch", cluster.dcs[0].store.address, addresses)
        dispatch.start()
        with grpc.insecure_channel(cluster.dcs[0].store.address) as channel:
            stub = client_pb2_grpc.ClientServiceStub(channel)
            sqls = ["CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT, c REAL)"] + [
                f"INSERT INTO t VALUES ({n}, 'row {n}', {n / 4})" for n in range(ROWS)
            ]
            ids = []
            for sql in sqls:
                body = common_pb2.TxBody(statements=[common_pb2.Statement(sql=sql)])
                ids.append(stub.Submit(client_pb2.SubmitRequest(body=body)).tx_id)
            for tx_id in ids:
                waited = stub.Wait(
                    client_pb2.WaitRequest(tx_id=tx_id, state=common_pb2.TX_STATE_OK), timeout=60
                )
                assert waited.reached
        cluster.wait_for(
            "both workers applied everything",
            lambda: all(_applied(root / name / "worker.sqlite") == ROWS + 1 for name in workers),
        )
        dispatch.terminate()
    finally:
        for process in workers.values():
            if process.process is not None and process.process.poll() is None:
                process.terminate()
        cluster.stop()
    return root


def _applied(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT position FROM _txsync_applied").fetchone()[0])
