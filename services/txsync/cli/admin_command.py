"""Operators' admin commands: ``member add|remove|set-weight``, ``rounds``,
``sync pause|resume`` and ``log truncate``, through a DC's transaction-store.

A membership change is ordered like a transaction and applied by the next view change;
``member`` waits (showing each view installed) until the view has, or no longer has, the
node, or until ``--timeout``. A change ordered after another one it was not taken
against is void (one change at a time across the cluster): ``member`` says so once the
DC's configuration has passed the change's position without it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import grpc

from txsync.cli.connect import (
    TIMEOUT_S,
    Target,
    add_connection_arguments,
    channel,
    describe,
    metadata,
    print_table,
    target,
)
from txsync.v1 import admin_pb2, admin_pb2_grpc, client_pb2, client_pb2_grpc, peer_pb2

EPILOG = """\
examples:
  txsync member add dc4 --url 10.0.4.10:7402 --weight 1
  txsync member remove dc3 --timeout 120
  txsync rounds --dc dc2 --limit 20
  txsync sync pause --dc dc3      # dc3 stops taking part; the others exclude it
  txsync sync resume --dc dc3
  txsync log truncate --dc dc1    # as far as every peer and worker allows

exit status: 0 done, 1 refused, void or unreachable, 2 bad arguments, 3 timed out
waiting.
"""


def _stub(
    asked: Target, options: argparse.Namespace
) -> tuple[grpc.Channel, admin_pb2_grpc.AdminServiceStub]:
    open_channel = channel(asked.address, options, asked.dc)
    return open_channel, admin_pb2_grpc.AdminServiceStub(open_channel)


def run_member(options: argparse.Namespace) -> int:
    asked = target(options)
    if options.member_command == "add":
        request = admin_pb2.ChangeMembershipRequest(
            add=peer_pb2.Member(
                node_id=options.node, url=options.url, weight=options.weight,
                witness=options.witness,
            )
        )  # fmt: skip
    elif options.member_command == "remove":
        request = admin_pb2.ChangeMembershipRequest(remove_node_id=options.node)
    else:
        request = admin_pb2.ChangeMembershipRequest(
            set_weight=peer_pb2.Member(node_id=options.node, weight=options.weight)
        )
    wanted_in_view = options.member_command != "remove"
    open_channel, stub = _stub(asked, options)
    with open_channel:
        try:
            changed = stub.ChangeMembership(request, timeout=TIMEOUT_S, metadata=metadata(options))
        except grpc.RpcError as error:
            print(f"error: {describe(error)}", file=sys.stderr)
            return 1
        print(f"membership change ordered as {changed.tx_id}; waiting for a view that "
              f"{'has' if wanted_in_view else 'drops'} {options.node} ...", flush=True)  # fmt: skip
        deadline = time.monotonic() + options.timeout
        last_view = -1
        position = 0
        while time.monotonic() < deadline:
            try:
                local = stub.GetStatus(
                    admin_pb2.GetStatusRequest(), timeout=TIMEOUT_S, metadata=metadata(options)
                ).local
            except grpc.RpcError as error:
                print(f"  ({describe(error)}; retrying)", flush=True)
                time.sleep(1)
                continue
            position = position or _ordered_at(open_channel, changed.tx_id, options)
            applied = local.configuration.applied_position
            if position and applied >= position and not _configured_as_asked(local, options):
                print(f"error: the change at position {position} was void: another "
                      "membership change was ordered before it, taken against the same "
                      f"configuration (this DC's configuration is at position {applied}); "
                      "see `txsync status` and ask again", file=sys.stderr)  # fmt: skip
                return 1
            members = list(local.view.members)
            if local.view.view_no != last_view:
                last_view = local.view.view_no
                print(f"  view {last_view}: {', '.join(members)}", flush=True)
            weight_fine = options.member_command != "set-weight" or _weight_applied(local, options)
            if (options.node in members) == wanted_in_view and weight_fine:
                print("done.")
                return 0
            time.sleep(0.3)
    print(f"timed out after {options.timeout:.0f} s; the change stays ordered and the next "
          "view change applies it", file=sys.stderr)  # fmt: skip
    return 3


def _ordered_at(channel: grpc.Channel, tx_id: str, options: argparse.Namespace) -> int:
    """The change's position in the agreed order at this DC (0 until it has one)."""
    stub = client_pb2_grpc.ClientServiceStub(channel)
    request = client_pb2.GetRequest(tx_id=tx_id)
    try:
        return stub.Get(request, timeout=TIMEOUT_S, metadata=metadata(options)).position
    except grpc.RpcError:
        return 0  # a call that failed: asked again at the next look


def _configured_as_asked(local: admin_pb2.DcStatus, options: argparse.Namespace) -> bool:
    """The DC's configuration shows the change as it was asked."""
    weights = {weight.node_id: weight.weight for weight in local.configuration.weights}
    node: str = options.node
    if options.member_command == "add":
        return node in weights
    if options.member_command == "remove":
        return node not in weights
    asked: int = options.weight
    return weights.get(node) == asked


def _weight_applied(local: admin_pb2.DcStatus, options: argparse.Namespace) -> bool:
    if local.node_id == options.node:
        return True  # our own weight is not listed among the peers; the view has us
    return any(
        p.member.node_id == options.node and p.member.weight == options.weight for p in local.peers
    )


