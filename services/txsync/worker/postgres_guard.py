"""What a user's statement may do on a PostgreSQL worker (issue 17).

PostgreSQL has no per-statement authorizer, and filters over the SQL text were routed
around (``U&"\\005Ftxsync_applied"``, ``DO`` with a string built at run time, ``/* x */
COMMIT``). The rules now rest on two things that do not read text:

- **Privileges.** The worker's bookkeeping lives in its own schema (``_txsync``), and user
  statements run as ``USER_ROLE`` (``SET LOCAL ROLE`` inside the worker's transaction),
  which has no right on that schema: no spelling, view, rule or dynamic SQL reaches it.
  The role cannot create functions or procedures (no language is granted to it), so it
  cannot run code that changes the role back.
- **PostgreSQL's own parser** (``pglast``, libpg_query: the server's grammar) classifies
  each statement before it is sent. Only the kinds in ``STATEMENTS`` may run, so
  transaction control (``COMMIT``, however commented), ``DO``, ``CALL``, ``SET``/``RESET``
  (``ROLE`` included), ``COPY``, ``PREPARE``/``EXECUTE``, ``LISTEN`` and the like are
  refused; every function call, value function and literal in the tree (column defaults
  included) is checked against the functions that change the role, run SQL given as a
  string, or answer differently at each replica (the clock, chance, the server).

After the statements the worker checks, at the protocol level, that its transaction is
still open and its role still ``USER_ROLE``, and fails loudly otherwise.
"""

from __future__ import annotations

from typing import Any

from pglast import ast, parse_sql
from pglast.enums import ConstrType
from pglast.parser import ParseError
from pglast.visitors import Visitor

USER_ROLE = "txsync_user"
BOOKKEEPING_SCHEMA = "_txsync"

STATEMENTS = frozenset({
    "SelectStmt", "InsertStmt", "UpdateStmt", "DeleteStmt", "MergeStmt",
    "CreateStmt", "CreateTableAsStmt", "AlterTableStmt", "DropStmt", "TruncateStmt",
    "IndexStmt", "ViewStmt", "RenameStmt", "CommentStmt",
    "CreateEnumStmt", "AlterEnumStmt",
    "CompositeTypeStmt", "CreateDomainStmt", "AlterDomainStmt",
})  # fmt: skip
"""Statement kinds a transaction may run: reads, writes and the schema of its tables."""

READ_STATEMENTS = frozenset({"SelectStmt"})

ROLE_AND_DYNAMIC_SQL = frozenset({
    "set_config", "query_to_xml", "query_to_xml_and_xmlschema", "query_to_xmlschema",
    "cursor_to_xml", "cursor_to_xmlschema", "ts_stat", "dblink", "dblink_exec",
    "pg_sleep", "pg_sleep_for", "pg_sleep_until", "pg_terminate_backend",
    "pg_cancel_backend", "lo_import", "lo_export", "pg_read_file", "pg_read_binary_file",
    "pg_ls_dir", "pg_stat_file",
    # Session-level locks outlive the transaction (and any lock can wait on another
    # session's): the worker's connection must come back from a transaction as it went.
    "pg_advisory_lock", "pg_advisory_lock_shared", "pg_try_advisory_lock",
    "pg_try_advisory_lock_shared", "pg_advisory_unlock", "pg_advisory_unlock_shared",
    "pg_advisory_unlock_all", "pg_advisory_xact_lock", "pg_advisory_xact_lock_shared",
    "pg_try_advisory_xact_lock", "pg_try_advisory_xact_lock_shared",
})  # fmt: skip
"""Functions that change the role, run SQL given as a string, sleep, hold locks, or reach
the server's files or other sessions: refused in reads too."""

