"""``txsync submit``: send one transaction to a DC and optionally wait for a state."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import grpc

from txsync.cli.connect import add_connection_arguments, channel, metadata, target
from txsync.v1 import client_pb2, client_pb2_grpc, common_pb2

WAIT_STATES = {
    "incoming": common_pb2.TX_STATE_INCOMING,
    "accepted": common_pb2.TX_STATE_ACCEPTED,
    "enqueued": common_pb2.TX_STATE_ENQUEUED,
    "ok": common_pb2.TX_STATE_OK,
}

EPILOG = """\
parameters: each --param fills the next '?'. Whole numbers and decimals become numbers,
'null' becomes NULL, anything else is text; prefix 's:' to force text ('s:42').

examples:
  txsync submit --dc dc1 \\
      --sql 'INSERT INTO accounts (id, balance) VALUES (?, ?)' --param 1 --param 100
  txsync submit --dc dc2 --sql 'UPDATE accounts SET balance = balance - 10
      WHERE id = 1' --wait ok
  txsync submit --endpoints 127.0.0.1:7101 --sql 'DELETE FROM t' --wait accepted -o json

exit status: 0 reached the state waited for, 1 refused or unreachable, 3 timed out,
4 FAILED (the DC's testing worker's database refused it; the error is printed).
"""


def parse_param(text: str) -> common_pb2.SqlValue:
    if text.startswith("s:"):
        return common_pb2.SqlValue(text_value=text[2:])
    if text == "null":
        return common_pb2.SqlValue()
    try:
        return common_pb2.SqlValue(int_value=int(text))
    except ValueError:
        pass
    try:
        return common_pb2.SqlValue(real_value=float(text))
    except ValueError:
        return common_pb2.SqlValue(text_value=text)


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "submit",
        help="submit a write transaction to a DC",
        description="Submit one transaction (one SQL statement) to a DC's client API.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sql", required=True, help="one parameterised SQL statement")
    parser.add_argument("--param", action="append", default=[], help="a parameter; repeat")
    parser.add_argument("--key", default="", help="idempotency key (a retry returns the same tx)")
    parser.add_argument("--wait", choices=sorted(WAIT_STATES), help="wait for this state")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait (default 30)")
    add_connection_arguments(parser, outputs=("text", "json"))
    parser.set_defaults(handler=run)


def run(options: argparse.Namespace) -> int:
    address = target(options).address
    body = common_pb2.TxBody(
        statements=[
            common_pb2.Statement(sql=options.sql, params=[parse_param(p) for p in options.param])
        ]
    )
    started = time.monotonic()
    request = client_pb2.SubmitRequest(body=body, idempotency_key=options.key)
    if options.wait:
        request.wait_for = WAIT_STATES[options.wait]
        request.wait_timeout.FromNanoseconds(int(options.timeout * 1e9))
    with channel(address, options) as open_channel:
        stub = client_pb2_grpc.ClientServiceStub(open_channel)
        try:
            submitted = stub.Submit(
                request, timeout=options.timeout + 10, metadata=metadata(options)
            )
            result: dict[str, Any] = {
                "tx_id": submitted.tx_id,
                "created": submitted.created,
                "state": common_pb2.TxState.Name(submitted.state),
            }
            reached = submitted.reached
            if options.wait:
                if submitted.state == common_pb2.TX_STATE_FAILED:
                    result["error"] = submitted.outcome.error
                result["reached"] = reached
                result["elapsed_ms"] = round((time.monotonic() - started) * 1000, 1)
        except grpc.RpcError as error:
            code = error.code().name if hasattr(error, "code") else "UNKNOWN"
            details = error.details() if hasattr(error, "details") else str(error)
            print(f"error: {address}: {code}: {details}", file=sys.stderr)
            return 1
    if options.output == "json":
        print(json.dumps(result))
    else:
        line = f"{result['tx_id']}  {result['state']}"
        if "elapsed_ms" in result:
            line += f"  ({result['elapsed_ms']} ms)" if reached else "  (timed out)"
        if "error" in result:
            line += f"\n  {result['error']}"
        print(line)
    if "error" in result:
        return 4  # the DC's testing worker refused it: FAILED everywhere
    return 0 if reached else 3
