"""Flow control (``--unpassed-max``, issue 47) on real processes.

A store refuses its own clients' submits while a peer DC in the view, its slowest
worker or its first unfinished transaction is that many positions behind the synced
end: it holds in memory what they have not passed, and a burst that ran far ahead left
the store's RSS at the burst's peak for good (``docs/benchmarks.md``, "History
bounded"). A DC away (its sync paused, excluded from the view) holds nothing back: the
others go on taking submits.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.dev_up import free_base_port
from tests.support.waiting import wait_until
from txsync.client import Client
from txsync.dev_cluster import DevCluster, layout_of
from txsync.v1 import admin_pb2, admin_pb2_grpc, client_pb2, client_pb2_grpc, common_pb2

pytestmark = pytest.mark.under_load  # a busy machine: see tests/conftest.py

LIMIT = 64
KEEPS_NO_HISTORY = ("--history-kept", "0", "--history-kept-ms", "0")
"""The positions kept on purpose count against the bound (the core hears only what they
let go), and a store refuses to start with a bound at or below them."""
BATCH = 500
BURST_BATCHES_MOST = 40
"""Batches sent back to back at most before flow control must have refused some: the
coordinator and the dispatch report four times a second (``PROGRESS_REPORT_S``), the
core hears a report later, and a batch of 500 alone passes the limit until they do."""
SETTLE_S = 180.0


@contextlib.contextmanager
def _admin(address: str) -> Iterator[admin_pb2_grpc.AdminServiceStub]:
    with grpc.insecure_channel(address) as channel:
        yield admin_pb2_grpc.AdminServiceStub(channel)


def _status(address: str) -> admin_pb2.DcStatus:
    with _admin(address) as admin:
        return admin.GetStatus(admin_pb2.GetStatusRequest(), timeout=30).local


def _batch(first: int, count: int) -> client_pb2.SubmitBatchRequest:
    return client_pb2.SubmitBatchRequest(
        submits=[
            client_pb2.SubmitRequest(
                body=common_pb2.TxBody(
                    statements=[
                        common_pb2.Statement(
                            sql=f"INSERT OR REPLACE INTO kv VALUES ({n % 1000}, {n})"
                        )
                    ]
                )
            )
            for n in range(first, first + count)
        ]
    )


def _refusals(address: str, first: int, count: int) -> list[str]:
    """Submit ``count`` at ``address`` in one SubmitBatch; the refusals' messages."""
    with grpc.insecure_channel(address) as channel:
        answer = client_pb2_grpc.ClientServiceStub(channel).SubmitBatch(
            _batch(first, count), timeout=120
        )
    return [result.error for result in answer.results if not result.HasField("accepted")]


def _applied_everywhere(dcs: dict[str, Any], through: int) -> bool:
    for dc in dcs.values():
        with _admin(dc["store"]) as admin:
            workers = admin.ListWorkers(admin_pb2.ListWorkersRequest(), timeout=30).workers
        if not all(worker.healthy and worker.position >= through for worker in workers):
            return False
    return True


def test_a_burst_meets_flow_control_and_a_dc_away_holds_nothing_back(tmp_path: Path) -> None:
    layout = layout_of(tmp_path, 3, free_base_port(3), witness=False, workers=1)
    dcs: dict[str, Any] = layout["dcs"]
    store_args = ["--unpassed-max", str(LIMIT), *KEEPS_NO_HISTORY]
    cluster = DevCluster(layout, extra_args={"transaction-store": store_args})
    dc1, dc2, dc3 = (dcs[name]["store"] for name in ("dc1", "dc2", "dc3"))
    cluster.start()
    try:
        with Client([dc1, dc2], timeout=120) as client:
            client.submit("CREATE TABLE kv (k INTEGER PRIMARY KEY, v INTEGER)", wait="ok")

        # A burst at dc1 runs ahead of what its peers and worker reported passing.
        refused: list[str] = []
        for batch in range(BURST_BATCHES_MOST):
            refused = _refusals(dc1, batch * BATCH, BATCH)
            if refused:
                break
        assert refused, f"{BURST_BATCHES_MOST} batches of {BATCH} and no refusal"
        assert "RESOURCE_EXHAUSTED" in refused[0] and "flow control" in refused[0], refused[0]
        assert f"limit {LIMIT}" in refused[0], refused[0]

        # Once they passed what was taken, dc1 takes submits again.
        end = _status(dc1).merge_base.synced_len
        wait_until("the burst applied everywhere", lambda: _applied_everywhere(dcs, end), SETTLE_S)
        wait_until("dc1 takes a submit again", lambda: not _refusals(dc1, 0, 1), SETTLE_S)

        # dc3 away: once the others' view leaves it out, it holds nothing back, though
        # its order stays where it stopped.
        with _admin(dc3) as admin:
            admin.PauseSync(admin_pb2.PauseSyncRequest(), timeout=30)
        wait_until(
            "dc1's and dc2's view without dc3",
            lambda: all("dc3" not in _status(dc).view.members for dc in (dc1, dc2)),
            SETTLE_S,
        )
        with Client([dc1, dc2], timeout=SETTLE_S) as client:
            for wave in range(4):
                outcomes = client.submit_many(
                    [
                        ("INSERT OR REPLACE INTO kv VALUES (?, ?)", (n % 1000, n))
                        for n in range(wave * LIMIT, (wave + 1) * LIMIT)
                    ],
                    wait="ok",
                )
                assert all(sent.outcome and sent.outcome.ok for sent in outcomes), outcomes
        for dc in (dc1, dc2):
            assert _status(dc).merge_base.synced_len >= _status(dc3).merge_base.synced_len + (
                4 * LIMIT
            )
        # Still nothing refused for dc3's sake at the last moment.
        assert not [error for error in _refusals(dc1, 0, 1) if "dc3" in error]

        with _admin(dc3) as admin:
            admin.ResumeSync(admin_pb2.ResumeSyncRequest(), timeout=30)
        end = _status(dc1).merge_base.synced_len
        wait_until("dc3 back and caught up", lambda: _applied_everywhere(dcs, end), SETTLE_S)
    finally:
        cluster.stop()


def test_a_bound_within_the_history_kept_on_purpose_stops_the_store(tmp_path: Path) -> None:
    """Every report's delay would refuse submits: a clear error at start instead."""
    ran = subprocess.run(
        [sys.executable, "-m", "txsync.cli.main", "transaction-store", "--node-id", "dc1",
         "--data", str(tmp_path / "data"), "--listen", "127.0.0.1:0",
         "--unpassed-max", str(LIMIT)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 2, ran.stderr
    assert f"--unpassed-max ({LIMIT}) must exceed the newest positions kept" in ran.stderr
    assert "(2048: --history-kept" in ran.stderr
