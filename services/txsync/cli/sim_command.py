"""``txsync sim``: run the protocol core through seeded fault schedules."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from txsync.sim import DEFAULT_MIXES, FAULT_NAMES, FaultMix, SeedOutcome, run_mix

SEEDS_MAX = 1_000_000
NODES_MAX = 9
TXS_MAX = 10_000

EXAMPLES = """\
examples:
  txsync sim                                   every default fault mix, 100 seeds each
  txsync sim --seeds 2000 --nodes 5 --faults delay,drop,duplicate,reorder,crash
  txsync sim --seed 1234 --nodes 3 --faults crash --txs 20    replay one seed
  txsync sim --faults drop --faults partition  two mixes, one summary line each

faults: delay (WAN latency), drop (lost messages), duplicate, reorder (non-FIFO links),
partition (split and heal, a third of the time one way only), flap (links cut and healed
every 10-60 ms), crash (crash-restart from durable state, some torn between the durable
writes and the sends), membership (operators add a spare node, remove nodes, change
weights). Partitions longer than 400 ms make the majority exclude the rest by a view
change. Invariants 1-6 of PROTOCOL.md section 4, and one view per view number, are checked
after every step; a violation prints the seed and the command that replays it, and the
exit status is 1.
"""


def _bounded_int(low: int, high: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high}")
        return value

    return parse


def _fault_mix(text: str) -> FaultMix:
    try:
        return FaultMix.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "sim",
        help="run the protocol core in the deterministic fault simulator",
        description=(
            "Run N seeded schedules of K nodes whose clients submit M transactions, under "
            "injected faults, checking the protocol's invariants after every step."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--seeds", type=_bounded_int(1, SEEDS_MAX), default=100, help="schedules per fault mix"
    )
    parser.add_argument(
        "--seed-start", type=_bounded_int(0, 2**62), default=0, help="first seed of the range"
    )
    parser.add_argument(
        "--seed",
        type=_bounded_int(0, 2**62),
        help="replay exactly this one seed (overrides --seeds and --seed-start)",
    )
    parser.add_argument("--nodes", type=_bounded_int(1, NODES_MAX), default=3, help="nodes (DCs)")
    parser.add_argument(
        "--txs", type=_bounded_int(0, TXS_MAX), default=20, help="transactions per schedule"
    )
    parser.add_argument(
        "--faults",
        type=_fault_mix,
        action="append",
        metavar="MIX",
        help=f"comma-separated faults from {{{','.join(FAULT_NAMES)}}} or 'none'; repeatable",
    )
    parser.add_argument(
        "--jobs",
        type=_bounded_int(1, 64),
        default=os.cpu_count() or 1,
        help="worker processes (default: one per core)",
    )
    parser.add_argument(
        "--unstamped-submits",
        action="store_true",
        help="the store writes every local submit unstamped, and the coordinator stamps "
        "it and writes its meta before posting, as before the store stamped them (the old "
        "regression seeds replay so)",
    )
    parser.add_argument(
        "--peer-hold-max",
        type=_bounded_int(0, 1_000_000),
        default=0,
        metavar="POSITIONS",
        help="each store lets go of a peer DC further behind than this (the store's "
        "--peer-hold-max): truncation passes it and it starts from a copy when back "
        "(default 0: no bound, as the services' defaults never reach in a schedule)",
    )
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="finish every seed of a mix after a violation instead of stopping at the first",
    )
    parser.set_defaults(handler=run)


def _report_violation(outcome: SeedOutcome) -> None:
    print(f"  VIOLATION seed={outcome.config.seed}: {outcome.violation}", file=sys.stderr)
    print(f"    replay: {outcome.replay_command()}", file=sys.stderr)


def run(options: argparse.Namespace) -> int:
    mixes: list[FaultMix] = options.faults or [FaultMix.parse(m) for m in DEFAULT_MIXES]
    if options.seed is not None:
        seeds = range(options.seed, options.seed + 1)
    else:
        seeds = range(options.seed_start, options.seed_start + options.seeds)
    print(
        f"txsync sim: {len(seeds)} seed(s) x {len(mixes)} fault mix(es), "
        f"{options.nodes} nodes, {options.txs} txs per schedule, {options.jobs} job(s)"
    )
    failed = 0
    for mix in mixes:
        started = time.monotonic()
        summary = run_mix(
            mix,
            seeds,
            nodes=options.nodes,
            txs=options.txs,
            jobs=options.jobs,
            stop_at_first=not options.keep_going,
            stamped_submits=not options.unstamped_submits,
            peer_hold_max=options.peer_hold_max,
        )
        print(summary.line(time.monotonic() - started), flush=True)
        for outcome in summary.failures:
            _report_violation(outcome)
        failed += len(summary.failures)
    if failed:
        print(f"{failed} schedule(s) violated an invariant", file=sys.stderr)
        return 1
    return 0
