"""Several DCs of real processes (a transaction-store and a sync-coordinator each) on
loopback agree on one order of transactions submitted everywhere at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2

from tests.support.processes import (
    ServiceProcess,
    free_port,
    sync_coordinator,
    transaction_store,
)
from txsync.v1 import client_pb2, client_pb2_grpc, common_pb2, store_pb2, store_pb2_grpc

CONVERGE_TIMEOUT_S = 60.0


@dataclass
class Dc:
    node_id: str
    store: ServiceProcess
    coordinator: ServiceProcess


class Cluster:
    def __init__(self, root: Path, size: int) -> None:
        ids = [f"dc{n + 1}" for n in range(size)]
        ports = {node: free_port() for node in ids}
        self.dcs: list[Dc] = []
        for node in ids:
            store = transaction_store(root / node, node, port=free_port())
            store.start()
            peers = {p: ports[p] for p in ids if p != node}
            coordinator = sync_coordinator(
                root / node, node, store.address, ports[node], peers,
                "--round-timeout-ms", "300", "--idle-interval-ms", "200",
            )  # fmt: skip
            self.dcs.append(Dc(node, store, coordinator))
        for dc in self.dcs:
            dc.coordinator.start()

    def stop(self) -> None:
        for dc in self.dcs:
            for process in (dc.coordinator, dc.store):
                if process.process is not None and process.process.poll() is None:
                    assert process.terminate() == 0, process.log()

    def synced(self, dc: Dc) -> list[str]:
        with grpc.insecure_channel(dc.store.address) as channel:
            stub = store_pb2_grpc.StoreInternalServiceStub(channel)
            ids: list[str] = []
            while True:
                answer = stub.ReadSynced(
                    store_pb2.ReadSyncedRequest(from_len=len(ids), count_max=1024)
                )
                if not answer.entries:
                    return ids
                ids.extend(m.tx_id for m in answer.entries)

    def wait_converged(self, expected: set[str]) -> list[str]:
        deadline = time.monotonic() + CONVERGE_TIMEOUT_S
        while True:
            orders = [self.synced(dc) for dc in self.dcs]
            if all(set(order) == expected for order in orders):
                assert all(order == orders[0] for order in orders), "the DCs' orders differ"
                return orders[0]
            for order in orders:  # prefix consistency holds at every moment
                shortest = min(len(order), len(orders[0]))
                assert order[:shortest] == orders[0][:shortest], "the DCs' orders forked"
            if time.monotonic() > deadline:
                counts = {dc.node_id: len(o) for dc, o in zip(self.dcs, orders, strict=True)}
                raise AssertionError(f"no convergence on {len(expected)} txs: {counts}")
            time.sleep(0.1)


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, 3)
    yield cluster
    cluster.stop()


def _submit_at(dc: Dc, count: int, acked: list[str], lock: threading.Lock) -> None:
    with grpc.insecure_channel(dc.store.address) as channel:
        stub = client_pb2_grpc.ClientServiceStub(channel)
        for n in range(count):
            body = common_pb2.TxBody(
                statements=[
                    common_pb2.Statement(
                        sql="INSERT INTO t (dc, n) VALUES (?, ?)",
                        params=[
                            common_pb2.SqlValue(text_value=dc.node_id),
                            common_pb2.SqlValue(int_value=n),
                        ],
                    )
                ]
            )
            answer = stub.Submit(client_pb2.SubmitRequest(body=body))
            with lock:
                acked.append(answer.tx_id)


def test_three_dcs_agree_on_one_order_of_concurrent_submits(cluster3: Cluster) -> None:
    acked: list[str] = []
    lock = threading.Lock()
    threads = [
        threading.Thread(target=_submit_at, args=(dc, 60, acked, lock)) for dc in cluster3.dcs
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    order = cluster3.wait_converged(set(acked))
    assert len(order) == 180
    # Every DC holds every body and moved every transaction to ENQUEUED.
    for dc in cluster3.dcs:
        with grpc.insecure_channel(dc.store.address) as channel:
            stub = client_pb2_grpc.ClientServiceStub(channel)
            for tx_id in order[:: len(order) // 12]:
                wait = client_pb2.WaitRequest(
                    tx_id=tx_id,
                    state=common_pb2.TX_STATE_ENQUEUED,
                    timeout=duration_pb2.Duration(seconds=10),
                )
                got = stub.Wait(wait)
                assert got.reached, (dc.node_id, tx_id, got.state)


def test_a_dc_killed_and_restarted_catches_up(cluster3: Cluster) -> None:
    acked: list[str] = []
    lock = threading.Lock()
    first, victim = cluster3.dcs[0], cluster3.dcs[2]
    _submit_at(first, 20, acked, lock)
    cluster3.wait_converged(set(acked))
    victim.coordinator.kill()
    victim.store.kill()
    _submit_at(first, 20, acked, lock)  # the others cannot order without it: empty rounds
    victim.store.start()  # same port, same data: it recovers its txlog
    victim.coordinator.start()
    _submit_at(victim, 10, acked, lock)
    order = cluster3.wait_converged(set(acked))
    assert len(order) == 50
