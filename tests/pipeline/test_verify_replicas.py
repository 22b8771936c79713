"""`verify-replicas` on the databases real workers wrote, one of them altered behind the
cluster's back: every difference is named by table, key and kind, nothing else."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from tests.pipeline.conftest import ROWS, DevRun, run_pipeline
from tests.support.postgres import PostgresServer
from txsync.pipeline import replicas as replicas_module
from txsync.pipeline.replicas import verify_replicas
from txsync.worker.postgres_backend import PostgresBackend
from txsync.worker.transactions import transaction_from_proto

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def databases(dev_cluster: DevRun) -> dict[str, Path]:
    """dc1's two workers' databases."""
    return {
        name: dev_cluster.data / "dc1" / f"dc1-{name}" / "worker.sqlite" for name in ("w1", "w2")
    }


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

    result = run_pipeline(
        "verify-replicas", f"--replica=w1={databases['w1']}", f"--replica=w2={altered}",
        "-o", "json",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    answer = json.loads(result.stdout)
    assert not answer["equal"] and {d["key"] for d in answer["differences"]} == {
        "[17]", "[42]", "[1000]"
    }  # fmt: skip


def test_sqlite_and_postgresql_replicas_of_one_cluster_compare_equal(
    spark: SparkSession, databases: dict[str, Path], postgres_replica: str
) -> None:
    report = verify_replicas(spark, {**databases, "pg": postgres_replica})
    assert report.equal, report.differences.collect()
    assert report.rows == {"w1": ROWS, "w2": ROWS, "pg": ROWS}


def test_a_postgresql_row_altered_is_named_by_key(
    spark: SparkSession,
    databases: dict[str, Path],
    postgres: PostgresServer,
    dev_cluster: DevRun,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conninfo = postgres.new_database()
    backend = PostgresBackend(conninfo)
    for position, tx_id in enumerate(dev_cluster.order, start=1):
        backend.apply(position, tx_id, transaction_from_proto(dev_cluster.bodies[tx_id]))
    backend.close()
    with psycopg.connect(conninfo, autocommit=True) as conn:  # behind the cluster's back
        conn.execute("UPDATE t SET c = 99.5 WHERE a = 5")
        conn.execute("DELETE FROM t WHERE a = 33")
        # A table only this replica has, without a primary key: compared as a multiset.
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('x'), ('x')")
    monkeypatch.setattr(replicas_module, "RANGE_ROWS", 9)  # several key ranges
    report = verify_replicas(
        spark, {"a-sqlite": databases["w1"], "b-pg": PostgresServer.uri(conninfo)}
    )
    found = {(r["replica"], r["table"], r["key"], r["kind"]) for r in report.differences.collect()}
    assert found == {
        ("b-pg", "t", "[5]", "differs"),
        ("b-pg", "t", "[33]", "missing"),
        ("b-pg", "notes", '["x"]', "extra"),
    }
