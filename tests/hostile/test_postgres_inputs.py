"""Issue 48's PostgreSQL probes through real processes: one DC whose two workers apply
to PostgreSQL (``one_dc``; two databases on the suite's server). Each probe once left a
transaction unappliable (an error the worker did not turn into a verdict, so every
DC's pipeline restarted for ever), broke the server for later transactions, or let the
two workers write different values. Each must now end in a clear error or FAILED,
with both workers healthy, in sync, and applying the next transaction."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from tests.hostile.one_dc import FAILED, OK, WAIT_S, Dc, one_dc
from tests.support.postgres import PostgresServer
from txsync.v1 import client_pb2, common_pb2

pytestmark = pytest.mark.under_load  # a busy machine: see tests/conftest.py


@pytest.fixture(scope="module")
def dc(tmp_path_factory: pytest.TempPathFactory, postgres: PostgresServer) -> Iterator[Dc]:
    databases = (postgres.new_database(), postgres.new_database())
    root = tmp_path_factory.mktemp("hostile-postgres")
    with one_dc(root, "--statement-timeout-ms", "2000", postgres=databases) as dc:
        yield dc


FAILED_WITH = [
    # (statements, words the FAILED verdict's error must hold)
    # the session kept its locks: every later transaction failed "out of shared memory"
    (("SELECT count(pg_advisory_lock(g)) FROM generate_series(1, 200000) g",),
     "pg_advisory_lock() is not allowed"),
    # a sequence advanced at the testing worker only, in a transaction it FAILED
    (("CREATE TABLE s1 (id serial, v text)",), "serial"),
    (("CREATE TABLE s2 (id int GENERATED ALWAYS AS IDENTITY, v text)",), "IDENTITY"),
    # the server's own ids, different at each worker
    (("INSERT INTO t SELECT xmin::text FROM t",), "xmin"),
    (("INSERT INTO t VALUES ('t'::regclass::oid::text)",), "refused"),
    (("CREATE TEMP TABLE scratch (a int)",), "refused"),
    # ten statements of 0.5 s each under a 2 s limit: the limit covers them all
    (("SELECT pg_catalog.count(*) FROM generate_series(1, 3000000)",) * 10,
     "for all its statements together"),
]  # fmt: skip


@pytest.mark.parametrize(("statements", "words"), FAILED_WITH)
def test_a_hostile_transaction_fails_alone(dc: Dc, statements: tuple[str, ...], words: str) -> None:
    dc.fails_alone(statements, words)


def test_a_placeholder_psycopg_cannot_fill_is_a_verdict(dc: Dc) -> None:
    """``'%(x)s'`` with one parameter: psycopg raised TypeError, which escaped the
    apply."""
    statement = common_pb2.Statement(
        sql="SELECT '%(x)s'", params=[common_pb2.SqlValue(int_value=1)]
    )
    answer = dc.submit_body(common_pb2.TxBody(statements=[statement]))
    assert answer.state == FAILED, answer
    assert "TypeError" in answer.outcome.error, answer.outcome.error
    dc.healthy_and_applying()


def test_a_key_postgresql_cannot_store_is_refused_at_submit(dc: Dc) -> None:
    """A NUL in an idempotency key made psycopg raise DataError at every worker."""
    with pytest.raises(grpc.RpcError) as refused:
        dc.submit("INSERT INTO t VALUES ('keyed')", key="a\0b")
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "NUL" in (refused.value.details() or "")
    dc.healthy_and_applying()


def test_returning_applies_like_any_other(dc: Dc) -> None:
    answer = dc.submit("INSERT INTO t VALUES ('returned') RETURNING v")
    assert answer.state == OK, answer
    dc.healthy_and_applying()


def test_a_big_read_is_cut_while_it_is_built(dc: Dc) -> None:
    """A read's whole result was fetched before it was cut (66 -> 1,243 MB)."""
    request = client_pb2.QueryRequest(
        statement=common_pb2.Statement(
            sql="SELECT g, repeat('x', 1000) FROM generate_series(1, 5000000) g"
        ),
        max_rows=10,
    )
    answer = dc.client.Query(request, timeout=WAIT_S)
    assert len(answer.rows) == 10 and answer.truncated
    dc.healthy_and_applying()