NONDETERMINISTIC = frozenset({
    "random", "random_normal", "setseed", "gen_random_uuid", "uuid_generate_v1",
    "uuid_generate_v1mc", "uuid_generate_v4", "now", "clock_timestamp",
    "statement_timestamp", "transaction_timestamp", "timeofday",
    "pg_backend_pid", "inet_client_addr", "inet_client_port", "inet_server_addr",
    "inet_server_port", "txid_current", "txid_current_if_assigned", "pg_current_xact_id",
    "pg_current_xact_id_if_assigned", "version", "current_setting", "pg_postmaster_start_time",
    "pg_conf_load_time", "nextval", "currval", "lastval", "setval",
    # the server's physical state: WAL positions, file sizes and nodes, snapshots
    "pg_current_wal_lsn", "pg_current_wal_insert_lsn", "pg_current_wal_flush_lsn",
    "pg_last_wal_receive_lsn", "pg_last_wal_replay_lsn", "pg_relation_size",
    "pg_table_size", "pg_indexes_size", "pg_total_relation_size", "pg_database_size",
    "pg_tablespace_size", "pg_relation_filenode", "pg_relation_filepath",
    "pg_xact_commit_timestamp", "pg_current_snapshot", "txid_current_snapshot",
    "pg_snapshot_xmin", "pg_snapshot_xmax", "txid_snapshot_xmin", "txid_snapshot_xmax",
    "pg_xact_status", "txid_status", "pg_trigger_depth", "pg_my_temp_schema",
    # large objects: their ids are OIDs, which each server assigns
    "lo_create", "lo_creat", "lo_from_bytea", "lo_open", "lo_unlink",
    "lo_put", "lo_get", "loread", "lowrite", "lo_truncate", "lo_lseek", "lo_tell",
})  # fmt: skip
"""Functions whose answer depends on the clock, chance, the server or the session; and
sequences, which a transaction the testing worker failed still advances there but not at
the workers that only record it."""

SERIAL_TYPES = frozenset({
    "serial", "serial2", "serial4", "serial8", "smallserial", "bigserial",
})  # fmt: skip
"""Column types that take their values from a sequence (see NONDETERMINISTIC)."""

SERVER_ID_TYPES = frozenset({
    "oid", "regclass", "regproc", "regprocedure", "regoper", "regoperator", "regtype",
    "regnamespace", "regrole", "regcollation", "regconfig", "regdictionary", "xid",
    "xid8", "cid", "tid", "pg_lsn",
})  # fmt: skip
"""Types whose values are the server's own ids (object ids, transaction ids, row and WAL
positions): each server assigns its own, so a write of one differs between replicas."""

SYSTEM_COLUMNS = frozenset({"ctid", "xmin", "xmax", "cmin", "cmax", "tableoid"})
"""Columns every table has, whose values are where and when the server stored the row."""

CLOCK_WORDS = frozenset({"now", "today", "tomorrow", "yesterday"})
"""Literals that PostgreSQL reads as the current time when cast to a date or time."""


class Refused(Exception):
    """The statement may not run; the message says why."""


class _Checker(Visitor):
    """Walks a statement's whole tree; pglast names the visits after the node types."""

    def __init__(self, *, read: bool) -> None:
        super().__init__()
        self.read = read

    def visit_FuncCall(self, ancestors: Any, node: ast.FuncCall) -> None:  # noqa: N802
        names = node.funcname or ()
        name = str(names[-1].sval).lower() if names else ""
        if name in ROLE_AND_DYNAMIC_SQL:
            raise Refused(f"function {name}() is not allowed")
        one_argument_age = name == "age" and len(node.args or ()) == 1  # since today
        if not self.read and (name in NONDETERMINISTIC or one_argument_age):
            raise Refused(
                f"function {name}() is not allowed in a transaction: every replica must "
                "compute the same (pass such values as parameters)"
            )

    def visit_SQLValueFunction(self, ancestors: Any, node: ast.SQLValueFunction) -> None:  # noqa: N802
        if not self.read:
            raise Refused(
                "CURRENT_TIMESTAMP, CURRENT_DATE, LOCALTIME, CURRENT_USER and the like are "
                "not allowed in a transaction: every replica must compute the same"
            )

    def visit_ColumnDef(self, ancestors: Any, node: ast.ColumnDef) -> None:  # noqa: N802
        kind = _type_name(node.typeName)
        if kind in SERIAL_TYPES:
            raise Refused(
                f"column {node.colname} {kind}: its values come from a sequence, which a "
                "transaction the testing worker failed still advances there but not at the "
                "other replicas (pass the ids as values)"
            )
        if kind in SERVER_ID_TYPES:
            raise Refused(
                f"column {node.colname} {kind}: such values are the server's own ids, "
                "different at every replica"
            )
        for constraint in node.constraints or ():
            if constraint.contype == ConstrType.CONSTR_IDENTITY:
                raise Refused(
                    f"column {node.colname} GENERATED AS IDENTITY: its values come from "
                    "a sequence, which a transaction the testing worker failed still "
                    "advances there but not at the other replicas (pass the ids as values)"
                )

    def visit_RangeVar(self, ancestors: Any, node: ast.RangeVar) -> None:  # noqa: N802
        if node.relpersistence == "t":
            raise Refused(
                f"temporary relation {node.relname}: it lives in one worker's session and "
                "would outlive the transaction there"
            )
        if node.relpersistence == "u":
            raise Refused(f"unlogged table {node.relname}: a crash empties it at one replica only")

    def visit_TypeCast(self, ancestors: Any, node: ast.TypeCast) -> None:  # noqa: N802
        kind = _type_name(node.typeName)
        if not self.read and kind in SERVER_ID_TYPES:
            raise Refused(
                f"a cast to {kind} is not allowed in a transaction: such values are the "
                "server's own ids, different at every replica"
            )

    def visit_ColumnRef(self, ancestors: Any, node: ast.ColumnRef) -> None:  # noqa: N802
        fields = node.fields or ()
        last = str(getattr(fields[-1], "sval", "")) if fields else ""
        if not self.read and last.lower() in SYSTEM_COLUMNS:
            raise Refused(
                f"the system column {last} is not allowed in a transaction: it says where "
                "and when this server stored the row, which differs at every replica"
            )

    def visit_String(self, ancestors: Any, node: ast.String) -> None:  # noqa: N802
        if not self.read and (node.sval or "").strip().lower() in CLOCK_WORDS:
            raise Refused(
                f"the literal {node.sval!r} is not allowed in a transaction: cast to a date "
                "or time it is the current time, which differs at every replica"
            )


