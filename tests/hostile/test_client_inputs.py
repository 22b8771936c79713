"""Hostile inputs over the client API against real processes (issues 17 and 48): one DC
with two SQLite workers (``one_dc``). Each case must end in a clear error or a FAILED
verdict naming why, and after it the DC must apply the next transaction, with both
workers healthy and in sync. The cases are the probes that once stopped or split every
DC, and the limits of every field."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from tests.hostile.one_dc import CONTENT_CHECK_EVERY, FAILED, OK, WAIT_S, Dc, one_dc
from txsync.v1 import (
    client_pb2,
    common_pb2,
)
from txsync.worker.transactions import param_from_proto

pytestmark = pytest.mark.under_load  # a busy machine: see tests/conftest.py

UNKNOWN = common_pb2.TxState.ValueType(99)
"""A state no version of the protocol defines."""


@pytest.fixture(scope="module")
def dc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dc]:
    limits = ("--steps-max", "20000000", "--growth-bytes-max", str(8 * 1024 * 1024))
    with one_dc(tmp_path_factory.mktemp("hostile"), *limits) as dc:
        yield dc


FAILED_WITH = [
    # (statements, words the FAILED verdict's error must hold)
    ((
        "INSERT INTO t WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) "
        "SELECT x FROM c WHERE x < 0",
    ), "work budget of 20,000,000 SQLite steps (worker --steps-max)"),
    (("INSERT INTO t VALUES (zeroblob(100000000))",), "too big"),
    (("INSERT INTO t WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c "
      "WHERE x < 5) SELECT zeroblob(3000000) FROM c",), "worker --growth-bytes-max"),
    # One LIKE of a 3 MB string and an 8,000-character pattern ran 51 s inside a single
    # SQLite step, where the step budget never looked (issue 48).
    (("INSERT INTO t VALUES (printf('%.*c', 3156536, 'a') LIKE "
      "'%' || printf('%.*c', 8000, 'a') || 'b')",), "like() of 8,002 and 3,156,536"),
    (("INSERT INTO t VALUES (replace(printf('%.*c', 3000000, 'a'), "
      "printf('%.*c', 20000, 'a') || 'b', ''))",), "replace() of 3,000,000 and 20,001"),
    (("CREATE TRIGGER skipper AFTER UPDATE ON _txsync_applied WHEN NEW.position=21 "
      "BEGIN UPDATE _txsync_applied SET position=position+2; END",), "bookkeeping"),
    (("ALTER TABLE _txsync_outcomes ADD COLUMN z",), "bookkeeping"),
    (("CREATE INDEX i ON _txsync_outcomes (tx_id)",), "bookkeeping"),
    (('UPDATE "_TXSYNC_APPLIED" SET position = 99',), "bookkeeping"),
    (("CREATE VIEW peek AS SELECT 1", "INSERT INTO t SELECT error FROM _txsync_outcomes"),
     "bookkeeping"),
    (("/* x */ COMMIT",), "not allowed"),
    (("SAVEPOINT s",), "not allowed"),
    (("ATTACH DATABASE ':memory:' AS other",), "not allowed"),
    (("PRAGMA writable_schema=ON",), "not allowed"),
    (("CREATE TEMP TABLE scratch (a)",), "not allowed"),
    (("SELECT load_extension('x')",), "not allowed"),
    (("INSERT INTO t VALUES (date('2024-01-01', 'localtime'))",), "time zone"),
    # SQLite picks random rowids for later inserts once the largest is taken.
    (("CREATE TABLE r1 (v)", "INSERT INTO r1 (rowid, v) VALUES (9223372036854775807, 'x')"),
     "random rowids"),
    (("CREATE TABLE r2 (id INTEGER PRIMARY KEY, v)", "INSERT INTO r2 VALUES (5, 'x')",
      "UPDATE r2 SET id = 9223372036854775807 WHERE id = 5"), "random rowids"),
]  # fmt: skip


@pytest.mark.parametrize(("statements", "words"), FAILED_WITH)
def test_a_hostile_transaction_fails_alone(dc: Dc, statements: tuple[str, ...], words: str) -> None:
    dc.fails_alone(statements, words)


WITH_ROWS = [
    ("INSERT INTO t VALUES ('returned') RETURNING v",),
    ("INSERT INTO t VALUES ('a'), ('b') RETURNING *", "SELECT * FROM t"),
    ("UPDATE t SET v = v WHERE v = 'a' RETURNING rowid",),
]


@pytest.mark.parametrize("statements", WITH_ROWS)
def test_statements_with_rows_apply_like_any_other(dc: Dc, statements: tuple[str, ...]) -> None:
    """RETURNING, which applications and ORMs emit, once left every DC's pipeline
    restarting for ever ("cannot release savepoint - SQL statements in progress")."""
    answer = dc.submit(*statements)
    assert answer.state == OK, answer
    dc.healthy_and_applying()


def test_a_table_the_content_check_cannot_read_does_not_stop_the_dc(dc: Dc) -> None:
    """A generated column whose expression fails on a row already stored: OK when made,
    and the content check (every few positions here) once raised at every worker and
    stopped every DC for good. It now counts the table's error, alike everywhere."""
    answer = dc.submit(
        "CREATE TABLE bomb (a)",
        "INSERT INTO bomb VALUES ('not json')",
        "ALTER TABLE bomb ADD COLUMN b AS (json(a))",
    )
    assert answer.state == OK, answer
    for _ in range(CONTENT_CHECK_EVERY + 1):  # past a content check at least once
        dc.healthy_and_applying()
    assert dc.submit("DROP TABLE bomb").state == OK


