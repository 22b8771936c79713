"""worker-dispatch after faults, on real processes (a store, a coordinator, two SQLite
workers, a dispatch): outcomes a crash left unrecorded are reported again; a worker that
was idle is not taken for stuck when work arrives; a stuck worker that never moves is
fed again after a backoff."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from tests.support.cluster import LocalCluster
from tests.support.processes import ServiceProcess, free_port, worker, worker_dispatch
from tests.support.store_stream import advance
from txsync.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    client_pb2,
    client_pb2_grpc,
    common_pb2,
    store_pb2,
    store_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from txsync.worker.sqlite_backend import BUSY_TIMEOUT_S

pytestmark = pytest.mark.under_load  # a busy machine: see tests/conftest.py

FINAL = (common_pb2.TX_STATE_OK, common_pb2.TX_STATE_FAILED)


@dataclass
class Dc:
    """One DC whose dispatch the test starts when it wants (``start_dispatch``)."""

    root: Path
    cluster: LocalCluster
    workers: dict[str, ServiceProcess]
    dispatch: ServiceProcess | None = None

    @property
    def store(self) -> str:
        return self.cluster.dcs[0].store.address

    def start_dispatch(self, *flags: str) -> None:
        addresses = {name: process.address for name, process in self.workers.items()}
        self.dispatch = worker_dispatch(self.root / "dispatch", self.store, addresses, *flags)
        self.dispatch.start()

    def submit(self, sql: str) -> str:
        with grpc.insecure_channel(self.store) as channel:
            stub = client_pb2_grpc.ClientServiceStub(channel)
            body = common_pb2.TxBody(statements=[common_pb2.Statement(sql=sql)])
            return stub.Submit(client_pb2.SubmitRequest(body=body), timeout=30).tx_id

    def state(self, tx_id: str) -> int:
        with grpc.insecure_channel(self.store) as channel:
            stub = client_pb2_grpc.ClientServiceStub(channel)
            return stub.Get(client_pb2.GetRequest(tx_id=tx_id), timeout=30).state

    def workers_status(self) -> dict[str, admin_pb2.WorkerStatus]:
        assert self.dispatch is not None
        with grpc.insecure_channel(self.dispatch.address) as channel:
            stub = admin_pb2_grpc.AdminServiceStub(channel)
            answer = stub.ListWorkers(admin_pb2.ListWorkersRequest(), timeout=30)
        return {w.worker_id: w for w in answer.workers}

    def database(self, worker_id: str) -> Path:
        return self.root / worker_id / "worker.sqlite"


@pytest.fixture
def dc(tmp_path: Path) -> Iterator[Dc]:
    cluster = LocalCluster(tmp_path, 1)
    workers = {name: worker(tmp_path / name, name, port=free_port()) for name in ("w1", "w2")}
    the_dc = Dc(tmp_path, cluster, workers)
    try:
        for process in workers.values():
            process.start()
        yield the_dc
        if the_dc.dispatch is not None:
            assert the_dc.dispatch.terminate() == 0, the_dc.dispatch.log()
    finally:
        if the_dc.dispatch is not None:
            the_dc.dispatch.kill()
        for process in workers.values():
            process.kill()
        cluster.stop()


def test_outcomes_a_crash_left_unrecorded_are_reported_after_a_restart(dc: Dc) -> None:
    """The state a SIGKILL of dispatch (or of the store, or the whole DC) leaves between
    a worker's apply and the store's record: every worker has applied positions 1..5,
    the store holds them TESTING. Before the fix the restarted dispatch resumed after
    the workers' positions and the five stayed TESTING for good."""
    ids = [dc.submit("CREATE TABLE t (n INTEGER)")]
    ids += [dc.submit(f"INSERT INTO t VALUES ({n})") for n in range(4)]
    dc.cluster.wait_for(
        "all five enqueued",
        lambda: all(dc.state(t) >= common_pb2.TX_STATE_ENQUEUED for t in ids),
    )
    with grpc.insecure_channel(dc.store) as channel:
        store = store_pb2_grpc.StoreInternalServiceStub(channel)
        follow = store.FollowEnqueued(store_pb2.FollowEnqueuedRequest(from_position=1))
        entries: list[store_pb2.EnqueuedTx] = []
        for ready in follow:  # in batches of every position ready
            entries.extend(ready.txs)
            if len(entries) >= len(ids):
                break
        follow.cancel()
        # What the crashed dispatch had recorded: TESTING, and no outcome.
        batch = store_pb2.AdvanceStatesRequest(
            changes=[
                store_pb2.StateChange(tx_id=t, state=common_pb2.TX_STATE_TESTING) for t in ids
            ],
            service="worker-dispatch",
        )
        advance(store, batch)
    assert [e.meta.tx_id for e in entries] == ids
    digests = set()
    for name, process in dc.workers.items():
        with grpc.insecure_channel(process.address) as channel:
            requests = [
                worker_pb2.ApplyRequest(position=e.position, tx_id=e.meta.tx_id, body=e.body)
                for e in entries
            ]
            answers = list(worker_pb2_grpc.WorkerServiceStub(channel).Apply(iter(requests)))
        assert [a.outcome.state for a in answers] == [common_pb2.TX_STATE_OK] * 5, name
        digests.add(answers[-1].outcome.state_digest)
    assert len(digests) == 1
    assert all(dc.state(t) == common_pb2.TX_STATE_TESTING for t in ids)

    dc.start_dispatch()
    dc.cluster.wait_for(
        "every transaction OK at the store", lambda: all(dc.state(t) in FINAL for t in ids)
    )
    assert all(dc.state(t) == common_pb2.TX_STATE_OK for t in ids)
    later = dc.submit("INSERT INTO t VALUES (99)")  # and the order goes on from there
    dc.cluster.wait_for("the next one OK", lambda: dc.state(later) == common_pb2.TX_STATE_OK)
    dc.cluster.wait_for(
        "both workers at position 6 with one digest",
        lambda: (
            {(w.position, w.state_digest) for w in dc.workers_status().values()}
            == {(6, dc.workers_status()["w1"].state_digest)}
        ),
    )


