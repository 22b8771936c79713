"""The ``txsync`` command. Each subcommand lives in its own module under ``txsync.cli``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from txsync import __version__, dev_cluster
from txsync.cli import (
    admin_command,
    query_command,
    sim_command,
    status_command,
    submit_command,
    tx_command,
)
from txsync.pipeline import command as pipeline_command
from txsync.sync_coordinator import server as sync_coordinator_server
from txsync.transaction_store import server as transaction_store_server
from txsync.worker import server as worker_server
from txsync.worker_dispatch import server as worker_dispatch_server


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="txsync",
        description=(
            "TxSync: multi-master, multi-data-center transaction replication. "
            "Several DCs accept writes, agree on one order with the TxLog sync protocol, "
            "and every SQL worker applies that order."
        ),
        epilog="Run `txsync COMMAND --help` for a command's options and examples.",
    )
    parser.add_argument("--version", action="version", version=f"txsync {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    sim_command.register(commands)
    transaction_store_server.register(commands)
    sync_coordinator_server.register(commands)
    worker_server.register(commands)
    worker_dispatch_server.register(commands)
    dev_cluster.register(commands)
    submit_command.register(commands)
    status_command.register(commands)
    tx_command.register(commands)
    query_command.register(commands)
    admin_command.register(commands)
    pipeline_command.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    options = parser.parse_args(argv)
    handler = options.handler
    try:
        code: int = handler(options)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
