"""`txsync dev up` and `txsync submit`, through their command lines."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc

from txsync.v1 import client_pb2, client_pb2_grpc


def _free_base_port() -> int:
    """A base port whose six ports (3 DCs x store, coordinator) are free right now."""
    rng = random.Random()
    for _ in range(50):
        base = rng.randrange(20_000, 40_000, 1000)
        ports = [base + 100 * n + k for n in (1, 2, 3) for k in (1, 2)]
        try:
            for port in ports:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range")


def _txsync(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txsync.cli.main", *args],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def _up(data: Path, base: int) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "txsync.cli.main", "dev", "up", "--data", str(data),
         "--base-port", str(base)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (data / "cluster.json").exists():
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, "dev up did not come up"
        time.sleep(0.1)
    return process


def _down(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    return output


def test_dev_up_runs_a_cluster_that_takes_submits_and_resumes(tmp_path: Path) -> None:
    data = tmp_path / "cluster"
    base = _free_base_port()
    process = _up(data, base)
    layout = json.loads((data / "cluster.json").read_text())
    assert sorted(layout["dcs"]) == ["dc1", "dc2", "dc3"]
    cluster = str(data / "cluster.json")
    create = "CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT)"
    table = _txsync("submit", "--endpoints", cluster, "--dc", "dc1", "--sql", create,
                    "--wait", "ok")  # fmt: skip
    assert table.returncode == 0, table.stderr
    answer = _txsync("submit", "--endpoints", cluster, "--dc", "dc2",
                     "--sql", "INSERT INTO t (a, b) VALUES (?, ?)", "--param", "1",
                     "--param", "s:x", "--wait", "ok", "-o", "json")  # fmt: skip
    assert answer.returncode == 0, answer.stderr
    submitted = json.loads(answer.stdout)
    assert submitted["reached"] and submitted["state"] == "TX_STATE_OK"  # applied by workers
    again = _txsync("submit", "--endpoints", cluster, "--dc", "dc3",
                    "--sql", "INSERT INTO t (a, b) VALUES (1, 'y')", "--wait", "ok")  # fmt: skip
    assert again.returncode == 4 and "UNIQUE constraint failed" in again.stdout
    status = _txsync("status", "--endpoints", cluster)
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.count("MAJORITY") == 3 and status.stdout.count(" yes") == 3
    workers = _txsync("workers", "--endpoints", cluster, "-o", "json")
    assert workers.returncode == 0, workers.stderr
    listed = json.loads(workers.stdout)
    assert sorted(listed) == ["dc1", "dc2", "dc3"]
    assert all(len(w) == 2 and sum(x["testing"] for x in w) == 1 for w in listed.values())
    shown = _txsync("tx", "get", submitted["tx_id"], "--endpoints", cluster, "--dc", "dc3")
    assert shown.returncode == 0, shown.stderr
    assert "OK  position 2" in shown.stdout and "INSERT INTO t" in shown.stdout
    assert all(f"at {dc}: OK" in shown.stdout for dc in ("dc1", "dc2", "dc3")), shown.stdout
    assert "outcome: OK, rows affected [1]" in shown.stdout
    failed = _txsync("tx", "list", "--endpoints", cluster, "--dc", "dc3", "--state", "failed")
    assert failed.returncode == 0 and "(1 transaction)" in failed.stdout
    unknown = _txsync("tx", "get", "00000000-0000-4000-8000-000000000000", "--endpoints", cluster)
    assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr
    output = _down(process)
    assert "3 DCs up" in output and "stopped." in output
    for dc in layout["dcs"].values():  # every service is gone: nothing listens any more
        for address in (dc["store"], dc["coordinator"]):
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is fine
                probe.bind(("127.0.0.1", int(address.rsplit(":", 1)[1])))

    process = _up(data, base)
    try:
        with grpc.insecure_channel(layout["dcs"]["dc3"]["store"]) as channel:
            got = client_pb2_grpc.ClientServiceStub(channel).Get(
                client_pb2.GetRequest(tx_id=submitted["tx_id"])
            )
            assert got.position == 2  # the same cluster, resumed with its order
    finally:
        output = _down(process)
    assert "resuming the cluster" in output


def test_submit_and_dev_up_refuse_bad_input_clearly(tmp_path: Path) -> None:
    missing = _txsync("status", "--endpoints", str(tmp_path / "nowhere.json"))
    assert missing.returncode == 2 and "is the cluster up?" in missing.stderr
    result = _txsync("submit", "--sql", "SELECT 1", "--endpoints", "127.0.0.1:1", "--dc", "dc1")
    assert result.returncode == 2 and "--dc needs a cluster file" in result.stderr
    result = _txsync("dev", "up", "--dcs", "0", "--data", str(tmp_path))
    assert result.returncode == 2 and "--dcs must be 1..9" in result.stderr
