"""Bounds on what one transaction may cost a SQLite worker (issue 17): a budget of
virtual-machine steps, a cap on value sizes, and a stop that interrupts a running apply.
Each ends in a FAILED verdict that every replica reaches alike, or (at a stop) in no
verdict at all, never in a worker stuck for good."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import grpc
import pytest

from bench.proc_stats import cpu_seconds
from tests.support.processes import worker
from txsync.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from txsync.worker.backend import ApplyInterrupted, QueryRefused, ToApply
from txsync.worker.sqlite_backend import SqliteBackend
from txsync.worker.transactions import (
    Statement,
    Transaction,
    transaction,
    transaction_to_proto,
)

ENDLESS = (
    "INSERT INTO t WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) "
    "SELECT x FROM c WHERE x < 0"
)
"""The statement of issue 17 that stopped every DC: it never ends."""


def _body(*sql: str) -> Transaction:
    return transaction(*sql)


def test_a_statement_over_the_budget_fails_alike_at_every_replica(tmp_path: Path) -> None:
    replicas = [SqliteBackend(tmp_path / f"{n}.db", steps_max=2_000_000) for n in "ab"]
    count_to = "INSERT INTO t WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c "
    history = [
        _body("CREATE TABLE t (x INTEGER)"),
        _body(ENDLESS),
        _body(count_to + "WHERE x < 1000) SELECT x FROM c"),  # well within the budget
        _body(count_to + "WHERE x < 10000000) SELECT x FROM c"),  # far beyond it
        _body("INSERT INTO t VALUES (-1)"),
    ]
    outcomes = [
        [r.apply(n, f"tx{n}", body) for n, body in enumerate(history, start=1)] for r in replicas
    ]
    assert [o.ok for o in outcomes[0]] == [True, False, True, False, True]
    for failed in (outcomes[0][1], outcomes[0][3]):
        assert "work budget of 2,000,000 SQLite steps (worker --steps-max)" in failed.error
    assert [o.state_digest for o in outcomes[0]] == [o.state_digest for o in outcomes[1]]
    count = replicas[0].query(Statement("SELECT count(*) FROM t"), 1)
    assert count.rows == ((1001,),)  # 1..1000 and the last insert: the failures left none


def test_values_past_the_size_cap_fail_and_write_nothing(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "w.db", value_bytes_max=1024 * 1024)
    assert backend.apply(1, "tx1", _body("CREATE TABLE b (v BLOB)")).ok
    outcome = backend.apply(2, "tx2", _body("INSERT INTO b VALUES (zeroblob(100000000))"))
    assert not outcome.ok and "too big" in outcome.error
    assert backend.apply(3, "tx3", _body("INSERT INTO b VALUES (zeroblob(1000))")).ok
    assert (tmp_path / "w.db").stat().st_size < 1024 * 1024


def test_a_read_over_the_budget_is_refused_naming_it(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "w.db", steps_max=1_000_000)
    endless_read = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT x FROM c"
    with pytest.raises(QueryRefused, match="work budget of 1,000,000 SQLite steps"):
        backend.query(Statement(endless_read + " WHERE x < 0"), 10)


def test_interrupt_abandons_a_running_apply_without_a_verdict(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "w.db", steps_max=10**15)
    assert backend.apply(1, "tx1", _body("CREATE TABLE t (x INTEGER)")).ok
    failure: list[BaseException] = []

    def apply_endless() -> None:
        try:
            backend.apply_many([ToApply(2, "tx2", _body(ENDLESS))])
        except BaseException as error:  # what the apply thread ended with
            failure.append(error)

    applying = threading.Thread(target=apply_endless)
    applying.start()
    # Whether the statement has begun or not, the interrupt must end it: a stop flag the
    # progress handler reads, and sqlite3_interrupt for what runs now.
    applying.join(timeout=0.5)
    backend.interrupt()
    applying.join(timeout=60)
    assert not applying.is_alive()
    assert len(failure) == 1 and isinstance(failure[0], ApplyInterrupted), failure
    assert backend.applied().position == 1  # nothing of it committed: no verdict
    backend.close()
    again = SqliteBackend(tmp_path / "w.db", steps_max=1_000_000)  # after the restart
    assert not again.apply(2, "tx2", _body(ENDLESS)).ok


def test_sigterm_stops_a_worker_in_the_middle_of_a_statement(tmp_path: Path) -> None:
    """Issue 17: six workers at 100% CPU ignored SIGTERM; only SIGKILL stopped them."""
    process = worker(tmp_path / "w1", "w1", "--steps-max", str(10**15), "--grace-seconds", "1")
    process.start()
    try:
        with grpc.insecure_channel(process.address) as channel:
            stub = worker_pb2_grpc.WorkerServiceStub(channel)
            table = worker_pb2.ApplyRequest(
                position=1,
                tx_id="tx1",
                body=transaction_to_proto(_body("CREATE TABLE t (x INTEGER)")).SerializeToString(),
            )
            endless = worker_pb2.ApplyRequest(
                position=2,
                tx_id="tx2",
                body=transaction_to_proto(_body(ENDLESS)).SerializeToString(),
            )
            gate = threading.Event()

            def requests() -> object:
                yield table
                gate.wait(60)  # the stream stays open while the endless one runs
                yield endless
                gate.wait(60)

            answers = stub.Apply(requests())  # type: ignore[arg-type]
            assert next(answers).outcome.state == common_pb2.TX_STATE_OK
            assert process.process is not None
            pid = process.process.pid
            before = cpu_seconds(pid)
            gate.set()
            deadline = time.monotonic() + 120
            while cpu_seconds(pid) < before + 1.0:  # the endless statement is running
                assert time.monotonic() < deadline, "the statement never started"
                time.sleep(0.1)
            process.process.send_signal(signal.SIGTERM)
            assert process.process.wait(timeout=60) == 0, process.log()
    finally:
        process.kill()
    assert "stopped cleanly at position 1" in process.log()