STUCK_AFTER_S = 5.0
IDLE_S = STUCK_AFTER_S + 1.5
LOCKED_S = 2.5
"""Longer than two heartbeats, well within STUCK_AFTER_S."""


def test_an_idle_worker_is_not_taken_for_stuck_when_work_arrives(dc: Dc) -> None:
    """Dispatch measured a worker's wait from its last outcome (or the pipeline's start),
    so the first transaction after an idle spell longer than --stuck-after-s made any
    heartbeat during its apply declare the worker stuck ("no outcome for 14 s with 1 in
    flight", seen under load). Here the testing worker's apply is held by a write lock
    for LOCKED_S after IDLE_S of idling: it must stay the testing worker."""
    dc.start_dispatch("--stuck-after-s", str(STUCK_AFTER_S))
    first = dc.submit("CREATE TABLE t (n INTEGER)")
    dc.cluster.wait_for("the table OK", lambda: dc.state(first) == common_pb2.TX_STATE_OK)
    tester = next(w for w, status in dc.workers_status().items() if status.testing)
    time.sleep(IDLE_S)  # the scenario itself: the DC idles longer than --stuck-after-s
    lock = sqlite3.connect(dc.database(tester), isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")  # the worker's next apply waits for this
        second = dc.submit("INSERT INTO t VALUES (1)")
        dc.cluster.wait_for(
            "the insert reaches the tester",
            lambda: dc.state(second) >= common_pb2.TX_STATE_TESTING,
        )
        time.sleep(LOCKED_S)  # the scenario: a slow apply, spanning heartbeats
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    dc.cluster.wait_for("the insert OK", lambda: dc.state(second) == common_pb2.TX_STATE_OK)
    assert dc.dispatch is not None
    assert "is stuck" not in dc.dispatch.log()
    assert dc.workers_status()[tester].testing


def test_a_stuck_worker_that_never_moves_is_fed_again(dc: Dc) -> None:
    """A worker whose apply failed after it was taken out as stuck stays where it was:
    dispatch used to wait for it to move past that position, which a worker that is fed
    nothing never does. Here w-testing's database stays locked past SQLite's busy
    timeout (10 s), so its apply fails; once the lock is gone, the retry with backoff
    feeds it again and it catches up."""
    dc.start_dispatch("--stuck-after-s", "2")
    first = dc.submit("CREATE TABLE t (n INTEGER)")
    dc.cluster.wait_for("the table OK", lambda: dc.state(first) == common_pb2.TX_STATE_OK)
    tester = next(w for w, status in dc.workers_status().items() if status.testing)
    lock = sqlite3.connect(dc.database(tester), isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")
        locked_at = time.monotonic()
        second = dc.submit("INSERT INTO t VALUES (1)")
        # The other worker takes the testing role and decides the transaction.
        dc.cluster.wait_for("the insert OK", lambda: dc.state(second) == common_pb2.TX_STATE_OK)
        assert dc.dispatch is not None
        log = dc.dispatch.log
        dc.cluster.wait_for(f"{tester} taken out as stuck", lambda: "is stuck" in log())
        # Held past SQLite's busy timeout, the first apply fails: nothing moves it now.
        dc.cluster.wait_for(
            f"{tester} fed again while its first apply has failed",
            lambda: (
                time.monotonic() > locked_at + BUSY_TIMEOUT_S + 1 and "feeding it again" in log()
            ),
        )
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    dc.cluster.wait_for(
        f"{tester} fed again and caught up",
        lambda: (
            len({(w.position, w.state_digest) for w in dc.workers_status().values()}) == 1
            and all(w.healthy and w.position == 2 for w in dc.workers_status().values())
        ),
    )
