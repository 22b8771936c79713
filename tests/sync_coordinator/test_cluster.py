"""Several DCs of real processes (a transaction-store and a sync-coordinator each) on
loopback agree on one order of transactions submitted everywhere at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2

from tests.support.cluster import LocalCluster, submit_at
from tests.support.peer_stream import post
from txsync.v1 import client_pb2, client_pb2_grpc, common_pb2, peer_pb2, peer_pb2_grpc


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path, 3)
    yield cluster
    cluster.stop()


def test_three_dcs_agree_on_one_order_of_concurrent_submits(cluster3: LocalCluster) -> None:
    acked: list[str] = []
    lock = threading.Lock()
    threads = [
        threading.Thread(target=submit_at, args=(dc, 60, acked, lock)) for dc in cluster3.dcs
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


def test_a_dc_killed_and_restarted_catches_up(cluster3: LocalCluster) -> None:
    acked: list[str] = []
    lock = threading.Lock()
    first, victim = cluster3.dcs[0], cluster3.dcs[2]
    submit_at(first, 20, acked, lock)
    cluster3.wait_converged(set(acked))
    victim.coordinator.kill()
    victim.store.kill()
    submit_at(first, 20, acked, lock)  # the others cannot order without it: empty rounds
    victim.store.start()  # same port, same data: it recovers its txlog
    victim.coordinator.start()
    submit_at(victim, 10, acked, lock)
    order = cluster3.wait_converged(set(acked))
    assert len(order) == 50


def test_a_coordinator_that_loses_its_store_stops_instead_of_lingering(
    cluster3: LocalCluster,
) -> None:
    acked: list[str] = []
    lock = threading.Lock()
    victim = cluster3.dcs[1]
    victim.store.kill()
    submit_at(cluster3.dcs[0], 3, acked, lock)  # the victim must persist what it learns
    process = victim.coordinator.process
    assert process is not None
    assert process.wait(timeout=30) == 1
    # The stream of protocol steps to the store breaks at once (before any persist fails).
    assert "sync-coordinator stopped: durable-steps ended" in victim.coordinator.log()


def test_a_post_naming_a_post_the_receiver_lacks_is_answered_whole_needed(
    cluster3: LocalCluster,
) -> None:
    """After a restart (or once the named post is evicted) a receiver cannot rebuild a
    post sent as a change: it takes nothing and asks for the whole queue."""
    acked: list[str] = []
    submit_at(cluster3.dcs[0], 5, acked, threading.Lock())
    cluster3.wait_converged(set(acked))  # posts went back and forth as changes meanwhile
    change = peer_pb2.PostRequest(
        sender="dc2", epoch=10**9, seq=2, counter=1, delta_from_seq=1, queue_len=0
    )
    with grpc.insecure_channel(cluster3.dcs[0].coordinator.address) as channel:
        answer = post(peer_pb2_grpc.PeerServiceStub(channel), change)
    assert answer.whole_needed


def test_hundreds_of_bodies_pushed_at_once_are_ordered_and_no_coordinator_stops(
    cluster3: LocalCluster,
) -> None:
    """Batched submits make a DC push bodies by the hundred: a peer's coordinator writes
    each with the step that acquires it, and once put 300 in one write, which the store
    refuses (at most 256 per step), so that coordinator stopped (make bench, 12 clients
    submitting batches of 50). Each write now stays within the store's count."""
    origin = cluster3.dcs[0]
    acked: list[str] = []
    lock = threading.Lock()

    def submit_batches(client: int) -> None:
        with grpc.insecure_channel(origin.store.address) as channel:
            stub = client_pb2_grpc.ClientServiceStub(channel)
            for batch in range(3):
                submits = [
                    client_pb2.SubmitRequest(
                        body=common_pb2.TxBody(
                            statements=[
                                common_pb2.Statement(
                                    sql="INSERT INTO t (dc, n) VALUES (?, ?)",
                                    params=[
                                        common_pb2.SqlValue(text_value=f"client{client}"),
                                        common_pb2.SqlValue(int_value=batch * 1000 + n),
                                    ],
                                )
                            ]
                        )
                    )
                    for n in range(400)
                ]
                answer = stub.SubmitBatch(client_pb2.SubmitBatchRequest(submits=submits))
                assert all(result.HasField("accepted") for result in answer.results)
                with lock:
                    acked.extend(result.accepted.tx_id for result in answer.results)

    threads = [threading.Thread(target=submit_batches, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cluster3.wait_converged(set(acked))) == 4 * 3 * 400
    for dc in cluster3.dcs:
        assert dc.coordinator.process is not None
        assert dc.coordinator.process.poll() is None, dc.coordinator.log()[-2000:]
