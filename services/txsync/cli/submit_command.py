"""``txsync submit``: send one transaction to a DC and wait for a state.

Through the client library (``txsync.client``): the ``--dc`` DC first, the others of the
endpoints if it does not answer, with the same idempotency key (``--key``, else a new
one), so a retry never applies the transaction twice. It waits for what the library
waits for by default (``accepted``). The transaction is one ``--sql`` statement with its
``--param`` values, or the statements of a file (``-f FILE``, ``-f -`` for stdin),
applied atomically."""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time
from typing import Any

from txsync.cli.connect import add_connection_arguments, client_of
from txsync.client.results import SqlValue, Statement

WAIT_STATES = ("incoming", "accepted", "enqueued", "ok")

EPILOG = """\
parameters: each --param fills the next '?'. Whole numbers and decimals become numbers,
'null' becomes NULL, anything else is text; prefix 's:' to force text ('s:42').

examples:
  txsync submit --dc dc1 \\
      --sql 'INSERT INTO accounts (id, balance) VALUES (?, ?)' --param 1 --param 100
  txsync submit --dc dc2 --sql 'UPDATE accounts SET balance = balance - 10
      WHERE id = 1' --wait ok
  txsync submit --endpoints 127.0.0.1:7101 --sql 'DELETE FROM t' --wait incoming -o json
  txsync submit -f transfer.sql --key transfer-2026-11-27 --wait ok
  printf 'UPDATE a SET n = n - 1 WHERE id = 1;\\nUPDATE a SET n = n + 1 WHERE id = 2;\\n' |
      txsync submit -f -

A file holds statements ended by ';' (split as SQLite does: a ';' inside a string, a
comment or a trigger's body does not end one; no parameters). They are one transaction.
--wait: incoming answers once the DC has it on disk; accepted (the default) once its
place in the order is fixed; ok once applied.

The DC asked first is --dc (default: the first of the endpoints); if it does not answer,
or cannot order for lack of a majority, the submit goes to the next with the same key.

exit status: 0 reached the state waited for, 1 refused or unreachable, 3 timed out,
4 FAILED (the DC's testing worker's database refused it; the error is printed).
"""


def parse_param(text: str) -> SqlValue:
    if text.startswith("s:"):
        return text[2:]
    if text == "null":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


STATEMENTS_MAX = 1_000
"""What a transaction may hold (the store refuses more)."""


def split_statements(text: str) -> list[str]:
    """The statements of ``text``, each ended by ';', split where SQLite would end one
    (``sqlite3.complete_statement``): a ';' in a string, a comment or a trigger's body
    does not. A last statement without its ';' counts; pieces of nothing but blanks and
    comments do not."""
    statements, current = [], ""
    for piece in text.split(";"):
        current += piece + ";"
        if sqlite3.complete_statement(current):
            if not _only_comments(current):
                statements.append(current.strip())
            current = ""
    if not _only_comments(current):
        statements.append(current.strip().removesuffix(";"))
    return statements


def _only_comments(sql: str) -> bool:
    """Whether ``sql`` holds nothing but blanks, ';' and comments."""
    rest = sql.strip(" \t\r\n;")
    while rest.startswith(("--", "/*")):
        end = rest.find("\n") if rest.startswith("--") else rest.find("*/")
        if end < 0:
            return True
        rest = rest[end + (1 if rest.startswith("--") else 2) :].strip(" \t\r\n;")
    return not rest


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "submit",
        help="submit a write transaction to a DC",
        description="Submit one transaction (one SQL statement, or a file of them) to a DC's "
        "client API.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--sql", help="one parameterised SQL statement")
    what.add_argument(
        "-f", "--file", type=argparse.FileType("r"),
        help="a file of statements ended by ';' ('-': stdin), applied as one transaction",
    )  # fmt: skip
    parser.add_argument("--param", action="append", default=[], help="a parameter; repeat")
    parser.add_argument(
        "--key",
        default="",
        help="idempotency key: a retry with it, at any DC, applies nothing twice "
        "(default: a new one)",
    )
    parser.add_argument(
        "--wait", choices=WAIT_STATES, default="accepted",
        help="wait for this state (default: accepted, as the client library)",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait (default 30)")
    add_connection_arguments(parser, outputs=("text", "json"))
    parser.set_defaults(handler=run)


def run(options: argparse.Namespace) -> int:
    from txsync.client import TransactionFailed, TxSyncError  # noqa: PLC0415
    from txsync.client.errors import Timeout  # noqa: PLC0415

    if options.file is not None:
        if options.param:
            print("error: --param goes with --sql, not with -f", file=sys.stderr)
            return 2
        with options.file:
            statements = [Statement(sql) for sql in split_statements(options.file.read())]
        if not 1 <= len(statements) <= STATEMENTS_MAX:
            print(f"error: {options.file.name} holds {len(statements)} statements "
                  f"(1 to {STATEMENTS_MAX})", file=sys.stderr)  # fmt: skip
            return 2
    else:
        statements = [Statement(options.sql, tuple(parse_param(p) for p in options.param))]
    started = time.monotonic()
    result: dict[str, Any] = {}
    with client_of(options, timeout=options.timeout) as client:
        try:
            submitted = client.submit(
                statements, key=options.key or None, wait=options.wait, timeout=options.timeout
            )
            result = {
                "tx_id": submitted.tx_id,
                "created": submitted.created,
                "state": f"TX_STATE_{submitted.state.name}",
                "dc": submitted.dc,
                "key": submitted.key,
            }
            if submitted.duplicate:
                result["duplicate"] = True
            reached = True
        except TransactionFailed as failed:
            result = {"tx_id": failed.tx_id, "state": "TX_STATE_FAILED", "error": failed.error}
            reached = True
        except Timeout as timeout:
            result = {"tx_id": timeout.tx_id, "state": f"TX_STATE_{timeout.state}"}
            reached = False
        except TxSyncError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    if options.wait:
        result["reached"] = reached
        result["elapsed_ms"] = round((time.monotonic() - started) * 1000, 1)
    if options.output == "json":
        print(json.dumps(result))
    else:
        line = f"{result['tx_id']}  {result['state']}"
        if "elapsed_ms" in result:
            line += f"  ({result['elapsed_ms']} ms)" if reached else "  (timed out)"
        if result.get("duplicate"):
            line += "  (a duplicate: its key was taken first by this transaction)"
        if "error" in result:
            line += f"\n  {result['error']}"
        print(line)
    if "error" in result:
        return 4  # the DC's testing worker refused it: FAILED everywhere
    return 0 if reached else 3
