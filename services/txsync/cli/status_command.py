"""``txsync status`` and ``txsync workers``: the cluster's health at a glance.

Both read the endpoints from a ``cluster.json`` (written by ``txsync dev up``) and ask every
DC's services through the admin API: the sync-coordinator (view, quorum, queues, divergence
alarms), the transaction-store (txlog alarms) and the worker-dispatch (workers). Tables
for people, ``-o json`` for scripts; the exit status is 0 only if every DC is healthy.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from txsync.v1 import admin_pb2, admin_pb2_grpc

TIMEOUT_S = 3.0
EPILOG = """\
examples:
  txsync status --cluster data/cluster.json
  txsync workers --cluster data/cluster.json --dc dc2
  txsync status --cluster data/cluster.json -o json | jq '.[] | .quorum'

exit status: 0 every DC (and worker) healthy, 1 something is not (the table says what),
2 bad arguments or no cluster file.
"""


def _status(address: str) -> admin_pb2.DcStatus:
    with grpc.insecure_channel(address) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        return stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=TIMEOUT_S).local


def _workers(address: str) -> list[admin_pb2.WorkerStatus]:
    with grpc.insecure_channel(address) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        return list(stub.ListWorkers(admin_pb2.ListWorkersRequest(), timeout=TIMEOUT_S).workers)


def _dc_report(node: str, endpoints: dict[str, Any]) -> dict[str, Any]:
    report: dict[str, Any] = {"dc": node, "healthy": False, "alarms": []}
    try:
        coordinator = _status(endpoints["coordinator"])
        store = _status(endpoints["store"])
        workers = _workers(endpoints["dispatch"]) if endpoints.get("dispatch") else []
    except grpc.RpcError as error:
        report["error"] = f"unreachable: {error.code().name}"
        return report
    report.update(
        quorum=admin_pb2.QuorumState.Name(coordinator.quorum).removeprefix("QUORUM_STATE_"),
        view=coordinator.view.view_no,
        members=list(coordinator.view.members),
        synced=coordinator.merge_base.synced_len,
        incoming=coordinator.incoming_len,
        alarms=[*coordinator.alarms, *store.alarms],
        workers=[
            {
                "worker": w.worker_id,
                "testing": w.testing,
                "healthy": w.healthy,
                "out_of_sync": w.out_of_sync,
                "position": w.position,
                "recovery": round(w.recovery_progress, 3),
            }
            for w in workers
        ],
    )
    workers_fine = all(w.healthy and not w.out_of_sync for w in workers)
    report["healthy"] = coordinator.healthy and store.healthy and workers_fine
    return report


def _load(options: argparse.Namespace) -> dict[str, dict[str, Any]]:
    try:
        dcs: dict[str, dict[str, Any]] = json.loads(options.cluster.read_text())["dcs"]
    except (OSError, ValueError, KeyError) as error:
        print(
            f"error: cannot read {options.cluster} (is the cluster up?): {error}", file=sys.stderr
        )
        raise SystemExit(2) from None
    if options.dc:
        if options.dc not in dcs:
            print(f"error: no DC {options.dc!r} in {options.cluster}", file=sys.stderr)
            raise SystemExit(2)
        dcs = {options.dc: dcs[options.dc]}
    return dcs


def run_status(options: argparse.Namespace) -> int:
    reports = [_dc_report(node, endpoints) for node, endpoints in _load(options).items()]
    if options.output == "json":
        print(json.dumps(reports, indent=2))
    else:
        rows: list[tuple[str, ...]] = [
            ("DC", "QUORUM", "VIEW", "MEMBERS", "SYNCED", "INCOMING", "WORKERS", "HEALTHY")
        ]
        for r in reports:
            if "error" in r:
                rows.append((r["dc"], r["error"], "", "", "", "", "", "no"))
                continue
            fine = sum(1 for w in r["workers"] if w["healthy"] and not w["out_of_sync"])
            rows.append((
                r["dc"], r["quorum"], str(r["view"]), ",".join(r["members"]), str(r["synced"]),
                str(r["incoming"]), f"{fine}/{len(r['workers'])}", "yes" if r["healthy"] else "no",
            ))  # fmt: skip
        _print_table(rows)
        for r in reports:
            for alarm in r["alarms"]:
                print(f"{r['dc']}: {alarm}")
    return 0 if all(r["healthy"] for r in reports) else 1


def run_workers(options: argparse.Namespace) -> int:
    reports = [_dc_report(node, endpoints) for node, endpoints in _load(options).items()]
    if options.output == "json":
        print(json.dumps({r["dc"]: r.get("workers", []) for r in reports}, indent=2))
    else:
        rows: list[tuple[str, ...]] = [
            ("DC", "WORKER", "ROLE", "HEALTHY", "POSITION", "IN SYNC", "RECOVERY")
        ]
        for r in reports:
            for w in r.get("workers", []):
                rows.append((
                    r["dc"], w["worker"], "testing" if w["testing"] else "",
                    "yes" if w["healthy"] else "no", str(w["position"]),
                    "no" if w["out_of_sync"] else "yes",
                    f"{w['recovery']:.0%}" if w["recovery"] else "",
                ))  # fmt: skip
        _print_table(rows)
    workers_fine = all(
        w["healthy"] and not w["out_of_sync"] for r in reports for w in r.get("workers", [])
    )
    return 0 if workers_fine and all("error" not in r for r in reports) else 1


def _print_table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    sys.stdout.flush()


def register(commands: Any) -> None:
    for name, handler, summary in (
        ("status", run_status, "every DC's quorum, view, queues, workers and alarms"),
        ("workers", run_workers, "every DC's workers: role, health, position, sync"),
    ):
        parser = commands.add_parser(
            name,
            help=summary,
            description=f"{summary.capitalize()}, from the admin API of each DC's services.",
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.add_argument(
            "--cluster",
            type=Path,
            default=Path("data/cluster.json"),
            help="the endpoints file written by txsync dev up (default: data/cluster.json)",
        )
        parser.add_argument("--dc", help="only this DC")
        parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
        parser.set_defaults(handler=handler)
