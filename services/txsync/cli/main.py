"""The ``txsync`` command. Each subcommand lives in its own module under ``txsync.cli``
(or beside the service it runs).

Only the module of the command being run is imported: a service pulls in gRPC,
OpenTelemetry and its database driver, the status commands the Kubernetes client, the
simulator the whole protocol core, and paying for all of them on every call made each
``txsync`` command take over a second (docs/operations.md, "Start-up"). ``COMMANDS``
names each command's module and summary; ``txsync --help`` lists them without importing
any (a test holds the summaries to what the modules register).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import MutableMapping, Sequence

from txsync import __version__
from txsync.parent_watch import die_with_parent

COMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("txsync.cli.sim_command", "run the protocol core in the deterministic fault simulator"),
    "transaction-store": (
        "txsync.transaction_store.server",
        "run a DC's transaction-store (the txlog and the client API)",
    ),
    "sync-coordinator": (
        "txsync.sync_coordinator.server",
        "run a DC's sync-coordinator (rounds with the other DCs)",
    ),
    "worker": ("txsync.worker.server", "run a worker: apply the agreed order to a SQL database"),
    "worker-dispatch": (
        "txsync.worker_dispatch.server",
        "run a DC's worker-dispatch (feeds the agreed order to the workers)",
    ),
    "dev": ("txsync.dev_cluster", "local development cluster"),
    "submit": ("txsync.cli.submit_command", "submit a write transaction to a DC"),
    "status": (
        "txsync.cli.status_command",
        "every DC's quorum, view, queues, lag, workers, alarms, warnings",
    ),
    "members": (
        "txsync.cli.status_command",
        "the view's members: weight, address, reachability, progress",
    ),
    "workers": ("txsync.cli.status_command", "every DC's workers: role, health, position, sync"),
    "top": (
        "txsync.cli.top_command",
        "every DC's rounds/s, tx/s, lag and workers, refreshed in place",
    ),
    "tx": ("txsync.cli.tx_command", "look up transactions (get, list)"),
    "query": ("txsync.cli.query_command", "run a read-only SQL statement on a DC's worker"),
    "member": ("txsync.cli.admin_command", "add or remove a node, or change its weight"),
    "rounds": ("txsync.cli.admin_command", "a DC's recent protocol rounds, newest first"),
    "sync": ("txsync.cli.admin_command", "pause or resume a DC's part in the protocol"),
    "log": ("txsync.cli.admin_command", "txlog maintenance"),
    "access": (
        "txsync.cli.access_command",
        "make the access secret every DC shares (tokens and access.toml)",
    ),
    "pipeline": (
        "txsync.pipeline.command",
        "data pipeline jobs on Spark (export, audit-order, verify-replicas, report, load)",
    ),
}


def build_parser(command: str | None = None, *, every: bool = False) -> argparse.ArgumentParser:
    """The parser, with ``command``'s module registered for real (``every``: all modules,
    as the tests that check the summaries want) and the other commands listed by name
    and summary only."""
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
    registered: set[str] = set()
    for name, (module, summary) in COMMANDS.items():
        if module in registered:
            continue
        if every or name == command or (command, module) in _SIBLINGS:
            try:
                importlib.import_module(module).register(commands)
            except ModuleNotFoundError as missing:
                if every or (missing.name or "txsync").startswith("txsync"):
                    raise
                extra = EXTRAS.get(name, "server")
                parser.exit(2, (
                    f"txsync {name}: needs the {missing.name!r} package, which this install "
                    f"leaves out; install it with: pip install 'txsync[{extra}]'\n"
                ))  # fmt: skip
            registered.add(module)
        else:
            commands.add_parser(name, help=summary)
    return parser


EXTRAS = {"pipeline": "pipeline"}
"""The extra a command's packages come with, when not ``server`` (the client commands
need only the install's own dependencies)."""
_SIBLINGS = {(name, module) for name, (module, _) in COMMANDS.items()}
"""A module that registers several commands is imported for any of them."""

SERVICES = frozenset({"transaction-store", "sync-coordinator", "worker-dispatch", "worker"})
GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"
"""gRPC's transport for the services: its poller-driven one, not the EventEngine.

With the EventEngine (gRPC's default since 1.6x), every message crosses threads: its
I/O threads read the socket and hand the completion to grpc.aio's poller thread, which
wakes the event loop. The poller-driven transport reads and writes on the thread that
polls. Measured on 2 cores (``make bench-messages``, gRPC 1.85.1): a stream message each
way 198 -> 117 us of CPU at both ends, a unary call 400 -> 321; a 3-DC cluster at one
client per DC about 13% less CPU per transaction (docs/benchmarks.md, Tuning 20). The
EventEngine stays for the rest (timers, DNS); a ``GRPC_EXPERIMENTS`` the user set is kept
(docs/operations.md, "gRPC's transport")."""


def set_grpc_experiments(command: str | None, environ: MutableMapping[str, str]) -> None:
    """Before gRPC is imported: a service runs on ``GRPC_EXPERIMENTS`` unless the user
    chose otherwise."""
    if command in SERVICES:
        environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS)


def main(argv: Sequence[str] | None = None) -> int:
    die_with_parent()
    args = list(sys.argv[1:] if argv is None else argv)
    command = next((arg for arg in args if not arg.startswith("-")), None)
    set_grpc_experiments(command, os.environ)
    parser = build_parser(command if command in COMMANDS else None)
    options = parser.parse_args(args)
    handler = options.handler
    try:
        code: int = handler(options)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`txsync tx get ... | head`): stop quietly, as other
        # command-line tools do, and keep Python from complaining again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return code


if __name__ == "__main__":
    sys.exit(main())
