"""What a user's statement may do on a SQLite worker, enforced by the engine (issue 17).

Every replica runs the same statements on the same data and must reach the same state,
and nothing a client sends may reach the worker's own bookkeeping. Filters over the SQL
text cannot promise either (comments, quoting and triggers route around them), so the
rules live where SQLite resolves each statement:

- **The authorizer** sees every table, column, function and action a statement (and any
  trigger or view it fires) resolves to, by canonical name, before it runs. It refuses
  any write to, read of, or trigger, index or ALTER on a ``_txsync_`` object, in every
  argument it is given; transaction control, ATTACH (and VACUUM INTO), PRAGMA and
  temporary objects (they live in one worker's connection: replicas would differ); and
  any function outside ``DETERMINISTIC_FUNCTIONS``.
- **Replacements registered on the connection** cover the routes the authorizer does not
  see (a column's ``DEFAULT (random())`` or ``DEFAULT CURRENT_TIMESTAMP`` is evaluated
  without asking it): the nondeterministic built-ins are overridden by functions that
  refuse; the date and time functions by versions that read the current time (``'now'``,
  no time value, ``CURRENT_TIMESTAMP``, ``CURRENT_DATE``, ``CURRENT_TIME``) as the
  transaction's own (``TxBody.now_unix_us``, set once by the client that made it, so
  every replica reads the same), refuse it when the transaction carries none, refuse
  the machine's time zone (``'localtime'``, ``'utc'``), and otherwise answer exactly as
  SQLite's own.

SQLite reports a refusal only as "not authorized" or "user-defined function raised
exception"; the guard keeps its reason (``refusal``) for the transaction's FAILED verdict.

The authorizer stays installed for the connection's life and judges only while a
transaction's statements run (``start`` .. ``end``). Setting an authorizer expires every
prepared statement, so setting it per transaction made SQLite compile the worker's own
statements again every transaction: most of the apply's CPU, more with the touch
triggers (measured in-process, ``bench.apply_cost``). SQLite asks the authorizer when it
*prepares* a statement, and Python's statement cache reuses prepared statements by their
text, so user SQL runs with ``USER_SQL_SUFFIX`` appended (``user_sql``): no user text
can then be a worker statement's, prepared while the guard did not judge. What the guard
learns at preparation (``written``) is kept across transactions for the same reason.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from txsync.worker.sqlite_touched import TRIGGER_PREFIX

BOOKKEEPING_PREFIX = "_txsync_"

USER_SQL_SUFFIX = "\n/* txsync: a user's statement */"
"""Appended to every user statement (``user_sql``): its cached preparation is never one
of the worker's own statements, which the guard did not judge (module docstring)."""

SqlValue = str | bytes | int | float | None
SqlFunction = Callable[..., SqlValue]

DETERMINISTIC_FUNCTIONS = frozenset({
    "->", "->>", "abs", "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "avg",
    "ceil", "ceiling", "changes", "char", "coalesce", "concat", "concat_ws", "cos", "cosh",
    "count", "cume_dist", "current_date", "current_time", "current_timestamp", "date",
    "datetime", "degrees", "dense_rank", "exp", "first_value",
    "floor", "format", "glob", "group_concat", "hex", "ifnull", "iif", "instr", "json",
    "json_array", "json_array_length", "json_extract", "json_group_array",
    "json_group_object", "json_insert", "json_object", "json_patch", "json_quote",
    "json_remove", "json_replace", "json_set", "json_type", "json_valid", "julianday", "lag",
    "last_insert_rowid", "last_value", "lead", "length", "like", "likelihood", "likely", "ln",
    "log", "log10", "log2", "lower", "ltrim", "max", "min", "mod", "nth_value", "ntile",
    "nullif", "octet_length", "percent_rank", "pi", "pow", "power", "printf", "quote",
    "radians", "rank", "replace", "round", "row_number", "rtrim", "sign", "sin", "sinh",
    "soundex", "sqrt", "strftime", "string_agg", "substr", "substring", "sum", "tan", "tanh",
    "time", "timediff", "total", "trim", "trunc", "typeof", "unhex", "unicode", "unixepoch",
    "unlikely", "upper", "zeroblob",
    # full-text search and R*Tree: deterministic over their tables
    "bm25", "highlight", "match", "matchinfo", "offsets", "snippet",
    # SQLite's own ALTER TABLE RENAME and DROP COLUMN run these over the schema; they are
    # internal (a statement that names one gets "no such function")
    "sqlite_rename_column", "sqlite_rename_table", "sqlite_rename_test",
    "sqlite_rename_quotefix", "sqlite_drop_column",
})  # fmt: skip
"""Functions a transaction may call: each answers the same at every replica given the
same arguments and data (``changes`` and ``last_insert_rowid`` because every transaction
starts from the same values, see ``SqliteGuard.reset_connection_counters``; the
``current_*`` ones and 'now' answer the transaction's own time)."""

