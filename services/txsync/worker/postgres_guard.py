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
from pglast.parser import ParseError
from pglast.visitors import Visitor

USER_ROLE = "txsync_user"
BOOKKEEPING_SCHEMA = "_txsync"

STATEMENTS = frozenset({
    "SelectStmt", "InsertStmt", "UpdateStmt", "DeleteStmt", "MergeStmt",
    "CreateStmt", "CreateTableAsStmt", "AlterTableStmt", "DropStmt", "TruncateStmt",
    "IndexStmt", "ViewStmt", "RenameStmt", "CommentStmt",
    "CreateSeqStmt", "AlterSeqStmt", "CreateEnumStmt", "AlterEnumStmt",
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
})  # fmt: skip
"""Functions that change the role, run SQL given as a string, sleep, or reach the server's
files or other sessions: refused in reads too."""

NONDETERMINISTIC = frozenset({
    "random", "random_normal", "setseed", "gen_random_uuid", "uuid_generate_v1",
    "uuid_generate_v1mc", "uuid_generate_v4", "now", "clock_timestamp",
    "statement_timestamp", "transaction_timestamp", "timeofday",
    "pg_backend_pid", "inet_client_addr", "inet_client_port", "inet_server_addr",
    "inet_server_port", "txid_current", "txid_current_if_assigned", "pg_current_xact_id",
    "pg_current_xact_id_if_assigned", "version", "current_setting", "pg_postmaster_start_time",
    "pg_conf_load_time", "nextval", "currval", "lastval", "setval",
})  # fmt: skip
"""Functions whose answer depends on the clock, chance, the server or the session; and
sequences, which a transaction the testing worker failed still advances there but not at
the workers that only record it."""

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

    def visit_String(self, ancestors: Any, node: ast.String) -> None:  # noqa: N802
        if not self.read and (node.sval or "").strip().lower() in CLOCK_WORDS:
            raise Refused(
                f"the literal {node.sval!r} is not allowed in a transaction: cast to a date "
                "or time it is the current time, which differs at every replica"
            )


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
}
