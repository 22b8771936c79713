"""One DC of real processes: store, coordinator, worker-dispatch and two SQLite workers.
Transactions reach OK through the testing worker and every worker holds the same digest;
the testing role moves when its worker dies; a worker edited behind its back is caught."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from tests.support.cluster import LocalCluster, submit_at
from tests.support.processes import ServiceProcess, free_port, worker, worker_dispatch
from txsync.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    client_pb2,
    client_pb2_grpc,
    common_pb2,
)

pytestmark = pytest.mark.under_load  # a busy machine: see tests/conftest.py


@dataclass
class Dc:
    cluster: LocalCluster
    workers: dict[str, ServiceProcess]
    dispatch: ServiceProcess

    def submit(self, sql: str) -> str:
        with grpc.insecure_channel(self.cluster.dcs[0].store.address) as channel:
            stub = client_pb2_grpc.ClientServiceStub(channel)
            body = common_pb2.TxBody(statements=[common_pb2.Statement(sql=sql)])
            return stub.Submit(client_pb2.SubmitRequest(body=body)).tx_id

    def state(self, tx_id: str) -> int:
        with grpc.insecure_channel(self.cluster.dcs[0].store.address) as channel:
            stub = client_pb2_grpc.ClientServiceStub(channel)
            return stub.Get(client_pb2.GetRequest(tx_id=tx_id)).state

    def workers_status(self) -> dict[str, admin_pb2.WorkerStatus]:
        with grpc.insecure_channel(self.dispatch.address) as channel:
            stub = admin_pb2_grpc.AdminServiceStub(channel)
            answer = stub.ListWorkers(admin_pb2.ListWorkersRequest(), timeout=5)
        return {w.worker_id: w for w in answer.workers}

    def wait_all_final(self, tx_ids: list[str]) -> None:
        final = (common_pb2.TX_STATE_OK, common_pb2.TX_STATE_FAILED)
        self.cluster.wait_for(
            "every transaction OK or FAILED", lambda: all(self.state(t) in final for t in tx_ids)
        )


@pytest.fixture
def dc(tmp_path: Path) -> Iterator[Dc]:
    cluster = LocalCluster(tmp_path, 1)
    workers = {
        name: worker(tmp_path / name, name, "--touched-digest", "1", port=free_port())
        for name in ("w1", "w2")
    }
    try:
        for process in workers.values():
            process.start()
        addresses = {name: process.address for name, process in workers.items()}
        dispatch = worker_dispatch(
            tmp_path / "dispatch", cluster.dcs[0].store.address, addresses, "--stuck-after-s", "2"
        )
        dispatch.start()
        yield Dc(cluster, workers, dispatch)
        assert dispatch.terminate() == 0, dispatch.log()
    finally:
        for process in workers.values():
            if process.process is not None and process.process.poll() is None:
                process.terminate()
        cluster.stop()


def test_transactions_reach_ok_everywhere_and_the_testing_role_moves(dc: Dc) -> None:
    ids = [dc.submit("CREATE TABLE t (dc TEXT, n INTEGER)")]
    acked: list[str] = []
    submit_at(dc.cluster.dcs[0], 40, acked, threading.Lock())
    ids += acked
    ids.append(dc.submit("INSERT INTO missing_table VALUES (1)"))  # fails at the tester
    dc.wait_all_final(ids)
    assert dc.state(ids[-1]) == common_pb2.TX_STATE_FAILED
    assert all(dc.state(t) == common_pb2.TX_STATE_OK for t in ids[:-1])
    dc.cluster.wait_for(
        "both workers at the end with one digest",
        lambda: (
            len({(w.position, w.state_digest) for w in dc.workers_status().values()}) == 1
            and dc.workers_status()["w2"].position == len(ids)
        ),
    )
    assert dc.workers_status()["w1"].testing

    dc.workers["w1"].kill()
    dc.cluster.wait_for("w2 takes the testing role", lambda: dc.workers_status()["w2"].testing)
    later = [dc.submit(f"INSERT INTO t VALUES ('after', {n})") for n in range(10)]
    dc.wait_all_final(later)
    assert all(dc.state(t) == common_pb2.TX_STATE_OK for t in later)

    dc.workers["w1"].start()  # it catches up from its own position
    dc.cluster.wait_for(
        "w1 back and caught up",
        lambda: (
            dc.workers_status()["w1"].position == len(ids) + len(later)
            and dc.workers_status()["w1"].state_digest == dc.workers_status()["w2"].state_digest
        ),
    )


def _five_rows_then_behind_w2s_back(dc: Dc, tmp_path: Path, sql: str) -> list[str]:
    """Rows 0..4 in table t at both workers; then ``sql`` on w2's database alone."""
    ids = [dc.submit("CREATE TABLE t (n INTEGER)")]
    ids += [dc.submit(f"INSERT INTO t VALUES ({n})") for n in range(5)]
    dc.wait_all_final(ids)
    dc.cluster.wait_for("w2 caught up", lambda: dc.workers_status()["w2"].position == len(ids))
    with sqlite3.connect(tmp_path / "w2" / "worker.sqlite") as behind_its_back:
        behind_its_back.execute(sql)
    return ids