NONDETERMINISTIC_BUILTINS: dict[str, tuple[int, ...]] = {
    "random": (0,),
    "randomblob": (1,),
    "total_changes": (0,),
    "sqlite_version": (0,),
    "sqlite_source_id": (0,),
    "sqlite_compileoption_get": (1,),
    "sqlite_compileoption_used": (1,),
    "fts5_source_id": (0,),
    "fts3_tokenizer": (1, 2),
    "load_extension": (1, 2),
}
"""Built-ins overridden by a refusal, by name and argument counts: what they answer
depends on the clock, chance, the connection's history or the SQLite build."""

TIME_VALUE_ARGUMENTS: dict[str, tuple[int, ...]] = {
    "date": (0,),
    "time": (0,),
    "datetime": (0,),
    "julianday": (0,),
    "unixepoch": (0,),
    "strftime": (1,),
    "timediff": (0, 1),
}
"""The date and time functions, and which of their arguments are time values (the rest
are a format or modifiers)."""

CURRENT_TIME_KEYWORDS: dict[str, slice] = {
    "current_timestamp": slice(0, 19),
    "current_date": slice(0, 10),
    "current_time": slice(11, 19),
}
"""SQL's ``CURRENT_*`` keywords (SQLite calls them as functions): which part of the
transaction's time as text (``YYYY-MM-DD HH:MM:SS.SSS``) each answers."""

ZONE_MODIFIERS = frozenset({"localtime", "utc"})

PHYSICAL_TABLES = frozenset({"sqlite_stmt", "dbstat", "sqlite_dbpage"})
"""Virtual tables that show the database's physical state (pages, the connection's
statements): it differs between replicas that hold the same data."""

_TRANSACTION_ACTIONS = {
    sqlite3.SQLITE_TRANSACTION: "BEGIN, COMMIT and ROLLBACK",
    sqlite3.SQLITE_SAVEPOINT: "SAVEPOINT and RELEASE",
    sqlite3.SQLITE_ATTACH: "ATTACH and VACUUM INTO",
    sqlite3.SQLITE_DETACH: "DETACH",
    sqlite3.SQLITE_PRAGMA: "PRAGMA",
}
_TEMPORARY_ACTIONS = {
    sqlite3.SQLITE_CREATE_TEMP_INDEX,
    sqlite3.SQLITE_CREATE_TEMP_TABLE,
    sqlite3.SQLITE_CREATE_TEMP_TRIGGER,
    sqlite3.SQLITE_CREATE_TEMP_VIEW,
}
_READS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE}
_ROW_WRITES = {sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE}
LARGEST_ROWID = 2**63 - 1


_SCHEMA_CHANGES = {sqlite3.SQLITE_CREATE_TABLE, sqlite3.SQLITE_ALTER_TABLE}


def _is_touch_trigger_dropped_with_its_table(
    action: int, first: str | None, second: str | None, dropping: set[str]
) -> bool:
    """A touch trigger of the worker's (``sqlite_touched``) goes with its table
    (``dropping``: tables a statement drops); a user's statement naming it otherwise is
    refused as bookkeeping."""
    return (
        action == sqlite3.SQLITE_DROP_TEMP_TRIGGER
        and (first or "").startswith(TRIGGER_PREFIX)
        and second in dropping
    )


