"""A digest of the rows each transaction touched (SQLite workers with ``--touched-digest
1``), so that replicas whose data differ are caught at the transaction that made them
differ (issue 48). Off by default: it costs 25-35% of the apply throughput (docs/workers.md).

The state digest chains statements, verdicts and rows affected; it cannot see values. A
value that differs between replicas (a clock the guard missed, a row edited behind the
worker's back) was caught only by the content check, every 10,000 positions: at 100
transactions a second, up to 100 s later and after every later transaction had built on
it. Here the worker's connection puts three temporary triggers on every user table with
rowids (``_txsync_touch_ins_<table>``, ``_upd_``, ``_del_``) that tell ``_txsync_touched``
the rowid each insert, update or delete touched; after the transaction's statements the
worker reads those rows back as they now are and hashes them, a deleted one as absent
(``TouchedRows.digest``). Dispatch compares each follower's digest with the testing
worker's at the same position, and a worker that differs is out of sync at once.

The digest travels beside the state digest (``Outcome.touched_digest``), not inside it:
workers of an earlier version, which send none, still agree on the state digest, so a
DC can run mixed versions while its workers are upgraded one by one. The triggers are
temporary (the connection's own, in ``temp``): the database file, its schema and its
snapshots do not change, and another connection (the ``sqlite3`` shell, a test editing
the file) writes without them. They reference nothing but the rowid, so they never stand
in the way of the user's schema changes (``ALTER TABLE ... DROP COLUMN`` included), and
they are made again after any transaction that creates or alters a table (a renamed
table keeps its triggers, whose text names the old one). A table without rowids
(``WITHOUT ROWID``) or a virtual table has none: its rows are covered by the content
check alone. The guard lets only these triggers call ``_txsync_touched``
(``sqlite_guard``), and a user statement may drop them only with their table.
"""

from __future__ import annotations

import hashlib
import sqlite3

TOUCH_FUNCTION = "_txsync_touched"
TRIGGER_PREFIX = "_txsync_touch_"
READ_BACK_CHUNK = 500
"""Rowids read back per statement (SQLite allows 32,766 parameters)."""

_ROWID_TABLES = (
    "SELECT name FROM pragma_table_list WHERE schema = 'main' AND type = 'table' AND wr = 0 "
    "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND name NOT LIKE '\\_txsync\\_%' ESCAPE '\\' "
    "ORDER BY name"
)
_OUR_TRIGGERS = (
    "SELECT name FROM temp.sqlite_master WHERE type = 'trigger' "
    "AND name LIKE '\\_txsync\\_touch\\_%' ESCAPE '\\'"
)


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class TouchedRows:
    """The rows a transaction touched, by table, and their digest."""

    def __init__(self) -> None:
        self.rows: dict[str, set[int]] = {}

    def install(self, conn: sqlite3.Connection) -> None:
        conn.create_function(TOUCH_FUNCTION, 2, self._touched)

    def _touched(self, table: str, rowid: int) -> None:
        self.rows.setdefault(table, set()).add(rowid)

    def clear(self) -> None:
        self.rows = {}

    def digest(self, conn: sqlite3.Connection) -> bytes:
        """SHA-256 of every touched row as it is now (tables by name, rows by rowid), a
        row no longer there as absent; the worker's own reads, outside any budget (they
        are as many as the rows the statements changed)."""
        sha = hashlib.sha256()
        for table in sorted(self.rows):
            rowids = sorted(self.rows[table])
            sha.update(f"{table}\n".encode())
            quoted = _quoted(table)
            try:
                if len(rowids) == 1:  # the common case: a point lookup, no IN list
                    row = conn.execute(
                        f"SELECT rowid, * FROM main.{quoted} WHERE rowid = ?", rowids
                    ).fetchone()
                    sha.update(repr(row or (rowids[0], "absent")).encode())
                    continue
                for start in range(0, len(rowids), READ_BACK_CHUNK):
                    chunk = rowids[start : start + READ_BACK_CHUNK]
                    marks = ",".join("?" * len(chunk))
                    found = {
                        row[0]: row
                        for row in conn.execute(
                            f"SELECT rowid, * FROM main.{quoted} WHERE rowid IN ({marks})",
                            chunk,
                        )
                    }
                    for rowid in chunk:
                        sha.update(repr(found.get(rowid, (rowid, "absent"))).encode())
            except sqlite3.Error as error:  # the table is gone: alike everywhere
                sha.update(f"unreadable: {error}\n".encode())
        return sha.digest()


def make_triggers(conn: sqlite3.Connection) -> None:
    """Drop the connection's touch triggers and make them anew for every user table with
    rowids (when the connection opens, and after a transaction created or altered a
    table)."""
    for (name,) in conn.execute(_OUR_TRIGGERS).fetchall():
        conn.execute(f"DROP TRIGGER IF EXISTS temp.{_quoted(name)}")
    for (table,) in conn.execute(_ROWID_TABLES).fetchall():
        label = "'" + table.replace("'", "''") + "'"
        target = "main." + _quoted(table)
        for kind, event, calls in (
            ("ins", "INSERT", f"SELECT {TOUCH_FUNCTION}({label}, NEW.rowid);"),
            (
                "upd",
                "UPDATE",
                f"SELECT {TOUCH_FUNCTION}({label}, NEW.rowid); SELECT {TOUCH_FUNCTION}"
                f"({label}, OLD.rowid) WHERE OLD.rowid IS NOT NEW.rowid;",
            ),
            ("del", "DELETE", f"SELECT {TOUCH_FUNCTION}({label}, OLD.rowid);"),
        ):
            trigger = _quoted(f"{TRIGGER_PREFIX}{kind}_{table}")
            conn.execute(
                f"CREATE TEMP TRIGGER {trigger} AFTER {event} ON {target} BEGIN {calls} END"
            )