def run_rounds(options: argparse.Namespace) -> int:
    asked = target(options)
    open_channel, stub = _stub(asked, options)
    with open_channel:
        try:
            answer = stub.ListRounds(
                admin_pb2.ListRoundsRequest(limit=options.limit),
                timeout=TIMEOUT_S,
                metadata=metadata(options),
            )
        except grpc.RpcError as error:
            print(f"error: {describe(error)}", file=sys.stderr)
            return 1
    rounds: list[dict[str, Any]] = [
        {
            "round": r.round_no,
            "started": r.started.ToDatetime().isoformat(timespec="milliseconds") + "Z",
            "duration_ms": round(r.duration.ToNanoseconds() / 1e6, 1),
            "outcome": r.outcome,
            "idle": r.idle,
            "posts_sent": r.posts_sent,
            "posts_received": r.posts_received,
            "added": r.added,
        }
        for r in answer.rounds
    ]
    if options.output == "json":
        print(json.dumps(rounds, indent=2))
        return 0
    rows = [("ROUND", "STARTED", "MS", "OUTCOME", "SENT", "RECEIVED", "ADDED", "IDLE")]
    for r in rounds:
        rows.append((
            str(r["round"]), r["started"], str(r["duration_ms"]), r["outcome"],
            str(r["posts_sent"]), str(r["posts_received"]), str(r["added"]),
            "yes" if r["idle"] else "",
        ))  # fmt: skip
    print_table(rows)
    return 0


def run_sync(options: argparse.Namespace) -> int:
    asked = target(options)
    open_channel, stub = _stub(asked, options)
    with open_channel:
        try:
            if options.sync_command == "pause":
                stub.PauseSync(admin_pb2.PauseSyncRequest(), timeout=TIMEOUT_S,
                               metadata=metadata(options))  # fmt: skip
            else:
                stub.ResumeSync(admin_pb2.ResumeSyncRequest(), timeout=TIMEOUT_S,
                                metadata=metadata(options))  # fmt: skip
        except grpc.RpcError as error:
            print(f"error: {describe(error)}", file=sys.stderr)
            return 1
    done = "paused" if options.sync_command == "pause" else "resumed"
    print(f"sync {done} at {asked.dc or asked.address}")
    return 0


def run_log(options: argparse.Namespace) -> int:
    asked = target(options)
    open_channel, stub = _stub(asked, options)
    with open_channel:
        try:
            answer = stub.TruncateLog(
                admin_pb2.TruncateLogRequest(below_position=options.below),
                timeout=60,
                metadata=metadata(options),
            )
        except grpc.RpcError as error:
            print(f"error: {describe(error)}", file=sys.stderr)
            return 1
    if options.output == "json":
        print(json.dumps({"truncated": answer.truncated, "backup_file": answer.backup_file}))
    else:
        print(f"moved {answer.truncated} entries to {answer.backup_file or '(nothing to move)'}")
    return 0


def register(commands: Any) -> None:
    def command(parent: Any, name: str, summary: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = parent.add_parser(
            name,
            help=summary,
            description=summary[0].upper() + summary[1:] + ".",
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        return parser

    member = command(commands, "member", "add or remove a node, or change its weight")
    members = member.add_subparsers(dest="member_command", metavar="ACTION", required=True)
    for action, summary in (
        ("add", "add a node (it must be running with --join)"),
        ("remove", "remove a node (drain its DC's clients first)"),
        ("set-weight", "change a node's vote weight"),
    ):
        parser = command(members, action, summary)
        parser.add_argument("node", help="the node id")
        if action == "add":
            parser.add_argument("--url", required=True, help="its sync-coordinator, HOST:PORT")
            parser.add_argument("--witness", action="store_true", help="it is a witness")
        if action != "remove":
            parser.add_argument("--weight", type=int, default=1, help="vote weight (default 1)")
        parser.add_argument("--timeout", type=float, default=60.0,
                            help="seconds to wait for the view change (default 60)")  # fmt: skip
        add_connection_arguments(parser)
        parser.set_defaults(handler=run_member)

    rounds = command(commands, "rounds", "a DC's recent protocol rounds, newest first")
    rounds.add_argument("--limit", type=int, default=20, help="how many (1..1000, default 20)")
    add_connection_arguments(rounds)
    rounds.set_defaults(handler=run_rounds)

    sync = command(commands, "sync", "pause or resume a DC's part in the protocol")
    actions = sync.add_subparsers(dest="sync_command", metavar="ACTION", required=True)
    for action, summary in (
        ("pause", "stop this DC's rounds (others exclude it; its submits wait)"),
        ("resume", "take part again (the DC catches up and rejoins)"),
    ):
        parser = command(actions, action, summary)
        add_connection_arguments(parser, outputs=("text",))
        parser.set_defaults(handler=run_sync)

    log = command(commands, "log", "txlog maintenance")
    log_actions = log.add_subparsers(dest="log_command", metavar="ACTION", required=True)
    truncate = command(log_actions, "truncate", "move history every peer and worker has passed "
                       "to a backup file")  # fmt: skip
    truncate.add_argument(
        "--below", type=int, default=0, help="position to cut below (default: all allowed)"
    )
    add_connection_arguments(truncate, outputs=("text", "json"))
    truncate.set_defaults(handler=run_log)
