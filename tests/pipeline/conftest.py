"""What the pipeline tests share: one real local SparkSession (Java 17 is on these
machines) and one `txsync dev up` run whose txlogs and worker databases the jobs read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.support.dev_up import down, list_workers, statement, submit_and_wait, synced_ids, up
from tests.support.postgres import PostgresServer
from txsync.pipeline.export import LogSource, export
from txsync.pipeline.session import spark_session
from txsync.v1 import common_pb2
from txsync.worker.postgres_backend import PostgresBackend
from txsync.worker.transactions import transaction_from_proto

DCS = ("dc1", "dc2", "dc3")
ROWS_PER_DC = 20
ROWS = len(DCS) * ROWS_PER_DC
"""Rows of table t in every worker's database."""
TXS = 1 + ROWS
"""Transactions: the CREATE and one INSERT per row."""
JOB_TIMEOUT_S = 600
"""A job in a process of its own: generous for a loaded machine."""


def run_pipeline(
    *arguments: str, master: str = "local[2]", env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``txsync pipeline ARGUMENTS --master MASTER`` in a process of its own, as an
    operator runs it (``env``: added to this process's environment)."""
    return subprocess.run(
        [sys.executable, "-m", "txsync.cli.main", "pipeline", *arguments, "--master", master],
        capture_output=True, text=True, check=False, timeout=JOB_TIMEOUT_S,
        env=None if env is None else {**os.environ, **env},
    )  # fmt: skip


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session("local[2]", "txsync-tests")
    yield session
    session.stop()


@dataclass(frozen=True)
class DevRun:
    data: Path
    order: list[str]
    bodies: dict[str, common_pb2.TxBody]
    """Each ordered transaction's body, by id."""
    admin_export: Path
    """`export` of the running cluster through its stores' admin API (rounds too)."""


@pytest.fixture(scope="session")
def dev_cluster(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> DevRun:
    """A `txsync dev up` cluster (3 DCs x 2 SQLite workers) after a CREATE and ROWS_PER_DC
    inserts at each DC, applied by every worker, exported through the admin API, then
    stopped: its data directory (the jobs read its txlogs and workers' databases), the
    order it agreed on, and the export."""
    data = tmp_path_factory.mktemp("dev-up") / "data"
    admin_export = data.parent / "admin-export"
    process = up(data)
    bodies: dict[str, common_pb2.TxBody] = {}
    try:
        dcs = json.loads((data / "cluster.json").read_text())["dcs"]
        create = statement("CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT, c REAL)")
        bodies.update(zip(submit_and_wait(dcs["dc1"]["store"], [create]), [create], strict=True))
        inserts = {
            dc: [
                statement(f"INSERT INTO t VALUES ({n}, 'row {n}', {n / 4})")
                for n in range(index * ROWS_PER_DC, (index + 1) * ROWS_PER_DC)
            ]
            for index, dc in enumerate(DCS)
        }
        ids: dict[str, list[str]] = {dc: [] for dc in DCS}
        clients = [
            threading.Thread(target=submit_and_wait, args=(dcs[dc]["store"], inserts[dc], ids[dc]))
            for dc in DCS
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join(timeout=120)
        deadline = time.monotonic() + 60
        while not all(
            w.position == TXS for dc in DCS for w in list_workers(dcs[dc]["store"])
        ):  # fmt: skip
            assert time.monotonic() < deadline, "workers did not apply everything"
            time.sleep(0.2)
        order = synced_ids(dcs["dc1"]["store"])
        export(spark, [LogSource(store=dcs[dc]["store"]) for dc in DCS], admin_export)
    finally:
        down(process)
    for dc in DCS:
        bodies.update(zip(ids[dc], inserts[dc], strict=True))
    assert len(order) == TXS and set(order) == set(bodies)
    return DevRun(data, order, bodies, admin_export)


@pytest.fixture(scope="session")
def postgres_replica(dev_cluster: DevRun, postgres: PostgresServer) -> str:
    """A PostgreSQL worker database holding the cluster's order: the worker's own
    PostgreSQL backend applied every transaction at its synced position."""
    conninfo = postgres.new_database()
    backend = PostgresBackend(conninfo)
    try:
        for position, tx_id in enumerate(dev_cluster.order, start=1):
            assert backend.apply(
                position, tx_id, transaction_from_proto(dev_cluster.bodies[tx_id])
            ).ok
    finally:
        backend.close()
    return PostgresServer.uri(conninfo)
