"""`export` and `audit-order` over the real txlogs of a `txsync dev up` run, then over a
copy of one DC's log forged to hold another transaction at one position."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 - Spark's usual name
from pyspark.testing import assertDataFrameEqual

from tests.pipeline.conftest import DCS, TXS, DevRun, run_pipeline
from txsync.pipeline.audit import audit_order
from txsync.pipeline.command import parse_arguments
from txsync.pipeline.export import PARTITIONS, LogSource, export, read_txlogs
from txsync.pipeline.txlog_rows import txlog_files
from txsync.pipeline.uris import joined
from txsync.transaction_store.txlog.framing import encode_frame, scan
from txsync.v1 import txlog_pb2

pytestmark = pytest.mark.spark


def test_export_writes_every_dataset_and_the_order_each_dc_holds(
    spark: SparkSession, dev_cluster: DevRun, tmp_path: Path
) -> None:
    root, order = dev_cluster.data, dev_cluster.order
    sources = [LogSource(dc, directory=str(root / dc)) for dc in DCS]
    counts = export(spark, sources, tmp_path / "lake")
    assert counts["synced"] == 3 * TXS
    assert counts["rounds"] == 0  # only a running coordinator knows them
    assert counts["transactions"] == 3 * TXS
    synced = spark.read.parquet(str(tmp_path / "lake" / "synced"))
    expected = spark.createDataFrame(
        [(dc, position, tx_id) for dc in DCS for position, tx_id in enumerate(order, 1)],
        "dc string, position long, tx_id string",
    )
    assertDataFrameEqual(synced.select("dc", "position", "tx_id"), expected)
    transitions = spark.read.parquet(str(tmp_path / "lake" / "transitions"))
    accepted = transitions.filter("state = 'ACCEPTED'").groupBy("dc").count().collect()
    assert {row["dc"]: row["count"] for row in accepted} == dict.fromkeys(DCS, TXS)
    audit = audit_order(synced)
    assert audit.agrees and audit.lengths == dict.fromkeys(DCS, TXS)


def test_an_export_through_the_admin_api_holds_the_files_order_and_the_rounds(
    spark: SparkSession, dev_cluster: DevRun
) -> None:
    lake = dev_cluster.admin_export
    from_api = spark.read.parquet(str(lake / "synced")).select("dc", "position", "tx_id")
    from_files = read_txlogs(spark, {dc: dev_cluster.data / dc for dc in DCS})["synced"]
    assertDataFrameEqual(from_api, from_files.select("dc", "position", "tx_id"))
    transitions = spark.read.parquet(str(lake / "transitions"))
    accepted = transitions.filter("state = 'ACCEPTED'").groupBy("dc").count().collect()
    assert {row["dc"]: row["count"] for row in accepted} == dict.fromkeys(DCS, TXS)

    rounds = spark.read.parquet(str(lake / "rounds"))
    per_dc = rounds.groupBy("dc").agg(
        F.count("*").alias("n"),
        F.countDistinct("round_no").alias("distinct"),
        F.sum("added").alias("added"),
        F.min("duration_ms").alias("shortest"),
    )
    for row in per_dc.collect():
        assert row["n"] == row["distinct"] > 0, row  # each round once
        assert row["shortest"] >= 0
        # A meta is added once, by one round; a DC that fell behind (or started late)
        # takes some, possibly all, as synced entries from a peer instead.
        assert row["added"] <= TXS, row
    assert sum(row["added"] for row in per_dc.collect()) > 0
    assert {row["dc"] for row in per_dc.collect()} == set(DCS)
    outcomes = {row["outcome"] for row in rounds.select("outcome").distinct().collect()}
    assert "advanced" in outcomes
    assert outcomes <= {"advanced", "complete", "deadline", "abandoned"}


def _forge(source: Path, target: Path, position: int, fake_tx_id: str) -> str:
    """A copy of ``source``'s data with another tx id at synced ``position``; returns the
    id that was there."""
    shutil.copytree(source, target)
    replaced = ""
    for path in txlog_files(target):
        data = path.read_bytes()
        frames = []
        for _, payload in scan(data).frames:
            batch = txlog_pb2.LogBatch()
            batch.ParseFromString(payload)
            for entry in batch.entries:
                if entry.WhichOneof("entry") == "synced":
                    start = entry.synced.start.synced_len
                    index = position - start - 1
                    if 0 <= index < len(entry.synced.metas):
                        replaced = entry.synced.metas[index].tx_id
                        entry.synced.metas[index].tx_id = fake_tx_id
            frames.append(encode_frame(batch.SerializeToString()))
        path.write_bytes(b"".join(frames))
    assert replaced, f"position {position} not found"
    return replaced


def test_audit_names_the_first_disagreement_exactly(
    spark: SparkSession, dev_cluster: DevRun, tmp_path: Path
) -> None:
    root = dev_cluster.data
    fake = "00000000-0000-4000-8000-00000000f0e0"
    real = _forge(root / "dc2", tmp_path / "dc2-forged", 17, fake)
    dcs = {"dc1": root / "dc1", "dc2": tmp_path / "dc2-forged", "dc3": root / "dc3"}
    audit = audit_order(read_txlogs(spark, dcs)["synced"])
    assert not audit.agrees and audit.first_disagreement is not None
    assert audit.first_disagreement.position == 17
    assert audit.first_disagreement.tx_ids == {"dc1": real, "dc2": fake, "dc3": real}

    flags = [f"--dc={dc}={path}" for dc, path in dcs.items()]
    result = run_pipeline("audit-order", *flags)
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"DISAGREE at position 17: dc1 has {real}, dc2 has {fake}, dc3 has {real}" in (
        result.stdout
    )


def test_jobs_take_uris_as_spark_does(
    spark: SparkSession, dev_cluster: DevRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 54: outputs and inputs went through ``pathlib``, which turns
    ``s3a://bucket/key`` into ``s3a:/bucket/key``. A path-shaped URI on the local file
    system, through Hadoop's ``file://`` scheme, goes the way an object store's would.
    ``export`` runs as an operator runs it; the readers take the same arguments through
    the same parser here, in the tests' Spark session (a driver JVM each cost about 50 s
    of CI's suite)."""
    lake = (tmp_path / "lake").as_uri()
    assert lake.startswith("file:///")
    dcs = [f"--dc={dc}={dev_cluster.data / dc}" for dc in DCS]

    exported = run_pipeline("export", *dcs, "--out", lake)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert (tmp_path / "lake" / "synced" / "_SUCCESS").is_file(), "written where the URI says"

    def job(*arguments: str) -> int:
        options = parse_arguments([*arguments, "--master", str(spark.sparkContext.master)])
        return int(options.handler(options))

    capsys.readouterr()
    assert job("audit-order", "--parquet", lake, "-o", "json") == 0
    assert json.loads(capsys.readouterr().out)["lengths"] == dict.fromkeys(DCS, TXS)
    assert job("report", "--parquet", lake, "--out", str(tmp_path / "report")) == 0
    assert (tmp_path / "report" / "index.html").is_file()


def test_an_s3a_uri_reaches_spark_whole(spark: SparkSession, dev_cluster: DevRun) -> None:
    """Issue 54: an object store's URI survives into Spark unchanged (``pathlib`` made
    ``s3a://bucket/key`` into ``s3a:/bucket/key``, bucket lost). No S3 runs here, and
    this Spark has no S3 file system: each location ``export`` hands to Spark keeps its
    scheme, bucket and key as Hadoop's own ``Path`` parses them, and Spark, given them,
    looks for the S3A file system (and stops there)."""
    lake = "s3a://txsync-bucket/lake"
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    for name in PARTITIONS:
        uri = jvm.org.apache.hadoop.fs.Path(joined(lake, name)).toUri()
        parts = (uri.getScheme(), uri.getAuthority(), uri.getPath())
        assert parts == ("s3a", "txsync-bucket", f"/lake/{name}")
    with pytest.raises(Exception, match="S3AFileSystem"):
        export(spark, [LogSource(dc=DCS[0], directory=str(dev_cluster.data / DCS[0]))], lake)
