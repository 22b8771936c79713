"""The in-process and one-store benchmarks keep working, and keep reading what the
services log (a rotation's line): each run small, figures printed, none asserted."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from bench import apply_cost, record_cost, rotation_memory, rotation_stall
from tests.support.processes import transaction_store
from txsync.v1 import client_pb2, client_pb2_grpc, common_pb2


def test_apply_cost_prints_both_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert apply_cost.main(["--txs", "100", "--batch", "50", "--rounds", "1"]) == 0
    printed = capsys.readouterr().out
    assert "touched digest off   median" in printed and "touched digest on    median" in printed


def test_rotation_stall_reads_the_rotations_a_store_logs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    arguments = ["--seconds", "6", "--rate", "200", "--log-file-bytes-max", "65536"]
    assert rotation_stall.main(arguments) == 0
    printed = capsys.readouterr().out
    assert "rotated in" in printed and "lock held median" in printed, printed
    assert "submits overlapping a rotation" in printed, printed


def test_record_cost_measures_a_stores_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = transaction_store(tmp_path / "store", "dc1")
    store.start()
    try:
        body = common_pb2.TxBody(statements=[common_pb2.Statement(sql="SELECT 1")])
        with grpc.insecure_channel(store.address) as channel:
            client_pb2_grpc.ClientServiceStub(channel).SubmitBatch(
                client_pb2.SubmitBatchRequest(
                    submits=[client_pb2.SubmitRequest(body=body) for _ in range(50)]
                ),
                timeout=60,
            )
    finally:
        assert store.terminate() == 0, store.log()
    assert record_cost.main([str(tmp_path / "store")]) == 0
    printed = capsys.readouterr().out
    assert "50 records (0 finished)" in printed and "bytes a record" in printed, printed
    assert "snapshot forms" in printed and "Get answers" in printed, printed


def test_rotation_memory_reads_the_store_around_each_rotation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert rotation_memory.main(["--kept", "700", "--rotations", "2"]) == 0
    printed = capsys.readouterr().out
    assert "700 transactions held: RSS" in printed, printed
    assert "after rotation 2: RSS" in printed and "the rotations left" in printed, printed
    assert "MiB while it ran" in printed, printed