def user_sql(sql: str) -> str:
    """A user's statement as the worker runs it (``USER_SQL_SUFFIX``): a comment on a
    line of its own, after anything the statement ends with (a ``--`` comment)."""
    return sql + USER_SQL_SUFFIX


def names_bookkeeping(*names: object) -> bool:
    return any(isinstance(n, str) and n.casefold().startswith(BOOKKEEPING_PREFIX) for n in names)


class GuardRefusal(Exception):
    """Raised inside a replaced function; SQLite turns it into a statement error."""


class SqliteGuard:
    """The rules for one connection's user transactions (see the module docstring)."""

    def __init__(self) -> None:
        self.refusal = ""
        """Why the guard last refused something (empty: it has not, since ``start``)."""
        self.schema_changed = False
        """A statement since ``start`` created or altered a table (the worker's touch
        triggers are then made again: ``sqlite_touched``)."""
        self._dropping: set[str] = set()
        """Tables the transaction's statements drop (their touch triggers go with them)."""
        self.written: set[str] = set()
        """Tables user statements (and their triggers) insert into or update: noted
        when SQLite prepares a statement, so kept while the connection lives (a cached
        statement is not judged again); a table gone or without rowids leaves it at the
        next ``largest_rowid_taken``."""
        self.judging = False
        """A transaction's statements are running (``start`` .. ``end``): the worker's
        own statements outside run unjudged."""
        self._clock = sqlite3.connect(":memory:", check_same_thread=False)
        """A connection without the replacements: SQLite's own date arithmetic."""
        self.now = ""
        """The running transaction's current time as SQLite writes a time value, to the
        millisecond as SQLite's own 'now' (empty: none, the clock is refused)."""

    def install(self, conn: sqlite3.Connection) -> None:
        """Register the authorizer and the replacements on the worker's writing
        connection, for its life."""
        conn.set_authorizer(self)
        conn.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {BOOKKEEPING_PREFIX}counters (id INTEGER PRIMARY KEY)"
        )
        builtins = {
            name for (name,) in conn.execute("SELECT DISTINCT name FROM pragma_function_list")
        }
        for name, arities in NONDETERMINISTIC_BUILTINS.items():
            if name in builtins:
                for arity in arities:
                    conn.create_function(name, arity, self._refusing(name))
        for name, positions in TIME_VALUE_ARGUMENTS.items():
            if name in builtins:
                replacement = self._clock_free(name, positions)
                conn.create_function(name, -1, replacement, deterministic=True)
        for name, part in CURRENT_TIME_KEYWORDS.items():
            conn.create_function(name, 0, self._current(name, part))

    def start(self, conn: sqlite3.Connection, now_unix_us: int = 0) -> None:
        """Before a transaction's statements: a clean refusal, the transaction's time
        (``now_unix_us``, 0: none), and the connection's counters at the same values at
        every replica."""
        self.refusal = ""
        self.schema_changed = False
        self._dropping = set()
        self.now = time_value(now_unix_us) if now_unix_us else ""
        self.reset_connection_counters(conn)
        self.judging = True

    def end(self) -> None:
        """After a transaction's statements: the worker's own run unjudged, and its reads
        (the content check) find no current time, alike at every replica."""
        self.judging = False
        self.now = ""

    def largest_rowid_taken(self, conn: sqlite3.Connection) -> str:
        """After a transaction's statements: why it must fail if a table it wrote now
        holds the largest rowid ("" if none does). SQLite then picks *random* rowids for
        later inserts into that table (different at every replica), so that state is never
        committed. One index lookup per table written."""
        for table in sorted(self.written):
            quoted = '"' + table.replace('"', '""') + '"'
            try:
                (largest,) = conn.execute(f"SELECT max(rowid) FROM main.{quoted}").fetchone()
            except sqlite3.Error:
                # Gone, or WITHOUT ROWID (SQLite never picks one): a table of that name
                # made later changes the schema, and SQLite prepares (and the guard
                # judges) every statement again.
                self.written.discard(table)
                continue
            if largest == LARGEST_ROWID:
                return (
                    f"a row of {table} has rowid {LARGEST_ROWID:,}, the largest: SQLite "
                    "would then choose random rowids for later inserts, different at every "
                    "replica (choose smaller ids)"
                )
        return ""

    @staticmethod
    def reset_connection_counters(conn: sqlite3.Connection) -> None:
        """``last_insert_rowid()`` and ``changes()`` carry over from the connection's last
        statement, which differs between a worker that restarted and one that did not:
        one insert of a known row sets them to 0 and 1 before each transaction."""
        conn.execute(f"INSERT OR REPLACE INTO temp.{BOOKKEEPING_PREFIX}counters VALUES (0)")

    def __call__(
        self,
        action: int,
        first: str | None,
        second: str | None,
        database: str | None,
        inner: str | None,
    ) -> int:
        if not self.judging:
            return sqlite3.SQLITE_OK  # the worker's own statements
        if inner is not None and inner.startswith(TRIGGER_PREFIX):
            # The body of a touch trigger of the worker's (``sqlite_touched``): one call of
            # its function on a rowid. A user cannot make a trigger of that name (it
            # names the bookkeeping), so nothing else runs under it; answered at once, as
            # it is asked for every user statement that writes.
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_DROP_TABLE and first:
            self._dropping.add(first)  # SQLite then asks to drop each of its triggers
        if _is_touch_trigger_dropped_with_its_table(action, first, second, self._dropping):
            return sqlite3.SQLITE_OK
        reason = self._reason(action, first, second)
        if reason:
            self.refusal = reason
            return sqlite3.SQLITE_DENY
        if action in _SCHEMA_CHANGES:
            self.schema_changed = True
        if action in _ROW_WRITES and database == "main" and first:
            self.written.add(first)
        return sqlite3.SQLITE_OK

    @staticmethod
    def _reason(action: int, first: str | None, second: str | None) -> str:
        if action in _TRANSACTION_ACTIONS:
            return (
                f"{_TRANSACTION_ACTIONS[action]} are not allowed in a transaction: the "
                "worker owns the database transaction and its settings"
            )
        if action in _TEMPORARY_ACTIONS:
            return (
                "temporary tables, views, indexes and triggers are not allowed: they live "
                "in one worker's connection only, so replicas would differ"
            )
        if action == sqlite3.SQLITE_FUNCTION:
            name = (second or "").casefold()
            if name not in DETERMINISTIC_FUNCTIONS:
                return (
                    f"function {second}() is not allowed in a transaction: every replica "
                    "must compute the same (pass such values as parameters)"
                )
            return ""
        if action in _READS and (first or "").casefold() in PHYSICAL_TABLES:
            return (
                f"{first} shows the database's pages and statements, which differ between "
                "replicas: a transaction cannot read it (every replica must compute the same)"
            )
        if names_bookkeeping(first, second):
            verb = "read" if action in _READS else "changed"
            return (
                f"the worker's bookkeeping ({BOOKKEEPING_PREFIX} tables) cannot be {verb} "
                "by a transaction"
            )
        return ""

    def _refusing(self, name: str) -> SqlFunction:
        def refuse(*_: SqlValue) -> SqlValue:
            self.refusal = (
                f"{name}() is not allowed in a transaction (also not as a column's "
                "DEFAULT): every replica must compute the same (pass such values as "
                "parameters)"
            )
            raise GuardRefusal(self.refusal)

        return refuse

    def _clock_free(self, name: str, positions: tuple[int, ...]) -> SqlFunction:
        call = f"SELECT {name}(%s)"

        def deterministic(*args: SqlValue) -> SqlValue:
            problem = _zone_dependence(args, positions)
            if not problem:
                args, problem = self._at_transaction_time(args, positions)
            if problem:
                self.refusal = f"{name}() {problem}"
                raise GuardRefusal(self.refusal)
            row = self._clock.execute(call % ",".join("?" * len(args)), args).fetchone()
            answer: SqlValue = row[0]
            return answer

        return deterministic

    def _at_transaction_time(
        self, args: tuple[SqlValue, ...], positions: tuple[int, ...]
    ) -> tuple[tuple[SqlValue, ...], str]:
        """``args`` with the current time (a missing time value, or 'now' as SQLite
        reads it) as the transaction's, or why that cannot be."""
        at = list(args)
        for position in positions:
            if position < len(at):
                now = _as_sqlite_reads(at[position]) == "now"
            else:  # date() is date('now'), strftime('%s') too; timediff needs both
                now = position == len(at) and len(positions) == 1
            if not now:
                continue
            if not self.now:
                return args, _NO_TIME
            if position < len(at):
                at[position] = self.now
            else:
                at.append(self.now)
        return tuple(at), ""

    def _current(self, name: str, part: slice) -> SqlFunction:
        keyword = name.upper()

        def current() -> SqlValue:
            if not self.now:
                self.refusal = f"{keyword} {_NO_TIME}"
                raise GuardRefusal(self.refusal)
            return self.now[part]

        return current


