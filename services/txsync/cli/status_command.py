"""``txsync status``, ``txsync members`` and ``txsync workers``: the cluster's health.

All three ask a DC's transaction-store, the DC's admin front door, which merges its own
part with the sync-coordinator's and the worker-dispatch's and, for the cluster view,
asks the other DCs' stores. If the DC asked does not answer, ``status`` tries the next
one the endpoints name. Tables for people, ``-o json`` for scripts; the exit status is
0 only if everything shown is healthy.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC
from typing import Any

import grpc

from txsync.cli.connect import (
    TIMEOUT_S,
    Target,
    add_connection_arguments,
    all_targets,
    channel,
    describe,
    metadata,
    print_table,
    target,
)
from txsync.v1 import admin_pb2, admin_pb2_grpc
from txsync.worker.backend import KEYS_REMEMBERED

WORKERS_SCALE_MAX = 64

EPILOG = """\
examples:
  txsync status                                  # every DC, asked through the first
  txsync status --dc dc2 --local                 # only dc2
  txsync status -o json | jq '.[] | {dc, lag}'
  txsync members --dc dc1
  txsync workers --endpoints 127.0.0.1:7101
  txsync workers scale --dc dc2 --replicas 4     # patches txsync-dc2/txsync-dc2-workers

exit status: 0 all healthy, 1 something is not (the output says what), 2 bad arguments
or no cluster file. A WARNING (a worker's disk filling, a database larger than planned)
is shown but leaves the exit status 0: the DC still applies.
"""


def _name(enum: Any, value: int, prefix: str) -> str:
    return str(enum.Name(value)).removeprefix(prefix)


def dc_report(status: admin_pb2.DcStatus) -> dict[str, Any]:
    return {
        "dc": status.node_id,
        "healthy": status.healthy,
        "quorum": _name(admin_pb2.QuorumState, status.quorum, "QUORUM_STATE_"),
        "mode": _name(admin_pb2.SyncMode, status.mode, "SYNC_MODE_"),
        "view": status.view.view_no,
        "members": list(status.view.members),
        "synced": status.merge_base.synced_len,
        "lag": status.lag,
        "incoming": status.incoming_len,
        "counter": status.counter,
        "workers_healthy": status.workers_healthy,
        "workers_total": status.workers_total,
        "alarms": list(status.alarms),
        "warnings": list(status.warnings),
        "retention": {
            "history_from": status.retention.history_from,
            "truncatable_below": status.retention.truncatable_below,
            "txs_held": status.retention.txs_held,
            "held_by": status.retention.held_by,
            "truncated_total": status.retention.truncated_total,
        },
        "idempotency": {
            "window_s": status.retention.idempotency_window.ToMilliseconds() / 1000,
            "positions": KEYS_REMEMBERED,
        },
    }


def _keys_kept(idempotency: dict[str, float]) -> str:
    """How long a DC's keys are remembered, as the table shows it: ``1h or 262,144``."""
    seconds = int(idempotency["window_s"])
    shown = next(
        (f"{seconds // size}{unit}" for size, unit in ((86_400, "d"), (3_600, "h"), (60, "m"))
         if seconds and seconds % size == 0),
        f"{seconds}s",
    )  # fmt: skip
    return f"{shown} or {int(idempotency['positions']):,}"


def _get_status(options: argparse.Namespace, asked: Target, cluster: bool) -> list[Any]:
    with channel(asked.address, options, asked.dc) as open_channel:
        stub = admin_pb2_grpc.AdminServiceStub(open_channel)
        answer = stub.GetStatus(
            admin_pb2.GetStatusRequest(cluster=cluster),
            timeout=TIMEOUT_S * 2,
            metadata=metadata(options),
        )
    return [answer.local, *answer.others]


def run_status(options: argparse.Namespace) -> int:
    failures = []
    for asked in all_targets(options):
        try:
            statuses = _get_status(options, asked, cluster=not options.local)
            break
        except grpc.RpcError as error:
            failures.append(f"{asked.dc or asked.address}: {describe(error)}")
    else:
        print("no DC answered:\n  " + "\n  ".join(failures))
        return 1
    reports = [dc_report(status) for status in statuses]
    if options.output == "json":
        print(json.dumps(reports, indent=2))
    else:
        rows = [("DC", "QUORUM", "MODE", "VIEW", "MEMBERS", "SYNCED", "LAG", "INCOMING",
                 "WORKERS", "HISTORY", "KEYS KEPT", "HEALTHY")]  # fmt: skip
        for r in reports:
            rows.append((
                r["dc"], r["quorum"], r["mode"], str(r["view"]), ",".join(r["members"]),
                str(r["synced"]), str(r["lag"]), str(r["incoming"]),
                f"{r['workers_healthy']}/{r['workers_total']}",
                f"{r['retention']['history_from']}-", _keys_kept(r["idempotency"]),
                "yes" if r["healthy"] else "no",
            ))  # fmt: skip
        print_table(rows)
        for r in reports:
            for alarm in r["alarms"]:
                print(f"{r['dc']}: {alarm}")
            for warning in r["warnings"]:
                print(f"{r['dc']}: WARNING {warning}")
            if r["retention"]["held_by"]:
                # Not an alarm: a peer or worker a little behind holds history all the time.
                print(f"{r['dc']}: truncation held by {r['retention']['held_by']}")
        for failure in failures:
            print(f"(not answering: {failure})")
    return 0 if all(r["healthy"] for r in reports) and not failures else 1


def run_members(options: argparse.Namespace) -> int:
    asked = target(options)
    try:
        (local,) = _get_status(options, asked, cluster=False)
    except grpc.RpcError as error:
        print(f"error: {asked.dc or asked.address}: {describe(error)}")
        return 1
    members = set(local.view.members)
    rows: list[dict[str, Any]] = [
        {
            "node": local.node_id,
            "in_view": local.node_id in members,
            "reachable": True,
            "synced": local.merge_base.synced_len,
            "counter": local.counter,
            "weight": None,
            "url": "(asked)",
            "last_heard": None,
        }
    ]
    for peer in local.peers:
        heard = peer.last_heard.ToDatetime(tzinfo=UTC) if peer.HasField("last_heard") else None
        rows.append(
            {
                "node": peer.member.node_id,
                "in_view": peer.member.node_id in members,
                "reachable": peer.reachable,
                "synced": peer.last_merge_base.synced_len,
                "counter": peer.last_counter,
                "weight": peer.member.weight,
                "url": peer.member.url,
                "last_heard": heard.isoformat(timespec="milliseconds") if heard else None,
            }
        )
    if options.output == "json":
        print(json.dumps({"view": local.view.view_no, "members": rows}, indent=2))
    else:
        print(f"view {local.view.view_no} as {local.node_id} sees it")
        table = [
            ("NODE", "IN VIEW", "REACHABLE", "SYNCED", "COUNTER", "WEIGHT", "URL", "LAST HEARD")
        ]
        for r in rows:
            table.append((
                r["node"], "yes" if r["in_view"] else "no", "yes" if r["reachable"] else "no",
                str(r["synced"]), str(r["counter"]),
                "" if r["weight"] is None else str(r["weight"]), r["url"], r["last_heard"] or "",
            ))  # fmt: skip
        print_table(table)
    return 0 if all(r["in_view"] and r["reachable"] for r in rows) else 1


def run_scale(options: argparse.Namespace) -> int:
    """Patch the DC's worker StatefulSet (what `kubectl scale` does), with the user's
    kubeconfig; dispatch then brings new workers up and drains removed ones."""
    if options.replicas is None or not 0 <= options.replicas <= WORKERS_SCALE_MAX:
        print(f"error: give --replicas 0..{WORKERS_SCALE_MAX}", file=sys.stderr)
        return 2
    if not options.dc:
        print("error: give --dc (which DC's workers)", file=sys.stderr)
        return 2
    release = options.release or f"txsync-{options.dc}"
    namespace = options.namespace or release
    statefulset = f"{release}-workers"
    # The Kubernetes client costs about half a second to import: only here.
    from kubernetes import client as kube_client  # noqa: PLC0415
    from kubernetes import config as kube_config  # noqa: PLC0415

    from txsync.worker_dispatch.kubernetes_workers import api_client, scale_workers  # noqa: PLC0415

    try:
        if options.kubernetes_api:
            api = api_client(options.kubernetes_api)
        else:
            kube_config.load_kube_config(context=options.context)
            api = kube_client.ApiClient()
        before = scale_workers(api, namespace, statefulset, options.replicas)
    except Exception as error:  # the client's config and API errors have no common base
        print(f"error: scaling {namespace}/{statefulset}: {error}", file=sys.stderr)
        return 1
    print(f"{namespace}/{statefulset}: {before} -> {options.replicas} workers")
    return 0


def run_workers(options: argparse.Namespace) -> int:
    if options.action == "scale":
        return run_scale(options)
    listed: dict[str, list[dict[str, Any]]] = {}
    failures = []
    alarms, warnings = [], []
    for asked in all_targets(options):
        try:
            with channel(asked.address, options, asked.dc) as open_channel:
                stub = admin_pb2_grpc.AdminServiceStub(open_channel)
                answer = stub.ListWorkers(
                    admin_pb2.ListWorkersRequest(), timeout=TIMEOUT_S, metadata=metadata(options)
                )
        except grpc.RpcError as error:
            failures.append(f"{asked.dc or asked.address}: {describe(error)}")
            continue
        alarms += [f"{asked.dc or asked.address}: ALARM {alarm}" for alarm in answer.alarms]
        warnings += [f"{asked.dc or asked.address}: WARNING {w}" for w in answer.warnings]
        listed[asked.dc or asked.address] = [
            {
                "worker": w.worker_id,
                "testing": w.testing,
                "healthy": w.healthy,
                "out_of_sync": w.out_of_sync,
                "position": w.position,
                "state_digest": w.state_digest.hex(),
                "recovery": round(w.recovery_progress, 3),
            }
            for w in answer.workers
        ]
    if options.output == "json":
        print(json.dumps(listed, indent=2))
    else:
        rows = [("DC", "WORKER", "ROLE", "HEALTHY", "POSITION", "IN SYNC", "RECOVERY")]
        for dc, workers in listed.items():
            for w in workers:
                rows.append((
                    dc, w["worker"], "testing" if w["testing"] else "",
                    "yes" if w["healthy"] else "no", str(w["position"]),
                    "no" if w["out_of_sync"] else "yes",
                    f"{w['recovery']:.0%}" if w["recovery"] else "",
                ))  # fmt: skip
        print_table(rows)
        for failure in failures:
            print(f"(not answering: {failure})")
    for alarm in [*alarms, *warnings]:
        print(alarm, file=sys.stderr)
    fine = all(w["healthy"] and not w["out_of_sync"] for ws in listed.values() for w in ws)
    return 0 if fine and not failures and not alarms else 1


def register(commands: Any) -> None:
    for name, handler, summary in (
        ("status", run_status, "every DC's quorum, view, queues, lag, workers, alarms, warnings"),
        ("members", run_members, "the view's members: weight, address, reachability, progress"),
        ("workers", run_workers, "every DC's workers: role, health, position, sync"),
    ):
        parser = commands.add_parser(
            name,
            help=summary,
            description=f"{summary.capitalize()}, from the DCs' admin API.",
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if name == "workers":
            parser.add_argument("action", nargs="?", choices=("list", "scale"), default="list",
                                help="list (default), or scale the worker StatefulSet")  # fmt: skip
            k8s = parser.add_argument_group("scale (Kubernetes)")
            k8s.add_argument("--replicas", type=int, help="how many workers the DC should run")
            k8s.add_argument("--release", help="the DC's Helm release (default txsync-DC)")
            k8s.add_argument("--namespace", help="default: the release's name")
            k8s.add_argument("--context", help="kubeconfig context (default: current)")
            k8s.add_argument("--kubernetes-api", metavar="URL", help=argparse.SUPPRESS)
        if name == "status":
            scope = parser.add_mutually_exclusive_group()
            scope.add_argument(
                "--cluster", action="store_true", help="every DC, gathered by one (default)"
            )
            scope.add_argument("--local", action="store_true", help="only the DC asked")
        add_connection_arguments(parser)
        parser.set_defaults(handler=handler)