def test_a_worker_edited_behind_its_back_is_caught_and_recovered(dc: Dc, tmp_path: Path) -> None:
    ids = _five_rows_then_behind_w2s_back(dc, tmp_path, "DELETE FROM t WHERE n = 3")
    update = dc.submit("UPDATE t SET n = n + 10 WHERE n >= 3")  # 2 rows at w1, 1 at w2
    dc.wait_all_final([update])
    # w2 is caught out of sync, recovered from a snapshot of w1 and fed again.
    dc.cluster.wait_for(
        "w2 caught, recovered and back in step",
        lambda: (
            "RECOVERY: w2 restored" in dc.dispatch.log()
            and not (status := dc.workers_status())["w2"].out_of_sync
            and status["w2"].position == len(ids) + 1
            and status["w2"].state_digest == status["w1"].state_digest
        ),
    )
    assert "OUT OF SYNC: worker w2: digest differs at position 7" in dc.dispatch.log()
    after = dc.submit("INSERT INTO t VALUES (99)")
    dc.wait_all_final([after])
    dc.cluster.wait_for(
        "both apply the next one alike",
        lambda: len({(w.position, w.state_digest) for w in dc.workers_status().values()}) == 1,
    )
    with sqlite3.connect(tmp_path / "w2" / "worker.sqlite") as restored:
        rows = sorted(n for (n,) in restored.execute("SELECT n FROM t"))
    assert rows == [0, 1, 2, 13, 14, 99], "the deleted row is back, updated like w1's"


def test_a_value_that_differs_is_caught_at_the_transaction_that_touches_it(
    dc: Dc, tmp_path: Path
) -> None:
    """Rows affected alike, so the state digest agrees; the rows the transaction touched
    do not: w2 is out of sync at that very position (not 10,000 positions later at the
    content check) and recovered from w1."""
    ids = _five_rows_then_behind_w2s_back(dc, tmp_path, "UPDATE t SET n = 100 WHERE n = 3")
    update = dc.submit("UPDATE t SET n = n + 1 WHERE n >= 3")  # 2 rows at each
    dc.wait_all_final([update])
    dc.cluster.wait_for(
        "w2 caught, recovered and back in step",
        lambda: (
            "RECOVERY: w2 restored" in dc.dispatch.log()
            and not (status := dc.workers_status())["w2"].out_of_sync
            and status["w2"].position == len(ids) + 1
        ),
    )
    assert "the rows" in dc.dispatch.log() and "differ from the testing worker's" in (
        dc.dispatch.log()
    )
    with sqlite3.connect(tmp_path / "w2" / "worker.sqlite") as restored:
        rows = sorted(n for (n,) in restored.execute("SELECT n FROM t"))
    assert rows == [0, 1, 2, 4, 5], "w2 holds w1's rows again"


