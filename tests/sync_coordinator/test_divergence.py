"""Cross-DC divergence detection: DCs compare their finished outcomes by position."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import grpc

from tests.support.cluster import LocalCluster
from tests.support.processes import ServiceProcess, free_port, worker, worker_dispatch
from txsync.sync_coordinator.outcomes import Finished, OutcomeLedger
from txsync.v1 import client_pb2, client_pb2_grpc, common_pb2


def test_the_ledger_alarms_once_per_peer_at_the_first_difference() -> None:
    ledger = OutcomeLedger("dc1")
    same, other = b"\x01" * 32, b"\x02" * 32
    ledger.add_theirs("dc2", Finished(1, "a", True, same))  # before ours: kept for later
    ledger.add_own(Finished(1, "a", True, same))
    ledger.add_own(Finished(2, "b", True, same))
    ledger.add_theirs("dc2", Finished(2, "b", False, other))
    ledger.add_theirs("dc2", Finished(3, "c", False, other))
    ledger.add_own(Finished(3, "c", True, same))
    assert ledger.compared == 3 and ledger.alarm_count == 1
    assert "position 2" in ledger.alarms[0] and "dc2 has b FAILED" in ledger.alarms[0]
    assert [f.position for f in ledger.since(1)] == [2, 3]


def test_a_digest_not_known_at_a_copy_s_position_is_not_a_difference() -> None:
    """The DC that adopted a copy at position 1 knows its verdict, not its digest; the
    verdict is still compared, and the digests from there on."""
    ledger = OutcomeLedger("dc1")
    digest, other = b"\x01" * 32, b"\x02" * 32
    ledger.add_own(Finished(1, "a", True, digest))
    ledger.add_theirs("dc3", Finished(1, "a", True, b""))
    assert ledger.alarm_count == 0
    ledger.add_own(Finished(2, "b", True, digest))
    ledger.add_theirs("dc3", Finished(2, "b", True, other))
    assert ledger.alarm_count == 1 and "position 2" in ledger.alarms[0]
    ledger = OutcomeLedger("dc1")
    ledger.add_own(Finished(1, "a", True, digest))
    ledger.add_theirs("dc3", Finished(1, "a", False, b""))
    assert ledger.alarm_count == 1, "a verdict is compared without a digest"


def test_a_dc_whose_worker_went_its_own_way_raises_an_alarm_naming_both(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path, 2)
    processes: list[ServiceProcess] = []
    try:
        for dc in cluster.dcs:
            applier = worker(tmp_path / f"{dc.node_id}-w1", f"{dc.node_id}-w1", port=free_port())
            applier.start()
            dispatch = worker_dispatch(
                tmp_path / f"{dc.node_id}-dispatch",
                dc.store.address,
                {f"{dc.node_id}-w1": applier.address},
            )
            dispatch.start()
            processes += [applier, dispatch]
        dc1, dc2 = cluster.dcs

        def submit(sql: str) -> str:
            with grpc.insecure_channel(dc1.store.address) as channel:
                stub = client_pb2_grpc.ClientServiceStub(channel)
                body = common_pb2.TxBody(statements=[common_pb2.Statement(sql=sql)])
                tx_id = stub.Submit(client_pb2.SubmitRequest(body=body)).tx_id
            for dc in cluster.dcs:  # OK (or FAILED) at both DCs
                with grpc.insecure_channel(dc.store.address) as channel:
                    client_pb2_grpc.ClientServiceStub(channel).Wait(
                        client_pb2.WaitRequest(tx_id=tx_id, state=common_pb2.TX_STATE_OK)
                    )
            return tx_id

        submit("CREATE TABLE t (n INTEGER)")
        for n in range(3):
            submit(f"INSERT INTO t VALUES ({n})")
        cluster.wait_for("both DCs compare and agree", lambda: not cluster.status(dc1).alarms)
        with sqlite3.connect(tmp_path / "dc2-w1" / "worker.sqlite") as behind_its_back:
            behind_its_back.execute("DELETE FROM t WHERE n = 2")
        update = submit("UPDATE t SET n = n + 10")  # 3 rows at dc1, 2 at dc2
        submit("INSERT INTO t VALUES (99)")  # a later post carries the outcomes
        cluster.wait_for(
            "dc1 raises a divergence alarm",
            lambda: any("DIVERGENCE" in a for a in cluster.status(dc1).alarms),
        )
        alarm = next(a for a in cluster.status(dc1).alarms if "DIVERGENCE" in a)
        assert "position 5" in alarm and update in alarm and "dc2" in alarm
        assert not cluster.status(dc1).healthy
        cluster.wait_for(
            "dc2 raises one too", lambda: any("DIVERGENCE" in a for a in cluster.status(dc2).alarms)
        )
    finally:
        for process in reversed(processes):
            if process.process is not None and process.process.poll() is None:
                process.terminate()
        cluster.stop()