_NO_TIME = (
    "reads the current time, and this transaction carries none (TxBody.now_unix_us, "
    "which the client library sets): replicas apply it at different times (pass the "
    "time as a parameter, or submit through the client library)"
)


def time_value(unix_us: int) -> str:
    """``unix_us`` (microseconds since 1970 UTC) as SQLite writes a time value, to the
    millisecond as its own 'now' is: ``YYYY-MM-DD HH:MM:SS.SSS``."""
    at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=unix_us)
    return (
        f"{at.year:04d}-{at.month:02d}-{at.day:02d} "
        f"{at.hour:02d}:{at.minute:02d}:{at.second:02d}.{at.microsecond // 1000:03d}"
    )


def _zone_dependence(args: tuple[SqlValue, ...], positions: tuple[int, ...]) -> str:
    """Why a date/time call depends on the machine's time zone ("" when it does not)."""
    first_modifier = max(positions) + 1
    for value in args[first_modifier:]:
        if _as_sqlite_reads(value) in ZONE_MODIFIERS:
            return (
                f"with the {value!r} modifier is not allowed in a transaction: it reads "
                "the machine's time zone, and replicas apply it in different places"
            )
    return ""


def _as_sqlite_reads(value: SqlValue) -> str | None:
    """A time value or modifier as SQLite's date functions read it, folded: a blob as its
    text (X'6E6F77' is 'now'), a text up to its first NUL ('no'||'w'||char(0) is too),
    case and surrounding space ignored. None for a number or NULL."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return None
    return value.split("\0", 1)[0].strip().casefold()


READ_REFUSED_FUNCTIONS = frozenset({"fts3_tokenizer", "load_extension"})
"""Functions no read may call: ``fts3_tokenizer`` answers a native pointer (an address
leak) and, with two arguments, registers any address as a tokenizer (a crash, or worse,
inside the worker)."""


class ReadGuard:
    """The authorizer of reads (``Query``): reads of user tables, and any function but
    ``READ_REFUSED_FUNCTIONS``; nothing of the worker's bookkeeping (other clients'
    idempotency keys and errors). Reads are answered by one worker and never
    replicated, so they may call the clock and chance. ``refusal`` says why it last
    refused."""

    def __init__(self) -> None:
        self.refusal = ""

    def __call__(self, action: int, first: str | None, second: str | None, *_: object) -> int:
        if action == sqlite3.SQLITE_FUNCTION:
            if (second or "").casefold() in READ_REFUSED_FUNCTIONS:
                self.refusal = f"function {second}() is not allowed in a read"
                return sqlite3.SQLITE_DENY
            return sqlite3.SQLITE_OK
        if action not in _READS:
            self.refusal = "a read may only read"
            return sqlite3.SQLITE_DENY
        if names_bookkeeping(first, second):
            self.refusal = f"the worker's bookkeeping ({BOOKKEEPING_PREFIX} tables) cannot be read"
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK
