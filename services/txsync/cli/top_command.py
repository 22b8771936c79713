"""``txsync top``: every DC's rounds/s, transactions/s, lag and workers, refreshed in place.

For an operator without Grafana: every ``--interval`` it asks each DC's store (the admin
API: ``GetStatus``, ``ListRounds``, ``ListWorkers``, as ``status``, ``rounds`` and
``workers`` do) and shows one line per DC. Rates are what changed since the previous
refresh, divided by the time between the two: rounds/s from the newest round's number,
tx/s from the synced queue's length. On a terminal each refresh replaces the last; piped,
refreshes follow one another, each under a time line.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
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
)
from txsync.v1 import admin_pb2, admin_pb2_grpc

INTERVAL_S_DEFAULT = 2.0
INTERVAL_S_MIN = 0.2
"""Each refresh costs every DC's store three calls: not more often than this."""
CLEAR_SCREEN = "\x1b[H\x1b[2J"

EPILOG = """\
examples:
  txsync top                                  # every DC of data/cluster.json, every 2 s
  txsync top --endpoints dc1=10.0.1.5:7101,dc2=10.0.2.5:7101 --interval 5
  txsync top --count 3 | tee top.log          # three refreshes, one after another

columns: ROUNDS/S and TX/S since the previous refresh (synced positions a second); LAG,
positions behind the most advanced peer; WORKERS healthy/known; POSITIONS, the lowest and
highest applied position of the DC's workers.

exit status: 0 after --count refreshes or Ctrl-C, 2 bad arguments or no cluster file.
"""


@dataclass(frozen=True, slots=True)
class DcSample:
    """What one DC said at one refresh."""

    dc: str
    at: float
    """Monotonic seconds when asked."""
    quorum: str
    synced: int
    lag: int
    newest_round: int
    workers_healthy: int
    workers_total: int
    positions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DcLine:
    dc: str
    quorum: str
    rounds_per_s: float | None
    """None at the first refresh (no earlier sample to compare with)."""
    tx_per_s: float | None
    synced: int
    lag: int
    workers: str
    positions: str


def dc_line(now: DcSample, before: DcSample | None) -> DcLine:
    """A DC's line: ``now``, with rates since ``before`` (its previous sample, if any)."""
    rounds = tx = None
    if before is not None and now.at > before.at:
        elapsed = now.at - before.at
        rounds = max(0, now.newest_round - before.newest_round) / elapsed
        tx = max(0, now.synced - before.synced) / elapsed
    positions = f"{min(now.positions)}-{max(now.positions)}" if now.positions else "-"
    return DcLine(
        now.dc, now.quorum, rounds, tx, now.synced, now.lag,
        f"{now.workers_healthy}/{now.workers_total}", positions,
    )  # fmt: skip


def _sample(options: argparse.Namespace, asked: Target) -> DcSample:
    with channel(asked.address, options, asked.dc) as open_channel:
        stub = admin_pb2_grpc.AdminServiceStub(open_channel)
        call: dict[str, Any] = {"timeout": TIMEOUT_S, "metadata": metadata(options)}
        status = stub.GetStatus(admin_pb2.GetStatusRequest(), **call).local
        rounds = stub.ListRounds(admin_pb2.ListRoundsRequest(limit=1), **call).rounds
        workers = stub.ListWorkers(admin_pb2.ListWorkersRequest(), **call).workers
    return DcSample(
        dc=status.node_id or asked.dc or asked.address,
        at=time.monotonic(),
        quorum=admin_pb2.QuorumState.Name(status.quorum).removeprefix("QUORUM_STATE_"),
        synced=status.merge_base.synced_len,
        lag=status.lag,
        newest_round=rounds[0].round_no if rounds else 0,
        workers_healthy=status.workers_healthy,
        workers_total=status.workers_total,
        positions=tuple(w.position for w in workers if w.healthy),
    )


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _frame(lines: list[DcLine], unanswered: list[str]) -> None:
    rows = [("DC", "QUORUM", "ROUNDS/S", "TX/S", "SYNCED", "LAG", "WORKERS", "POSITIONS")]
    rows += [
        (line.dc, line.quorum, _rate(line.rounds_per_s), _rate(line.tx_per_s),
         f"{line.synced:,}", f"{line.lag:,}", line.workers, line.positions)
        for line in lines
    ]  # fmt: skip
    print_table(rows)
    for failure in unanswered:
        print(f"(not answering: {failure})")


def run_top(options: argparse.Namespace) -> int:
    if options.interval < INTERVAL_S_MIN:
        print(f"error: --interval: at least {INTERVAL_S_MIN} s", file=sys.stderr)
        return 2
    if options.count < 0:
        print("error: --count: 0 (until Ctrl-C) or more", file=sys.stderr)
        return 2
    targets = all_targets(options)
    in_place = sys.stdout.isatty()
    previous: dict[str, DcSample] = {}
    shown = 0
    try:
        while True:
            started = time.monotonic()
            lines, unanswered = [], []
            for asked in targets:
                try:
                    now = _sample(options, asked)
                except grpc.RpcError as error:
                    unanswered.append(f"{asked.dc or asked.address}: {describe(error)}")
                    continue
                lines.append(dc_line(now, previous.get(now.dc)))
                previous[now.dc] = now
            stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            print(CLEAR_SCREEN if in_place else ("" if shown == 0 else "\n"), end="")
            print(f"txsync top, {stamp}, every {options.interval:g} s (Ctrl-C ends)")
            _frame(lines, unanswered)
            sys.stdout.flush()
            shown += 1
            if options.count and shown >= options.count:
                return 0
            time.sleep(max(0.0, options.interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        return 0


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "top",
        help="every DC's rounds/s, tx/s, lag and workers, refreshed in place",
        description=(
            "Every DC's rounds/s, transactions/s, lag and workers' positions, refreshed\n"
            "in place, from the DCs' admin API: a live view for operators without Grafana."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--interval", type=float, default=INTERVAL_S_DEFAULT,
                        help=f"seconds between refreshes (default {INTERVAL_S_DEFAULT:g}, "
                        f"at least {INTERVAL_S_MIN:g})")  # fmt: skip
    parser.add_argument(
        "--count", type=int, default=0,
        help="stop after this many refreshes (default 0: until Ctrl-C)",
    )  # fmt: skip
    add_connection_arguments(parser, outputs=("table",))
    parser.set_defaults(handler=run_top)
