"""``txsync tx get ID`` and ``txsync tx list``: transactions and where they are.

``tx get`` shows the transaction (found by id, or by the idempotency key it was submitted
with) as the DC asked holds it (statements, key, position, outcome) and its state and
history at every DC (gathered by that DC's store), with its trace id for Jaeger.
``tx list`` pages through one DC's transactions (``--all``, or ``--page-token`` to go on).
Both go through the client library (``txsync.client``).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Any

import grpc
from google.protobuf import json_format

from txsync.cli.connect import (
    TIMEOUT_S,
    add_connection_arguments,
    channel,
    client_of,
    describe,
    fail,
    metadata,
)
from txsync.client.results import TxInfo
from txsync.v1 import admin_pb2, admin_pb2_grpc, common_pb2

EPILOG = """\
examples:
  txsync tx get 5e0b3c1a-... --dc dc2
  txsync tx list --dc dc1 --state failed
  txsync tx get --key order-1234 --dc dc1  # by the idempotency key it was submitted with
  txsync tx list --endpoints 127.0.0.1:7101 --limit 20 -o json
  txsync tx list --all --state ok           # everything, page by page

exit status: 0 found, 1 unknown or unreachable, 2 bad arguments.
"""
STATES = {name.lower(): value for name, value in [
    ("incoming", common_pb2.TX_STATE_INCOMING), ("accepted", common_pb2.TX_STATE_ACCEPTED),
    ("enqueued", common_pb2.TX_STATE_ENQUEUED), ("testing", common_pb2.TX_STATE_TESTING),
    ("ok", common_pb2.TX_STATE_OK), ("failed", common_pb2.TX_STATE_FAILED),
]}  # fmt: skip


def _state(value: int) -> str:
    return common_pb2.TxState.Name(common_pb2.TxState.ValueType(value)).removeprefix("TX_STATE_")


def run_get(options: argparse.Namespace) -> int:
    from txsync.client import TxSyncError  # noqa: PLC0415

    if bool(options.tx_id) == bool(options.key):
        fail("give a transaction id or --key, not both")
    with client_of(options) as client:
        try:
            got = client.get(options.tx_id or "", key=options.key or "", body=True)
        except TxSyncError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        answered = client.current
    address = answered.address
    try:
        with channel(address, options, answered.dc) as open_channel:
            everywhere = admin_pb2_grpc.AdminServiceStub(open_channel).GetTransaction(
                admin_pb2.GetTransactionRequest(tx_id=got.tx_id),
                timeout=TIMEOUT_S * 2,
                metadata=metadata(options),
            )
    except grpc.RpcError as error:
        print(f"error: {address}: {describe(error)}", file=sys.stderr)
        return 1
    if options.output == "json":
        answer = _tx_dict(got)
        answer["trace_id"] = everywhere.trace_id
        answer["dcs"] = [
            json_format.MessageToDict(dc, preserving_proto_field_name=True) for dc in everywhere.dcs
        ]
        print(json.dumps(answer, indent=2))
        return 0
    state = got.state.name if got.state else "UNKNOWN"
    print(f"{got.tx_id}  {state}  position {got.position or '-'}")
    if got.idempotency_key:
        print(f"  key: {got.idempotency_key}")
    if everywhere.trace_id:
        print(f"  trace: {everywhere.trace_id}")
    for statement in got.statements:
        print(f"  sql: {statement.sql}")
    for dc in everywhere.dcs:
        if dc.unanswered:
            print(f"  at {dc.node_id}: no answer ({dc.unanswered})")
            continue
        print(f"  at {dc.node_id}: {_state(dc.state)}")
        for step in dc.history:
            when = step.at.ToDatetime().isoformat(timespec="milliseconds")
            print(f"    {when}Z  {_state(step.state):<9} {step.service}")
    if got.outcome is not None:
        outcome = got.outcome
        detail = outcome.error or f"rows affected {list(outcome.rows_affected)}"
        if outcome.duplicate_of:
            detail = f"a duplicate of {outcome.duplicate_of} (its key was taken first): {detail}"
        print(f"  outcome: {'OK' if outcome.ok else 'FAILED'}, {detail}")
    return 0


def _tx_dict(info: TxInfo) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "tx_id": info.tx_id, "state": info.state.name if info.state else None,
        "position": info.position, "origin": info.origin, "key": info.idempotency_key,
    }  # fmt: skip
    if info.statements:
        answer["statements"] = [{"sql": s.sql, "params": [_plain(p) for p in s.params]}
                                for s in info.statements]  # fmt: skip
    if info.outcome is not None:
        answer["outcome"] = {
            "ok": info.outcome.ok, "rows_affected": list(info.outcome.rows_affected),
            "error": info.outcome.error, "duplicate_of": info.outcome.duplicate_of,
        }  # fmt: skip
    return answer


def _plain(value: Any) -> Any:
    return base64.b64encode(value).decode() if isinstance(value, bytes) else value


def run_list(options: argparse.Namespace) -> int:
    from txsync.client import TxSyncError  # noqa: PLC0415

    limit = None if options.all else options.limit
    rows: list[dict[str, Any]] = []
    token = options.page_token or ""
    with client_of(options) as client:
        try:
            while limit is None or len(rows) < limit:
                size = 1_000 if limit is None else min(1_000, limit - len(rows))
                page, token = client.list_page(options.state, token, page_size=size)
                rows += [
                    {"tx_id": t.tx_id, "state": t.state.name if t.state else "UNKNOWN",
                     "position": t.position, "key": t.idempotency_key}
                    for t in page
                ]  # fmt: skip
                if not token:
                    break
        except TxSyncError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    if options.output == "json":
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            key = f"  key {row['key']}" if row["key"] else ""
            print(f"{row['tx_id']}  {row['state']:<9} {row['position'] or '-'}{key}")
        print(f"({len(rows)} transaction{'s' if len(rows) != 1 else ''})")
    if token:
        print(f"more: --page-token {token} (or --all)", file=sys.stderr)
    return 0


def register(commands: Any) -> None:
    tx = commands.add_parser("tx", help="look up transactions (get, list)")
    sub = tx.add_subparsers(dest="tx_command", metavar="COMMAND", required=True)
    for name, handler, summary in (
        ("get", run_get, "one transaction: state, position, statements, history, outcome"),
        ("list", run_list, "transactions at one DC, optionally in one state"),
    ):
        parser = sub.add_parser(
            name,
            help=summary,
            description=summary.capitalize() + ".",
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if name == "get":
            parser.add_argument(
                "tx_id", nargs="?", help="the transaction's id (from txsync submit)"
            )
            parser.add_argument("--key", help="...or the idempotency key it was submitted with")
        else:
            parser.add_argument("--state", choices=sorted(STATES), help="only this state")
            parser.add_argument("--limit", type=int, default=100,
                                help="at most this many (default 100)")  # fmt: skip
            parser.add_argument("--all", action="store_true", help="every one, page by page")
            parser.add_argument("--page-token", help="go on from where a listing stopped")
        add_connection_arguments(parser)
        parser.set_defaults(handler=handler)
