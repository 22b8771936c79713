"""`load`: 100,000 rows of a CSV file through the client API of a 2-DC cluster of real
processes, then the same load again (resumed: nothing submitted twice); its default key
prefix; `load` and `export --endpoints` over TLS with a token."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.pipeline.conftest import run_pipeline
from tests.support.cluster import LocalCluster
from tests.support.processes import transaction_store
from txsync.pipeline.load import LoadPlan, default_key_prefix, load

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]
ROWS = 100_000
ROWS_PER_TRANSACTION = 100


def test_a_hundred_thousand_rows_load_once_and_resume(spark: SparkSession, tmp_path: Path) -> None:
    csv = tmp_path / "accounts.csv"
    csv.write_text("id,owner,balance\n" + "".join(f"{n},owner {n},{n * 3}\n" for n in range(ROWS)))
    cluster = LocalCluster(tmp_path / "cluster", 2)
    try:
        plan = LoadPlan(
            sql="INSERT INTO accounts (id, owner, balance) VALUES (?, ?, ?)",
            columns=("id", "owner", "balance"),
            endpoints=tuple(dc.store.address for dc in cluster.dcs),
            key_prefix="test-load",
            rows_per_transaction=ROWS_PER_TRANSACTION,
        )
        frame = spark.read.option("header", True).option("inferSchema", True).csv(str(csv))
        first = load(spark, frame, plan, slice_rows=10_000)
        transactions = ROWS // ROWS_PER_TRANSACTION
        assert (first.rows, first.created, first.existing, first.refused) == (
            ROWS, transactions, 0, 0
        )  # fmt: skip
        cluster.wait_for(
            "every transaction ordered at both DCs",
            lambda: all(len(cluster.synced(dc)) == transactions for dc in cluster.dcs),
            timeout_s=120,
        )
        again = run_pipeline(
            "load", "--input", csv.as_uri(), "--columns", "id,owner,balance",  # a URI
            "--sql", plan.sql, "--rows-per-transaction", str(ROWS_PER_TRANSACTION),
            "--key-prefix", "test-load",
            "--endpoints", ",".join(reversed(plan.endpoints)),  # any order
        )  # fmt: skip
        assert again.returncode == 0, again.stderr[-3000:]
        assert f"0 transactions created, {transactions:,} already there" in again.stdout
        assert all(len(cluster.synced(dc)) == transactions for dc in cluster.dcs)
    finally:
        cluster.stop()


def test_the_default_key_prefix_is_short_and_follows_the_inputs(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Issue 54: keys once joined every input path, so three long paths passed the
    128-byte key limit and every row was refused, and a daily file rewritten at the
    same path reused its keys and loaded nothing. Now: a digest of the files' names,
    sizes and times; a path or its ``file://`` URI, the same; a rewrite, another."""
    folder = tmp_path / ("a-rather-long-folder-name-for-an-export-" * 3)
    folder.mkdir()
    files = [folder / f"part-{n}-of-a-daily-export-with-a-long-name.csv" for n in range(3)]
    for n, path in enumerate(files):
        path.write_text(f"id\n{n}\n")

    def prefix(*inputs: str) -> str:
        return default_key_prefix(spark, spark.read.option("header", True).csv(list(inputs)))

    first = prefix(*map(str, files))
    assert first.startswith("load-") and len(first) == len("load-") + 16
    assert prefix(*(path.as_uri() for path in files)) == first
    assert prefix(*map(str, reversed(files))) == first, "the order given does not matter"
    files[1].write_text("id\n10\n11\n")  # rewritten at the same path
    assert prefix(*map(str, files)) != first


ADMIN_TOKEN = "pipeline-secret"


def test_load_and_export_reach_stores_over_tls_with_a_token(tmp_path: Path) -> None:
    """Issue 54: ``load`` and ``export --endpoints`` opened plaintext channels without a
    token, so they could not reach the chart's default cluster (TLS, access control).
    Now they connect as the client library does: ``--tls-*`` read on the driver and
    sent to the executors as PEM, a ``{dc}`` name per DC, ``$TXSYNC_TOKEN``. Two stores
    that take only TLS and a known token; a load without the token is refused."""
    certs = tmp_path / "certs"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "dev_ca.py"), "--out", str(certs), "dc1", "dc2"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    access = tmp_path / "access.toml"
    digest = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()
    access.write_text(f'[[token]]\nname = "etl"\nrole = "admin"\nsha256 = "{digest}"\n')
    stores = {}
    for dc in ("dc1", "dc2"):
        stores[dc] = transaction_store(
            tmp_path / dc, dc, "--tls-cert", str(certs / f"{dc}.pem"),
            "--tls-key", str(certs / f"{dc}.key"), "--access-file", str(access),
        )  # fmt: skip
    csv = tmp_path / "rows.csv"
    csv.write_text("id,name\n" + "".join(f"{n},name {n}\n" for n in range(50)))
    try:
        for store in stores.values():
            store.start()
        endpoints = ",".join(f"{dc}={store.address}" for dc, store in stores.items())
        tls = ["--tls-ca", str(certs / "ca.pem"), "--tls-server-name", "{dc}"]

        def pipeline(*job: str, token: str) -> subprocess.CompletedProcess[str]:
            return run_pipeline(*job, "--endpoints", endpoints, *tls,
                                env={"TXSYNC_TOKEN": token})  # fmt: skip

        load_job = ("load", "--input", str(csv), "--columns", "id,name",
                    "--sql", "INSERT INTO t (id, name) VALUES (?, ?)")  # fmt: skip
        refused = pipeline(*load_job, token="")
        assert refused.returncode == 1 and "50 refused" in refused.stdout, refused.stdout
        assert "UNAUTHENTICATED" in refused.stdout or "token" in refused.stdout.lower()
        loaded = pipeline(*load_job, token=ADMIN_TOKEN)
        assert loaded.returncode == 0, loaded.stdout + loaded.stderr[-3000:]
        assert "50 transactions created" in loaded.stdout, loaded.stdout
        exported = pipeline("export", "--out", str(tmp_path / "lake"), token=ADMIN_TOKEN)
        assert exported.returncode == 0, exported.stdout + exported.stderr[-3000:]
        assert "of 2 DCs" in exported.stdout and "(no rounds" in exported.stdout
        assert " 50 transitions" in exported.stdout, "each INCOMING, at the DC that took it"
    finally:
        for store in stores.values():
            store.terminate()
