"""`verify-replicas` on the databases real workers wrote, one of them altered behind the
cluster's back: every difference is named by table, key and kind, nothing else."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from pyspark.sql import SparkSession

from tests.support.cluster import LocalCluster
from tests.support.processes import free_port, worker, worker_dispatch
from txsync.pipeline import replicas as replicas_module
from txsync.pipeline.replicas import verify_replicas
from txsync.v1 import client_pb2, client_pb2_grpc, common_pb2

pytestmark = pytest.mark.spark
ROWS = 60


@pytest.fixture(scope="module")
def databases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two workers' databases after ROWS inserts through one DC, every process stopped."""
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
    return {name: root / name / "worker.sqlite" for name in workers}


def _applied(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT position FROM _txsync_applied").fetchone()[0])


def test_equal_replicas_verify_equal(spark: SparkSession, databases: dict[str, Path]) -> None:
    report = verify_replicas(spark, databases)
    assert report.equal and report.rows == {"w1": ROWS, "w2": ROWS}


def test_every_altered_row_is_named_by_key(
    spark: SparkSession, databases: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    altered = tmp_path / "w2-altered.sqlite"
    with sqlite3.connect(databases["w2"]) as source, sqlite3.connect(altered) as copy:
        source.backup(copy)  # the WAL's pages too, which a file copy would miss
    with sqlite3.connect(altered) as db:  # behind the cluster's back
        db.execute("UPDATE t SET b = 'tampered' WHERE a = 17")
        db.execute("DELETE FROM t WHERE a = 42")
        db.execute("INSERT INTO t VALUES (1000, 'stray', 0.5)")
    monkeypatch.setattr(replicas_module, "RANGE_ROWS", 7)  # many key ranges, as at scale
    report = verify_replicas(spark, {"w1": databases["w1"], "w2": altered})
    found = {(r["replica"], r["table"], r["key"], r["kind"]) for r in report.differences.collect()}
    assert found == {
        ("w2", "t", "[17]", "differs"),
        ("w2", "t", "[42]", "missing"),
        ("w2", "t", "[1000]", "extra"),
    }
    assert report.counts == {
        ("w2", "t", "differs"): 1, ("w2", "t", "missing"): 1, ("w2", "t", "extra"): 1
    }  # fmt: skip

    result = subprocess.run(
        [sys.executable, "-m", "txsync.cli.main", "pipeline", "verify-replicas",
         "--master", "local[2]", f"--replica=w1={databases['w1']}", f"--replica=w2={altered}",
         "-o", "json"],
        capture_output=True, text=True, check=False, timeout=180,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    answer = json.loads(result.stdout)
    assert not answer["equal"] and {d["key"] for d in answer["differences"]} == {
        "[17]", "[42]", "[1000]"
    }  # fmt: skip
