"""History is truncated as a matter of course (issue 47), on real processes.

A 3-DC cluster (``DevCluster``, 2 SQLite workers per DC) with small txlog files takes
waves of batched upserts. Nothing but the running services reports progress: the
coordinators report the peers' synced lengths and the dispatches their workers' lowest
position (``ReportProgress``), and each store's rotations drop what all of them passed.
After every wave, every store must hold about the same number of transactions in memory
however many waves came before, must have truncated more, and keeps at most its
``--backups-kept`` retired files; a worker stopped meanwhile comes back from a snapshot,
since the history it would replay is gone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.dev_up import free_base_port
from tests.support.waiting import wait_until
from txsync.client import Client
from txsync.dev_cluster import DevCluster, layout_of
from txsync.v1 import admin_pb2, admin_pb2_grpc

pytestmark = pytest.mark.under_load  # a busy machine: see tests/conftest.py

WAVES = 4
TXS_PER_WAVE = 1_500
HISTORY_KEPT = 100
LOG_FILE_BYTES = 48 * 1024
"""About 700 transactions' worth of log at each store: a wave rotates twice or more."""
HELD_MOST = 3_000
"""Transactions a store may hold after a wave: what its last rotation kept (HISTORY_KEPT
and what was unfinished then: under a burst, the workers' lag) and what the current file
added since. It does not depend on the history: without truncation the last wave ends
with 6,001 (measured after the fix: 700 to 2,200)."""
SETTLE_S = 180.0
STOPPED = "dc2-w2"
"""The worker stopped for wave 2."""


def _status(address: str) -> admin_pb2.DcStatus:
    with grpc.insecure_channel(address) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        return stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=30).local


def _workers(address: str) -> list[admin_pb2.WorkerStatus]:
    with grpc.insecure_channel(address) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        return list(stub.ListWorkers(admin_pb2.ListWorkersRequest(), timeout=30).workers)


def _settled(retention: admin_pb2.Retention, truncated_before: int | None) -> bool:
    """The store truncated more than ``truncated_before`` (None: the first wave, no
    bar) and holds at most ``HELD_MOST`` transactions."""
    further = truncated_before is None or retention.truncated_total > truncated_before
    return further and retention.txs_held <= HELD_MOST


def _applied_everywhere(dcs: dict[str, Any], through: int, down: str) -> bool:
    """Every worker but ``down`` is healthy and has applied ``through``."""
    for dc in dcs.values():
        for worker in _workers(dc["store"]):
            if worker.worker_id != down and (not worker.healthy or worker.position < through):
                return False
    return True


def test_stores_hold_what_is_unfinished_not_the_history(tmp_path: Path) -> None:
    layout = layout_of(tmp_path, 3, free_base_port(3), witness=False, workers=2)
    dcs: dict[str, Any] = layout["dcs"]
    cluster = DevCluster(
        layout,
        extra_args={
            "transaction-store": [
                "--log-file-bytes-max", str(LOG_FILE_BYTES),
                "--history-kept", str(HISTORY_KEPT),
                "--history-kept-ms", "0",
                "--backups-kept", "1",
            ]
        },
    )  # fmt: skip
    stopped = next(s for s in cluster.services if s.name == f"{STOPPED} worker")
    cluster.start()
    held: list[dict[str, int]] = []
    truncated: list[dict[str, int]] = []
    try:
        with Client([dc["store"] for dc in dcs.values()], timeout=120) as client:
            client.submit("CREATE TABLE kv (k INTEGER PRIMARY KEY, v INTEGER)", wait="ok")
            for wave in range(WAVES):
                # One worker misses wave 2: it comes back behind the truncated history.
                if wave == 2:
                    stopped.stop()
                    stopped.wait_stopped(60)
                elif wave == 3:
                    stopped.start()
                client.submit_many(
                    [
                        ("INSERT OR REPLACE INTO kv VALUES (?, ?)", (n % 500, wave))
                        for n in range(TXS_PER_WAVE)
                    ],
                    wait="accepted",
                )
                end = _status(dcs["dc1"]["store"]).merge_base.synced_len
                down = STOPPED if wave == 2 else ""
                wait_until(
                    f"wave {wave} applied by every worker",
                    lambda end=end, down=down: _applied_everywhere(dcs, end, down),  # type: ignore[misc]
                    SETTLE_S,
                    poll_s=0.5,
                )
                # Truncation follows the next progress reports, and goes in steps (a
                # rotation, or ``TRUNCATION_STEP`` positions in place): on a busy machine
                # the first step after a wave left 3,100 held for a moment (CI, 2026-11-30).
                # What is bounded is where it settles; without truncation it never does.
                before = truncated[-1] if truncated else None
                wait_until(
                    f"wave {wave}: every store truncated further, to {HELD_MOST} held at most",
                    lambda before=before: all(  # type: ignore[misc]
                        _settled(
                            _status(dc["store"]).retention, None if before is None else before[node]
                        )
                        for node, dc in dcs.items()
                    ),
                    SETTLE_S,
                    poll_s=0.5,
                )
                statuses = {node: _status(dc["store"]).retention for node, dc in dcs.items()}
                held.append({node: int(r.txs_held) for node, r in statuses.items()})
                truncated.append({node: int(r.truncated_total) for node, r in statuses.items()})
            digests = {w.state_digest for dc in dcs.values() for w in _workers(dc["store"])}
            assert len(digests) == 1, "every worker, the one copied to too, holds the same data"
    finally:
        cluster.stop()
    for wave in range(WAVES):
        for node in dcs:
            assert held[wave][node] <= HELD_MOST, (wave, node, held)
            if wave:
                assert truncated[wave][node] > truncated[wave - 1][node], (wave, truncated)
    for node, dc in dcs.items():
        backups = list((Path(dc["data"]) / "txlog").glob("bak-*.dat"))
        assert len(backups) <= 1, (node, backups)
    dispatch_log = (Path(dcs["dc2"]["data"]) / "worker-dispatch.log").read_text()
    assert f"worker {STOPPED} needs a snapshot" in dispatch_log
    assert f"{STOPPED} restored at position" in dispatch_log
