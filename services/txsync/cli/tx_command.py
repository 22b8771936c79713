"""``txsync tx get ID`` and ``txsync tx list``: transactions and where they are.

``tx get`` shows the transaction as the DC asked holds it (statements, position, outcome)
and its state and history at every DC (gathered by that DC's store), with its trace id
for Jaeger. ``tx list`` pages through one DC's transactions.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import grpc
from google.protobuf import json_format

from txsync.cli.connect import (
    TIMEOUT_S,
    add_connection_arguments,
    channel,
    describe,
    metadata,
    target,
)
from txsync.v1 import admin_pb2, admin_pb2_grpc, client_pb2, client_pb2_grpc, common_pb2

LIST_ROWS_MAX = 10_000
EPILOG = """\
examples:
  txsync tx get 5e0b3c1a-... --dc dc2
  txsync tx list --dc dc1 --state failed
  txsync tx list --endpoints 127.0.0.1:7101 --limit 20 -o json

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
    address = target(options).address
    try:
        with channel(address, options) as open_channel:
            stub = client_pb2_grpc.ClientServiceStub(open_channel)
            got = stub.Get(
                client_pb2.GetRequest(tx_id=options.tx_id, include_body=True),
                timeout=TIMEOUT_S,
                metadata=metadata(options),
            )
            everywhere = admin_pb2_grpc.AdminServiceStub(open_channel).GetTransaction(
                admin_pb2.GetTransactionRequest(tx_id=options.tx_id),
                timeout=TIMEOUT_S * 2,
                metadata=metadata(options),
            )
    except grpc.RpcError as error:
        print(f"error: {address}: {describe(error)}", file=sys.stderr)
        return 1
    if options.output == "json":
        answer = json_format.MessageToDict(got, preserving_proto_field_name=True)
        answer["trace_id"] = everywhere.trace_id
        answer["dcs"] = [
            json_format.MessageToDict(dc, preserving_proto_field_name=True) for dc in everywhere.dcs
        ]
        print(json.dumps(answer, indent=2))
        return 0
    print(f"{got.tx_id}  {_state(got.state)}  position {got.position or '-'}")
    if everywhere.trace_id:
        print(f"  trace: {everywhere.trace_id}")
    for statement in got.body.statements:
        print(f"  sql: {statement.sql}")
    for dc in everywhere.dcs:
        print(f"  at {dc.node_id}: {_state(dc.state)}")
        for step in dc.history:
            when = step.at.ToDatetime().isoformat(timespec="milliseconds")
            print(f"    {when}Z  {_state(step.state):<9} {step.service}")
    if got.HasField("outcome"):
        outcome = got.outcome
        detail = outcome.error or f"rows affected {list(outcome.rows_affected)}"
        digest = outcome.state_digest.hex()[:16]
        print(f"  outcome: {_state(outcome.state)}, {detail}, digest {digest}")
    return 0


def run_list(options: argparse.Namespace) -> int:
    address = target(options).address
    rows: list[dict[str, Any]] = []
    token = ""
    try:
        with channel(address, options) as open_channel:
            stub = client_pb2_grpc.ClientServiceStub(open_channel)
            while len(rows) < options.limit:
                page = stub.List(
                    client_pb2.ListRequest(
                        state=STATES.get(options.state, common_pb2.TX_STATE_UNSPECIFIED),
                        page_size=min(1_000, options.limit - len(rows)),
                        page_token=token,
                    ),
                    timeout=TIMEOUT_S,
                    metadata=metadata(options),
                )
                rows += [
                    {"tx_id": t.tx_id, "state": _state(t.state), "position": t.position}
                    for t in page.transactions
                ]
                token = page.next_page_token
                if not token:
                    break
    except grpc.RpcError as error:
        print(f"error: {address}: {describe(error)}", file=sys.stderr)
        return 1
    if options.output == "json":
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(f"{row['tx_id']}  {row['state']:<9} {row['position'] or '-'}")
        print(f"({len(rows)} transaction{'s' if len(rows) != 1 else ''})")
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
            parser.add_argument("tx_id", help="the transaction's id (from txsync submit)")
        else:
            parser.add_argument("--state", choices=sorted(STATES), help="only this state")
            parser.add_argument("--limit", type=int, default=100, help="at most this many")
        add_connection_arguments(parser)
        parser.set_defaults(handler=handler)
