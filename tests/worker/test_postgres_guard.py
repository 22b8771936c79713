"""The PostgreSQL guard (issue 17) on a real PostgreSQL server: user statements run as a
role without rights on the bookkeeping, after PostgreSQL's own parser has refused what
could end the transaction, change the role, run SQL given as a string, or answer
differently at each replica. Each probe is a transaction of its own; each must end
FAILED, change nothing, and let the next transaction apply."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.postgres import PostgresServer
from txsync.worker.backend import QueryRefused
from txsync.worker.outcomes import Outcome
from txsync.worker.postgres_backend import PostgresBackend
from txsync.worker.transactions import Statement, Transaction, transaction


def _body(*sql: str) -> Transaction:
    return transaction(*sql)


REFUSED_BY_THE_PARSER = [
    "/* x */ COMMIT",
    "ROLLBACK",
    "SAVEPOINT s",
    "SELECT 1; COMMIT",
    "DO $$ BEGIN EXECUTE 'DELETE FROM _txs' || 'ync.outcomes'; END $$",
    "CALL p()",
    "RESET ROLE",
    "SET ROLE postgres",
    "SET SESSION AUTHORIZATION DEFAULT",
    "SELECT set_config('role', 'postgres', true)",
    "SELECT query_to_xml('SELECT * FROM _txsync.outcomes', true, true, '')",
    "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "CREATE TRIGGER tr AFTER INSERT ON t FOR EACH ROW EXECUTE FUNCTION f()",
    "COPY t TO PROGRAM 'true'",
    "GRANT ALL ON SCHEMA _txsync TO PUBLIC",
    "SELECT pg_sleep(60)",
    "INSERT INTO t VALUES (now())",
    "INSERT INTO t VALUES (random())",
    "INSERT INTO t VALUES (pg_catalog.random())",
    "INSERT INTO t VALUES (CURRENT_TIMESTAMP)",
    "INSERT INTO t VALUES ('now'::timestamptz)",
    "INSERT INTO t VALUES (' Today '::date)",
    "INSERT INTO t SELECT gen_random_uuid()::text",
    "INSERT INTO t SELECT age('2000-01-01'::timestamp)::text",
    "CREATE TABLE later (at timestamptz DEFAULT now())",
    # issue 48: sequences behind the scenes, the server's own ids, session state
    "CREATE TABLE s1 (id serial, v text)",
    "CREATE TABLE s2 (id int GENERATED ALWAYS AS IDENTITY, v text)",
    "ALTER TABLE t ADD COLUMN id bigserial",
    "CREATE SEQUENCE s",
    "CREATE TABLE o (a oid)",
    "CREATE TEMP TABLE scratch (a int)",
    "CREATE UNLOGGED TABLE fast (a int)",
    "INSERT INTO t SELECT ctid::text FROM t",
    "INSERT INTO t SELECT xmin::text FROM t",
    "INSERT INTO t VALUES ('t'::regclass::oid::text)",
    "INSERT INTO t SELECT pg_current_wal_lsn()::text",
    "INSERT INTO t SELECT pg_relation_size('t')::text",
    "INSERT INTO t SELECT lo_from_bytea(0, 'x')::text",
    "SELECT pg_advisory_lock(1)",
]
REFUSED_BY_PRIVILEGES = [
    "UPDATE _txsync.applied SET position = 99",
    'UPDATE U&"\\005Ftxsync".applied SET position = 99',
    'DELETE FROM "_txsync"."outcomes"',
    "INSERT INTO t SELECT error FROM _txsync.outcomes",
    "ALTER TABLE _txsync.outcomes ADD COLUMN z int",
    "CREATE INDEX i ON _txsync.outcomes (tx_id)",
    "DROP TABLE _txsync.outcomes",
    "CREATE TABLE _txsync.mine (a int)",
]


@pytest.fixture
def backend(postgres: PostgresServer) -> PostgresBackend:
    backend = PostgresBackend(postgres.new_database(), statement_timeout_ms=1000)
    assert backend.apply(1, "tx1", _body("CREATE TABLE t (v text)")).ok
    assert backend.apply(2, "tx2", _body("INSERT INTO t VALUES ('before')")).ok
    return backend


def _probe(backend: PostgresBackend, sql: str) -> Outcome:
    before = backend.applied()
    outcome = backend.apply(before.position + 1, "probe", _body("INSERT INTO t VALUES ('x')", sql))
    assert not outcome.ok, f"{sql!r} was applied"
    assert backend.applied().position == before.position + 1
    rows = backend.query(Statement("SELECT v FROM t ORDER BY v"), 10).rows
    assert rows == (("before",),), "the refused transaction left no trace"
    following = backend.apply(before.position + 2, "next", _body("DELETE FROM t WHERE v = 'y'"))
    assert following.ok, following.error
    return outcome


@pytest.mark.parametrize("sql", REFUSED_BY_THE_PARSER)
def test_the_parser_refuses_what_would_escape_or_differ(backend: PostgresBackend, sql: str) -> None:
    outcome = _probe(backend, sql)
    assert outcome.error.startswith("refused: "), outcome.error


@pytest.mark.parametrize("sql", REFUSED_BY_PRIVILEGES)
def test_the_bookkeeping_is_out_of_reach_by_privilege(backend: PostgresBackend, sql: str) -> None:
    outcome = _probe(backend, sql)
    assert "permission denied" in outcome.error or "must be owner" in outcome.error


def test_sequences_are_refused_where_they_would_differ(backend: PostgresBackend) -> None:
    """A sequence advances in a transaction the testing worker failed, but not at the
    workers that only record the failure: nextval(), serial and identity columns, and
    sequences themselves are refused."""
    outcome = _probe(backend, "INSERT INTO t SELECT nextval('s')::text")
    assert "nextval()" in outcome.error
    outcome = _probe(backend, "CREATE TABLE ids (id serial)")
    assert "column id serial: its values come from a sequence" in outcome.error


def test_a_statement_past_the_time_limit_fails_naming_it(backend: PostgresBackend) -> None:
    outcome = _probe(backend, "SELECT count(*) FROM generate_series(1, 10000000000)")
    assert "limit of 1,000 ms (worker --statement-timeout-ms" in outcome.error


def test_the_time_limit_covers_the_whole_transaction(backend: PostgresBackend) -> None:
    """Each statement well within the limit, all of them together far past it: a limit
    per statement let a transaction of many such statements hold every worker."""
    many = ["SELECT count(*) FROM generate_series(1, 200000)"] * 500
    position = backend.applied().position
    outcome = backend.apply(position + 1, "long", _body(*many))
    assert not outcome.ok
    assert "for all its statements together" in outcome.error, outcome.error


def test_the_clock_word_as_a_parameter_is_refused(backend: PostgresBackend) -> None:
    body = transaction(Statement("INSERT INTO t VALUES (?::timestamptz::text)", ("now",)))
    outcome = backend.apply(3, "tx3", body)
    assert not outcome.ok and "refused: the parameter 'now'" in outcome.error


def test_reads_run_as_the_role_and_may_use_the_clock(backend: PostgresBackend) -> None:
    assert backend.query(Statement("SELECT now() IS NOT NULL"), 1).rows == ((True,),)
    for sql, words in (
        ("SELECT * FROM _txsync.outcomes", "permission denied"),
        ("SELECT pg_read_file('/etc/passwd')", "refused"),
        ("DELETE FROM t", "refused"),
    ):
        with pytest.raises(QueryRefused, match=words):
            backend.query(Statement(sql), 1)


def test_a_restored_snapshot_keeps_the_guard(
    backend: PostgresBackend, postgres: PostgresServer, tmp_path: Path
) -> None:
    """After a snapshot copy the tables belong to the role again, and the bookkeeping
    stays out of its reach."""
    dump = tmp_path / "snapshot.dump"
    backend.export_snapshot(dump)
    copy = PostgresBackend(postgres.new_database())
    restored = copy.replace_with(dump)
    assert restored.position == 2
    assert copy.apply(3, "tx3", _body("ALTER TABLE t ADD COLUMN w int")).ok
    refused = copy.apply(4, "tx4", _body("DELETE FROM _txsync.outcomes"))
    assert not refused.ok and "permission denied" in refused.error
