"""`txsync dev up` and `txsync submit`, through their command lines."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import grpc
import pytest

from tests.support.dev_up import down, free_base_port, txsync, up
from txsync.v1 import client_pb2, client_pb2_grpc

pytestmark = pytest.mark.under_load  # a busy machine: see tests/conftest.py


def test_dev_up_runs_a_cluster_that_takes_submits_and_resumes(tmp_path: Path) -> None:
    data = tmp_path / "cluster"
    base = free_base_port()
    process = up(data, base)
    try:
        layout = json.loads((data / "cluster.json").read_text())
        assert sorted(layout["dcs"]) == ["dc1", "dc2", "dc3"]
        cluster = str(data / "cluster.json")
        create = "CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT)"
        table = txsync("submit", "--endpoints", cluster, "--dc", "dc1", "--sql", create,
                        "--wait", "ok")  # fmt: skip
        assert table.returncode == 0, table.stderr
        answer = txsync("submit", "--endpoints", cluster, "--dc", "dc2",
                         "--sql", "INSERT INTO t (a, b) VALUES (?, ?)", "--param", "1",
                         "--param", "s:x", "--wait", "ok", "-o", "json")  # fmt: skip
        assert answer.returncode == 0, answer.stderr
        submitted = json.loads(answer.stdout)
        assert submitted["reached"] and submitted["state"] == "TX_STATE_OK"  # applied by workers
        duplicate = "INSERT INTO t (a, b) VALUES (1, 'y')"
        again = txsync("submit", "--endpoints", cluster, "--dc", "dc3", "--sql", duplicate,
                        "--wait", "ok")  # fmt: skip
        assert again.returncode == 4 and "UNIQUE constraint failed" in again.stdout
        # Issue 17: a statement that never ends stopped every DC. Now it fails at the
        # testing worker on its step budget, and the order goes on.
        endless = ("INSERT INTO t (a) WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
                   "SELECT x+1 FROM c) SELECT x FROM c WHERE x < 0")  # fmt: skip
        runaway = txsync("submit", "--endpoints", cluster, "--dc", "dc2", "--sql", endless,
                         "--wait", "ok")  # fmt: skip
        assert runaway.returncode == 4 and "work budget" in runaway.stdout, runaway.stdout
        after = txsync("submit", "--endpoints", cluster, "--dc", "dc1", "--sql",
                       "INSERT INTO t (a, b) VALUES (2, 'z')", "--wait", "ok")  # fmt: skip
        assert after.returncode == 0, after.stdout + after.stderr
        status = txsync("status", "--endpoints", cluster)
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.count("MAJORITY") == 3 and status.stdout.count(" yes") == 3
        assert status.stdout.count("1h or 262,144") == 3, "each DC's idempotency window"
        workers = txsync("workers", "--endpoints", cluster, "-o", "json")
        assert workers.returncode == 0, workers.stderr
        listed = json.loads(workers.stdout)
        assert sorted(listed) == ["dc1", "dc2", "dc3"]
        assert all(len(w) == 2 and sum(x["testing"] for x in w) == 1 for w in listed.values())
        shown = txsync("tx", "get", submitted["tx_id"], "--endpoints", cluster, "--dc", "dc3")
        assert shown.returncode == 0, shown.stderr
        assert "OK  position 2" in shown.stdout and "INSERT INTO t" in shown.stdout
        assert all(f"at {dc}: OK" in shown.stdout for dc in ("dc1", "dc2", "dc3")), shown.stdout
        assert "outcome: OK, rows affected [1]" in shown.stdout
        failed = txsync("tx", "list", "--endpoints", cluster, "--dc", "dc3", "--state", "failed")
        assert failed.returncode == 0 and "(2 transactions)" in failed.stdout, failed.stdout
        unknown = txsync(
            "tx", "get", "00000000-0000-4000-8000-000000000000", "--endpoints", cluster
        )
        assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr
    finally:
        output = down(process)
    assert "3 DCs up" in output and "stopped." in output
    for dc in layout["dcs"].values():  # every service is gone: nothing listens any more
        for address in (dc["store"], dc["coordinator"]):
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is fine
                probe.bind(("127.0.0.1", int(address.rsplit(":", 1)[1])))

    process = up(data, base)
    try:
        with grpc.insecure_channel(layout["dcs"]["dc3"]["store"]) as channel:
            got = client_pb2_grpc.ClientServiceStub(channel).Get(
                client_pb2.GetRequest(tx_id=submitted["tx_id"])
            )
            assert got.position == 2  # the same cluster, resumed with its order
    finally:
        output = down(process)
    assert "resuming the cluster" in output


def test_submit_and_dev_up_refuse_bad_input_clearly(tmp_path: Path) -> None:
    missing = txsync("status", "--endpoints", str(tmp_path / "nowhere.json"))
    assert missing.returncode == 2 and "is the cluster up?" in missing.stderr
    result = txsync("submit", "--sql", "SELECT 1", "--endpoints", "127.0.0.1:1", "--dc", "dc1")
    assert result.returncode == 2 and "--dc needs DCs by name" in result.stderr
    result = txsync("dev", "up", "--dcs", "0", "--data", str(tmp_path))
    assert result.returncode == 2 and "--dcs must be 1..9" in result.stderr
