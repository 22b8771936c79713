"""A SQLAlchemy dialect over ``txsync.dbapi``: SQLAlchemy Core, and what is built on it
(``pandas.read_sql`` and ``DataFrame.to_sql``), through a TxSync cluster.

    from sqlalchemy import create_engine, text

    engine = create_engine("txsync:///?endpoints=data/cluster.json&dc=dc1")
    with engine.begin() as connection:  # one TxSync transaction, applied at commit
        connection.execute(text("INSERT INTO t (k, v) VALUES (:k, :v)"), [{"k": 1, "v": "a"}])
    with engine.connect() as connection:
        connection.execute(text("SELECT v FROM t")).all()

The URL: ``txsync://HOST:PORT/`` (one DC's store; the client fails over to the others it
is told of) or ``txsync:///?endpoints=...`` (anything ``Client`` takes: a cluster file,
``dc1=HOST:PORT,...``, a DNS name), with ``dc=``, ``timeout=`` and ``commit_timeout=``
(seconds) as query parameters; ``$TXSYNC_TOKEN`` and the ``$TXSYNC_TLS_*`` variables as
for every client. The dialect is registered as ``txsync`` (an entry point), so
``create_engine`` finds it once the package is installed.

SQL is compiled as for SQLite (``?`` parameters, SQLite's types and quoting), which
PostgreSQL workers also take for the plain statements Core makes. What TxSync changes
is ``txsync.dbapi``'s: writes are collected and submitted as one transaction at commit
(``engine.begin()``), reads run at once on a worker and never see the uncommitted writes
of their own transaction, and ``rowcount`` of a write is known only after the commit.
Reflection is limited to ``has_table`` (which ``create_all`` and ``to_sql`` ask); the
rest (columns, keys, indexes) is not offered, so describe tables in Python or SQL.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from sqlalchemy import exc
from sqlalchemy.dialects.sqlite.base import SQLiteDialect
from sqlalchemy.engine import URL, Connection
from sqlalchemy.engine.interfaces import IsolationLevel

from txsync import dbapi


class TxSyncDialect(SQLiteDialect):
    name = "txsync"
    driver = "txsync"
    supports_statement_cache = True
    default_paramstyle = "qmark"
    # A write's count is known at commit, not after its execute (``txsync.dbapi``).
    supports_sane_rowcount = False
    supports_sane_multi_rowcount = False
    # One statement per row through executemany, not multi-row VALUES with RETURNING:
    # RETURNING rows of a write never come back (the write runs at commit).
    use_insertmanyvalues = False
    insert_returning = update_returning = delete_returning = False
    postfetch_lastrowid = False

    @classmethod
    def import_dbapi(cls) -> ModuleType:
        return dbapi

    def __init__(self, **kwargs: Any) -> None:
        # SQLiteDialect reads the sqlite3 module's version when given a DB-API module:
        # give it none, and set what it would have found for a current SQLite.
        module = kwargs.pop("dbapi", None)
        super().__init__(**kwargs)
        self.dbapi = module
        self.loaded_dbapi = module

    def create_connect_args(self, url: URL) -> tuple[list[Any], dict[str, Any]]:
        query = dict(url.query)
        options: dict[str, Any] = {}
        endpoints = query.pop("endpoints", None)
        if url.host:
            endpoints = f"{url.host}:{url.port}" if url.port else url.host
        if endpoints is not None:
            options["endpoints"] = str(endpoints)
        if "dc" in query:
            options["dc"] = str(query.pop("dc"))
        for name in ("timeout", "commit_timeout"):
            if name in query:
                options[name] = float(str(query.pop(name)))
        if query:
            raise ValueError(
                f"unknown URL parameters {sorted(query)}: txsync takes endpoints, dc, "
                "timeout and commit_timeout"
            )
        return [], options

    def _get_server_version_info(self, connection: Connection) -> tuple[int, ...]:
        return (3, 45, 0)  # what SQLite features the compiler may use; workers run 3.40+

    def get_isolation_level(self, dbapi_connection: Any) -> IsolationLevel:
        return "SERIALIZABLE"  # one agreed order of whole transactions

    def set_isolation_level(self, dbapi_connection: Any, level: IsolationLevel | None) -> None:
        if level not in (None, "SERIALIZABLE", "AUTOCOMMIT"):
            raise exc.ArgumentError(f"txsync transactions are serializable, not {level}")

    def do_ping(self, dbapi_connection: Any) -> bool:
        return True  # the client fails over by itself; no connection to go stale

    def on_connect(self) -> None:
        return None  # SQLite's own sets PRAGMAs and functions on a sqlite3 connection

    def has_table(
        self,
        connection: Connection,
        table_name: str,
        schema: str | None = None,
        **kw: Any,
    ) -> bool:
        """Whether a read of the table succeeds at a worker (SQLite or PostgreSQL)."""
        quoted = self.identifier_preparer.quote_identifier(table_name)
        try:
            connection.exec_driver_sql(f"SELECT 1 FROM {quoted} WHERE 1 = 0")
        except exc.DBAPIError as error:
            if "no such table" in str(error) or "does not exist" in str(error):
                return False  # SQLite's words, PostgreSQL's
            raise
        return True