def test_a_worker_added_under_load_catches_up_to_the_same_digest_and_drains(
    dc: Dc, tmp_path: Path
) -> None:
    ids = [dc.submit("CREATE TABLE t (dc TEXT, n INTEGER)")]
    acked: list[str] = []
    load = threading.Thread(
        target=submit_at, args=(dc.cluster.dcs[0], 150, acked, threading.Lock())
    )
    load.start()
    dc.cluster.wait_for("well under way", lambda: dc.workers_status()["w1"].position > 120)
    # A third worker starts (as `kubectl scale` would add one) and registers itself; it is
    # far behind, so it starts from a snapshot of the testing worker, then the log.
    added = worker(tmp_path / "w3", "w3", "--dispatch", dc.dispatch.address, port=free_port())
    added.start()
    try:
        load.join()
        ids += acked
        dc.wait_all_final(ids)
        dc.cluster.wait_for(
            "w3 starts from a snapshot",
            lambda: "RECOVERY: w3 restored" in dc.dispatch.log(),
        )
        dc.cluster.wait_for(
            "w3 applied everything, with the DC's digest",
            lambda: (
                (status := dc.workers_status()).get("w3") is not None
                and status["w3"].position == len(ids)
                and status["w3"].state_digest == status["w1"].state_digest
                and not status["w3"].out_of_sync
            ),
        )
    finally:
        assert added.terminate() == 0, added.log()  # drains: dispatch forgets it
    dc.cluster.wait_for("w3 drained", lambda: "w3" not in dc.workers_status())
    assert "drained" in dc.dispatch.log()


def test_workers_killed_mid_stream_apply_every_transaction_exactly_once(
    dc: Dc, tmp_path: Path
) -> None:
    ids = [dc.submit("CREATE TABLE t (dc TEXT, n INTEGER)")]
    acked: list[str] = []
    load = threading.Thread(
        target=submit_at, args=(dc.cluster.dcs[0], 300, acked, threading.Lock())
    )
    load.start()

    # A follower, the testing worker, a follower again, each while transactions stream.
    def submitted_at_least(count: int) -> Callable[[], bool]:
        return lambda: len(acked) >= count

    for round_no, victim in enumerate(("w2", "w1", "w2"), start=1):
        dc.cluster.wait_for("the load is under way", submitted_at_least(70 * round_no))
        dc.workers[victim].kill()
        dc.workers[victim].start()
    load.join()
    ids += acked
    dc.wait_all_final(ids)
    dc.cluster.wait_for(
        "both workers at the end with one digest",
        lambda: (
            {(w.position, w.state_digest) for w in dc.workers_status().values()}
            == {(len(ids), dc.workers_status()["w1"].state_digest)}
        ),
    )
    for name in ("w1", "w2"):
        with sqlite3.connect(tmp_path / name / "worker.sqlite") as database:
            count, distinct = database.execute(
                "SELECT count(*), count(DISTINCT n) FROM t"
            ).fetchone()
        assert (count, distinct) == (300, 300), f"{name}: a transaction applied twice or lost"