NONDETERMINISTIC = [
    "INSERT INTO t VALUES (random/**/())",
    "INSERT INTO t VALUES (strftime('%f'))",
    "INSERT INTO t VALUES (date())",
    "INSERT INTO t VALUES (unixepoch())",
    "CREATE TABLE stamped (k, at DEFAULT CURRENT_TIMESTAMP)",
]


@pytest.mark.parametrize("sql", NONDETERMINISTIC)
def test_nondeterminism_is_refused_at_submit_or_failed(dc: Dc, sql: str) -> None:
    """Refused at submit (INVALID_ARGUMENT) where the store's early check sees it, else
    FAILED by the worker's guard: either way no replica applies it."""
    try:
        answer = dc.submit(sql)
    except grpc.RpcError as error:
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "replica" in (error.details() or ""), error.details()
    else:
        assert answer.state == FAILED and "replica" in answer.outcome.error, answer
    dc.healthy_and_applying()


def test_the_current_time_is_the_transactions_own_at_both_workers(dc: Dc) -> None:
    """Issue 48: the blob 'now' in a DEFAULT once wrote a different time at each worker.
    With the body's time (``now_unix_us``, as the client library sets it) every clock
    read answers that time: both workers write the same rows (their touched digests
    agree, or the follower would be out of sync) and the value is the body's time."""
    answer = dc.submit(
        "CREATE TABLE clock (k, at DEFAULT CURRENT_TIMESTAMP, "
        "ms DEFAULT (strftime('%H:%M:%f', X'6E6F77')))",
        "INSERT INTO clock (k) VALUES (1)",
        "INSERT INTO clock VALUES (2, date('no' || 'w' || char(0)), julianday())",
        now_unix_us=1_700_000_000_123_456,
    )
    assert answer.state == OK, answer
    dc.healthy_and_applying()
    rows = dc.client.Query(
        client_pb2.QueryRequest(statement=common_pb2.Statement(sql="SELECT * FROM clock")),
        timeout=WAIT_S,
    ).rows
    assert [tuple(map(param_from_proto, row.values)) for row in rows] == [
        (1, "2023-11-14 22:13:20", "22:13:20.123"),
        (2, "2023-11-14", 2460263.4259273494),
    ]
    assert dc.submit("DROP TABLE clock").state == OK


