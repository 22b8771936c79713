"""``txsync query``: a read-only statement on one of a DC's workers.

The DC's transaction-store sends it to its most advanced healthy worker. ``--after`` a
transaction id (or ``--after-position``) makes it a read-your-writes read: the worker
waits until it has applied that far (up to ``--timeout``).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Any

from txsync.cli.connect import add_connection_arguments, client_of
from txsync.cli.submit_command import parse_param

EPILOG = """\
examples:
  txsync query --sql 'SELECT id, balance FROM accounts ORDER BY id'
  txsync query --dc dc3 --sql 'SELECT balance FROM accounts WHERE id = ?' --param 1 \\
      --after 5e0b3c1a-...            # after this transaction is applied there
  txsync query --sql 'SELECT count(*) FROM accounts' -o json
  txsync query --dc dc2 --worker dc2-w2 --sql 'SELECT count(*) FROM accounts'

exit status: 0 answered, 1 refused (a write, a bad statement) or unreachable,
2 bad arguments.
"""


def _shown(value: Any) -> Any:
    """A value for JSON: a blob as base64."""
    return base64.b64encode(value).decode() if isinstance(value, bytes) else value


def run(options: argparse.Namespace) -> int:
    from txsync.client import TxSyncError  # noqa: PLC0415

    with client_of(options) as client:
        try:
            answer = client.query(
                options.sql,
                *(parse_param(p) for p in options.param),
                after=options.after or None,
                after_position=options.after_position,
                max_rows=options.max_rows,
                timeout=options.timeout,
                worker=options.worker or "",
            )
        except (TxSyncError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    rows = [[_shown(v) for v in row] for row in answer.rows]
    if options.output == "json":
        print(json.dumps({
            "columns": list(answer.columns), "rows": rows, "truncated": answer.truncated,
            "position": answer.position, "worker": answer.worker,
        }, indent=2))  # fmt: skip
        return 0
    table = [list(answer.columns)] + [["NULL" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))] if table[0] else []
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    more = " (truncated: raise --max-rows)" if answer.truncated else ""
    print(f"({len(rows)} row{'s' if len(rows) != 1 else ''}{more}; worker {answer.worker} "
          f"at position {answer.position})")  # fmt: skip
    return 0


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "query",
        help="run a read-only SQL statement on a DC's worker",
        description=__doc__.split("\n\n", 1)[1],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sql", required=True, help="one read-only statement ('?' params)")
    parser.add_argument("--param", action="append", default=[], help="a parameter; repeat")
    after = parser.add_mutually_exclusive_group()
    after.add_argument("--after", metavar="TX_ID", help="read after this transaction")
    after.add_argument("--after-position", type=int, default=0, metavar="N",
                       help="read after this synced position")  # fmt: skip
    parser.add_argument("--max-rows", type=int, default=1000, help="at most (default 1000)")
    parser.add_argument("--worker", metavar="W",
                        help="read this worker of the DC, healthy or not (to check replicas "
                        "by hand; `txsync workers` lists them)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds to wait for --after (1..60, default 10)")  # fmt: skip
    add_connection_arguments(parser)
    parser.set_defaults(handler=run)