def test_a_stuck_testing_worker_loses_its_role_and_comes_back(dc: Dc, tmp_path: Path) -> None:
    first = dc.submit("CREATE TABLE t (n INTEGER)")
    dc.wait_all_final([first])
    dc.cluster.wait_for("both at 1", lambda: dc.workers_status()["w2"].position == 1)
    assert dc.workers_status()["w1"].testing
    # Someone holds w1's database: w1 answers heartbeats but applies nothing.
    blocker = sqlite3.connect(tmp_path / "w1" / "worker.sqlite", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        stuck = dc.submit("INSERT INTO t VALUES (1)")
        dc.wait_all_final([stuck])  # decided by w2, while w1 is still blocked
        status = dc.workers_status()
        assert status["w2"].testing and not status["w1"].healthy
        assert "worker w1 is stuck: no outcome for" in dc.dispatch.log()
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    dc.cluster.wait_for(
        "w1 back in step",
        lambda: (
            (status := dc.workers_status())["w1"].healthy
            and status["w1"].position == 2
            and status["w1"].state_digest == status["w2"].state_digest
        ),
    )


def test_a_workers_database_and_disk_draw_warnings_and_leave_the_dc_healthy(
    tmp_path: Path,
) -> None:
    """Each heartbeat carries the worker's database size and its disk; dispatch shows
    them (ListWorkers) and warns past --database-bytes-alarm and below
    --disk-free-alarm-percent (thresholds here that any real worker passes). A warning is
    not an alarm: the worker still applies, so the DC's status stays healthy. (CI's disk
    was once 93% full; when that made every DC unhealthy, half the suite failed.)"""
    dispatch_port = free_port()
    cluster = LocalCluster(
        tmp_path, 1, store_args={"dc1": ("--dispatch", f"127.0.0.1:{dispatch_port}")}
    )
    one = worker(tmp_path / "w1", "w1", port=free_port())
    dispatch = None
    try:
        one.start()
        dispatch = worker_dispatch(
            tmp_path / "dispatch", cluster.dcs[0].store.address, {"w1": one.address},
            "--disk-free-alarm-percent", "100", "--database-bytes-alarm", "1",
            port=dispatch_port,
        )  # fmt: skip
        dispatch.start()

        def listed() -> admin_pb2.ListWorkersResponse:
            assert dispatch is not None
            with grpc.insecure_channel(dispatch.address) as channel:
                stub = admin_pb2_grpc.AdminServiceStub(channel)
                return stub.ListWorkers(admin_pb2.ListWorkersRequest(), timeout=5)

        def dc_status() -> admin_pb2.DcStatus:
            with grpc.insecure_channel(cluster.dcs[0].store.address) as channel:
                stub = admin_pb2_grpc.AdminServiceStub(channel)
                return stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=5).local

        cluster.wait_for("w1's storage is reported", lambda: listed().workers[0].database_bytes > 0)
        answer = listed()
        status = answer.workers[0]
        assert 0 < status.disk_free_bytes <= status.disk_total_bytes
        warnings = "\n".join(answer.warnings)
        assert "DISK: worker w1 has" in warnings and "warned below 100%" in warnings
        assert "DATABASE SIZE: worker w1's database holds" in warnings
        assert not answer.alarms, answer.alarms
        cluster.wait_for("the DC healthy, its status warning", lambda: dc_status().healthy)
        shown = dc_status()
        assert any(w.startswith("worker-dispatch: DISK: worker w1") for w in shown.warnings)
        assert not [a for a in shown.alarms if "DISK" in a], shown.alarms
    finally:
        if dispatch is not None:
            dispatch.terminate()
        one.terminate()
        cluster.stop()


def test_a_store_restart_is_not_a_pipeline_in_a_loop(dc: Dc) -> None:
    """While its store is down the dispatch retries with a growing pause, and does not
    count it as a pipeline restarting in a loop: before, 20 retries in 4 s raised the
    loop alarm, and the DC stayed unhealthy for 60 s after its store was back."""
    first = dc.submit("CREATE TABLE t (n INTEGER)")
    dc.wait_all_final([first])
    node = dc.cluster.dcs[0]
    node.coordinator.kill()
    node.store.kill()
    dc.cluster.wait_for(
        "the dispatch retried the store 6 times",
        lambda: dc.dispatch.log().count("store unreachable") >= 6,
    )
    node.store.start()
    node.coordinator.start()
    later = dc.submit("INSERT INTO t VALUES (1)")
    dc.wait_all_final([later])
    assert dc.state(later) == common_pb2.TX_STATE_OK
    with grpc.insecure_channel(dc.dispatch.address) as channel:
        answer = admin_pb2_grpc.AdminServiceStub(channel).ListWorkers(
            admin_pb2.ListWorkersRequest(), timeout=5
        )
    assert not answer.alarms, answer.alarms