def _call(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    error: grpc.RpcError = caught.value
    return error


def _body(sql: str, params: int = 0) -> common_pb2.TxBody:
    statement = common_pb2.Statement(sql=sql)
    statement.params.extend(common_pb2.SqlValue(int_value=n) for n in range(params))
    return common_pb2.TxBody(statements=[statement])


def test_bad_fields_are_clear_errors(dc: Dc) -> None:
    client = dc.client
    cases: list[tuple[Callable[[], object], grpc.StatusCode, str]] = [
        (lambda: client.Submit(client_pb2.SubmitRequest(body=_body("SELECT ?", params=5000))),
         grpc.StatusCode.INVALID_ARGUMENT, "params"),
        (lambda: client.Submit(client_pb2.SubmitRequest(
            body=common_pb2.TxBody(statements=[common_pb2.Statement(sql="x" * 5_000_000)]))),
         grpc.StatusCode.INVALID_ARGUMENT, "more than 4194304"),
        (lambda: client.Submit(client_pb2.SubmitRequest(body=common_pb2.TxBody())),
         grpc.StatusCode.INVALID_ARGUMENT, "statement"),
        (lambda: client.Submit(client_pb2.SubmitRequest(body=_body("SELECT 1"), wait_for=UNKNOWN)),
         grpc.StatusCode.INVALID_ARGUMENT, "wait_for"),
        (lambda: client.Submit(client_pb2.SubmitRequest(
            body=_body("SELECT 1"), idempotency_key="k" * 129)),
         grpc.StatusCode.INVALID_ARGUMENT, "idempotency_key"),
        (lambda: client.Get(client_pb2.GetRequest(tx_id="../../etc/passwd")),
         grpc.StatusCode.INVALID_ARGUMENT, "tx_id"),
        (lambda: client.Get(client_pb2.GetRequest(tx_id=str(uuid.uuid4()))),
         grpc.StatusCode.NOT_FOUND, ""),
        (lambda: client.Wait(client_pb2.WaitRequest(
            tx_id=str(uuid.uuid4()), state=OK, timeout=Duration(seconds=10**9))),
         grpc.StatusCode.INVALID_ARGUMENT, "timeout"),
        (lambda: client.Wait(client_pb2.WaitRequest(
            tx_id=str(uuid.uuid4()), state=OK, timeout=Duration(seconds=-5))),
         grpc.StatusCode.INVALID_ARGUMENT, "timeout"),
        (lambda: client.Query(client_pb2.QueryRequest(
            statement=common_pb2.Statement(sql="DELETE FROM t"))),
         grpc.StatusCode.INVALID_ARGUMENT, ""),
    ]  # fmt: skip
    for call, code, words in cases:
        error = _call(call)
        assert error.code() is code, (error.code(), error.details())
        assert words in (error.details() or ""), error.details()
    dc.healthy_and_applying()


def test_one_key_two_bodies_is_refused(dc: Dc) -> None:
    key = f"key-{uuid.uuid4()}"
    first = dc.submit("INSERT INTO t VALUES ('first')", key=key)
    assert first.state == OK
    error = _call(lambda: dc.submit("INSERT INTO t VALUES ('second')", key=key))
    assert error.code() is grpc.StatusCode.ALREADY_EXISTS
    assert first.tx_id in (error.details() or "")
    assert dc.submit("INSERT INTO t VALUES ('first')", key=key).tx_id == first.tx_id
    dc.healthy_and_applying()


def test_many_concurrent_waits_do_not_stop_the_dc(dc: Dc) -> None:
    """500 calls wait at once on transactions that never come, while the DC applies."""
    never = [str(uuid.uuid4()) for _ in range(500)]
    waiting = [
        dc.client.Wait.future(
            client_pb2.WaitRequest(tx_id=tx_id, state=OK, timeout=Duration(seconds=15)),
            timeout=WAIT_S,
        )
        for tx_id in never
    ]
    dc.healthy_and_applying()
    assert not any(w.result().reached for w in waiting)
    dc.healthy_and_applying()


def test_reads_are_bounded_too(dc: Dc) -> None:
    request = client_pb2.QueryRequest(
        statement=common_pb2.Statement(
            sql="WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) "
            "SELECT count(*) FROM c"
        )
    )
    error = _call(lambda: dc.client.Query(request, timeout=WAIT_S))
    assert "work budget" in (error.details() or ""), error.details()
    like = client_pb2.QueryRequest(
        statement=common_pb2.Statement(
            sql="SELECT printf('%.*c', 3156536, 'a') LIKE '%' || printf('%.*c', 8000, 'a') || 'b'"
        )
    )
    error = _call(lambda: dc.client.Query(like, timeout=WAIT_S))
    assert "like() of 8,002 and 3,156,536 characters" in (error.details() or ""), error.details()
    dc.healthy_and_applying()
