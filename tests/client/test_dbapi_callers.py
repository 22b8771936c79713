"""What speaks DB-API, against a real 3-DC cluster: SQLAlchemy Core through the
``txsync`` dialect (``create_engine``, tables described in Python, inserts, selects,
``text``), and pandas (``read_sql`` with an engine or a bare DB-API connection,
``DataFrame.to_sql``)."""

from __future__ import annotations

import uuid
import warnings
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    exc,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import Engine

from txsync import dbapi
from txsync.sqlalchemy_dialect import TxSyncDialect


def _engine(cluster_file: Path, dc: str = "dc1") -> Engine:
    return create_engine(f"txsync:///?endpoints={cluster_file}&dc={dc}&timeout=60")


def test_sqlalchemy_core_writes_in_one_transaction_and_reads_them_back(
    cluster_file: Path,
) -> None:
    engine = _engine(cluster_file, "dc2")
    assert isinstance(engine.dialect, TxSyncDialect), "found by its entry point"
    metadata = MetaData()
    accounts = Table(
        f"accounts_{uuid.uuid4().hex[:8]}",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("owner", String(40), nullable=False),
        Column("balance", Integer, nullable=False),
    )
    with engine.begin() as connection:
        metadata.create_all(connection)
    with engine.begin() as connection:
        assert engine.dialect.has_table(connection, accounts.name)
        assert not engine.dialect.has_table(connection, "no_such_table_here")
        connection.execute(
            insert(accounts),
            [{"id": 1, "owner": "ann", "balance": 10}, {"id": 2, "owner": "bob", "balance": 5}],
        )
        connection.execute(
            update(accounts).where(accounts.c.id == 2).values(balance=accounts.c.balance + 1)
        )
        seen = connection.execute(select(accounts)).all()
        assert seen == [], "a read inside the transaction does not see its writes"
    with engine.connect() as connection:
        rows = connection.execute(select(accounts).order_by(accounts.c.id)).all()
        assert [tuple(r) for r in rows] == [(1, "ann", 10), (2, "bob", 6)]
        named = connection.execute(
            text(f"SELECT owner FROM {accounts.name} WHERE balance > :least"), {"least": 7}
        )
        assert named.scalars().all() == ["ann"]
    with pytest.raises(exc.IntegrityError), engine.begin() as connection:
        connection.execute(insert(accounts), {"id": 1, "owner": "again", "balance": 0})
    engine.dispose()


def test_the_url_names_what_the_client_takes(cluster_file: Path) -> None:
    dialect = TxSyncDialect()
    url = _engine(cluster_file).url
    assert dialect.create_connect_args(url) == (
        [],
        {"endpoints": str(cluster_file), "dc": "dc1", "timeout": 60.0},
    )
    with pytest.raises(ValueError, match=r"unknown URL parameters \['tls'\]"):
        dialect.create_connect_args(create_engine("txsync://h:7101/?tls=1").url)
    assert dialect.create_connect_args(create_engine("txsync://h:7101/").url) == (
        [],
        {"endpoints": "h:7101"},
    )


def test_pandas_reads_and_writes_through_the_engine_and_the_connection(
    cluster_file: Path,
) -> None:
    engine = _engine(cluster_file, "dc3")
    name = f"frame_{uuid.uuid4().hex[:8]}"
    frame = pd.DataFrame({"k": [1, 2, 3], "v": ["a", "b", "c"], "x": [0.5, 1.5, 2.5]})
    frame.to_sql(name, engine, index=False)
    read = pd.read_sql(f"SELECT k, v, x FROM {name} ORDER BY k", engine)
    pd.testing.assert_frame_equal(read, frame)
    frame.iloc[:1].assign(k=4).to_sql(name, engine, index=False, if_exists="append")
    connection = dbapi.connect(str(cluster_file), dc="dc3")  # where to_sql waited: OK
    try:
        with warnings.catch_warnings():
            # pandas names only sqlite3 among bare DB-API connections; it reads the rest
            # through the PEP's cursor all the same.
            warnings.simplefilter("ignore", UserWarning)
            # (pandas-stubs too: their overloads name sqlite3's connection only.)
            bare = pd.read_sql(  # type: ignore[call-overload]
                f"SELECT k FROM {name} WHERE k > ? ORDER BY k", connection, params=(1,)
            )
        assert bare["k"].tolist() == [2, 3, 4]
    finally:
        connection.close()
    engine.dispose()