def _type_name(type_name: ast.TypeName | None) -> str:
    names = (type_name.names or ()) if type_name is not None else ()
    return str(getattr(names[-1], "sval", "")).lower() if names else ""


def check_statement(sql: str, *, read: bool = False) -> None:
    """Raise ``Refused`` unless ``sql`` is one statement of an allowed kind with no
    refused function or literal anywhere in it (``read``: a ``Query``)."""
    try:
        statements = parse_sql(sql)
    except ParseError as error:
        raise Refused(f"syntax error: {error}") from None
    if len(statements) != 1:
        raise Refused(f"one statement at a time, not {len(statements)}")
    statement = statements[0].stmt
    if statement is None:
        raise Refused("an empty statement")
    kind = type(statement).__name__
    allowed = READ_STATEMENTS if read else STATEMENTS
    if kind not in allowed:
        what = "a read" if read else "a transaction"
        raise Refused(
            f"{_KIND_NAMES.get(kind, kind)} is not allowed in {what}: the worker owns the "
            "transaction, the session and the server"
        )
    _Checker(read=read)(statement)


def check_parameter(value: object) -> None:
    """A parameter that PostgreSQL would read as the current time."""
    if isinstance(value, str) and value.strip().lower() in CLOCK_WORDS:
        raise Refused(
            f"the parameter {value!r} is not allowed in a transaction: as a date or time it "
            "is the current time, which differs at every replica"
        )


_KIND_NAMES = {
    "TransactionStmt": "transaction control (BEGIN, COMMIT, ROLLBACK, SAVEPOINT)",
    "DoStmt": "DO",
    "CallStmt": "CALL",
    "VariableSetStmt": "SET and RESET",
    "VariableShowStmt": "SHOW",
    "CopyStmt": "COPY",
    "CreateFunctionStmt": "CREATE FUNCTION or PROCEDURE",
    "CreateTrigStmt": "CREATE TRIGGER",
    "RuleStmt": "CREATE RULE",
    "PrepareStmt": "PREPARE",
    "ExecuteStmt": "EXECUTE",
    "VacuumStmt": "VACUUM and ANALYZE",
    "LockStmt": "LOCK",
    "ListenStmt": "LISTEN",
    "NotifyStmt": "NOTIFY",
    "DiscardStmt": "DISCARD",
    "LoadStmt": "LOAD",
    "CreateExtensionStmt": "CREATE EXTENSION",
    "GrantStmt": "GRANT and REVOKE",
    "GrantRoleStmt": "GRANT and REVOKE of roles",
    "CreateRoleStmt": "CREATE ROLE",
    "AlterRoleStmt": "ALTER ROLE",
    "ExplainStmt": "EXPLAIN",
    "CreateSeqStmt": "CREATE SEQUENCE (nextval() is refused: a transaction the testing "
    "worker failed still advances a sequence there but not at the other replicas)",
    "AlterSeqStmt": "ALTER SEQUENCE",
}
