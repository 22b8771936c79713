"""The sync-coordinator process: ``txsync sync-coordinator``.

Serves ``PeerService`` to the other DCs over mutual TLS (plaintext only when asked for
with ``--plaintext``) and drives rounds with them, reading and writing the txlog through
this DC's transaction-store.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1.health_pb2 import HealthCheckResponse

from txsync.access import add_access_argument, guarded_serving
from txsync.codec import WEIGHT_MAX
from txsync.protocol import MEMBERS_MAX, Limits, ProtocolNode, QuorumState, Timing
from txsync.protocol.limits import SettingError
from txsync.rpc import (
    add_health_and_reflection,
    add_service,
    announce,
    mark_serving,
    new_server,
    run_service,
    until_stopped,
)
from txsync.settings import COORDINATOR_SETTINGS, add_arguments
from txsync.sync_coordinator.admin import NOT_HERE as ADMIN_NOT_HERE
from txsync.sync_coordinator.admin import CoordinatorAdmin
from txsync.sync_coordinator.coordinator import Coordinator, CoordinatorConfig
from txsync.sync_coordinator.dc_copies import RESTARTING_EXIT_CODE
from txsync.sync_coordinator.fetch_queue import FETCH_QUEUE_MAX
from txsync.sync_coordinator.peer_link import TlsFiles
from txsync.sync_coordinator.peer_service import PeerServicer
from txsync.sync_coordinator.store_wire import SERVICE
from txsync.sync_coordinator.wire import WireError, check_node_id
from txsync.telemetry import Gauge, ServiceTelemetry, add_telemetry_arguments
from txsync.v1 import admin_pb2, peer_pb2

log = logging.getLogger("txsync.sync_coordinator")

PEER_SERVICE = peer_pb2.DESCRIPTOR.services_by_name["PeerService"]
ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["AdminService"]
QUORUM_HEALTH = "txsync.v1.Quorum"
"""Health-check service name that is SERVING only while this DC is in a majority view
(a readiness probe for clients; the overall health "" stays SERVING while the process
works, so a minority DC is not restarted for being cut off)."""


QUORUM_STATE_VALUES = {QuorumState.MINORITY: 0, QuorumState.MAJORITY: 1, QuorumState.VIEW_CHANGE: 2}


def _coordinator_gauges(coordinator: Coordinator) -> list[Gauge]:
    def read(value: Callable[[ProtocolNode], float]) -> Callable[[], float | None]:
        return lambda: None if coordinator.node is None else value(coordinator.node)

    return [
        Gauge(
            "txsync.quorum.majority",
            "1 while this DC is in a view holding a weight majority, else 0 (a minority "
            "adds nothing; its transactions stay INCOMING)",
            read(lambda node: float(node.quorum_state() is QuorumState.MAJORITY)),
        ),
        Gauge(
            "txsync.quorum.state",
            "0 minority, 1 majority, 2 view change under way",
            read(lambda node: QUORUM_STATE_VALUES[node.quorum_state()]),
        ),
        Gauge("txsync.view.number", "installed view", read(lambda node: node.view_no)),
        Gauge("txsync.view.members", "members of the view", read(lambda node: len(node.members))),
        Gauge(
            "txsync.synced.length",
            "entries in the synced queue",
            read(lambda node: node.merge_base.synced_len),
        ),
        Gauge(
            "txsync.incoming.length",
            "metas in the incoming queue",
            read(lambda node: len(node.incoming_metas())),
        ),
        Gauge(
            "txsync.lag",
            "synced entries this DC is behind the most advanced peer it hears from",
            lambda: None if coordinator.node is None else coordinator.lag(),
        ),
        Gauge(
            "txsync.lag.seconds",
            "how long ago a peer first had a synced position this DC still lacks (0 when "
            "none is ahead)",
            lambda: None if coordinator.node is None else coordinator.lag_seconds(),
            unit="s",
        ),
        Gauge(
            "txsync.body.fetches.queued",
            f"bodies queued to be fetched from peers (at most {FETCH_QUEUE_MAX})",
            lambda: coordinator.fetches.queued,
        ),
        Gauge(
            "txsync.divergence.alarms",
            "other DCs whose outcome digests differ from ours (0 while all agree)",
            lambda: coordinator.outcomes.alarm_count,
        ),
    ]


async def serve(
    config: CoordinatorConfig,
    *,
    listen: str,
    port_file: Path | None,
    grace_s: float,
    telemetry: ServiceTelemetry,
    admin_listen: str | None = None,
    metrics_listen: str | None = None,
    access_file: Path | None = None,
    store_wait_s: float = 60.0,
) -> int:
    coordinator = Coordinator(config, telemetry.metrics)
    telemetry.metrics.gauges(_coordinator_gauges(coordinator))
    fetches = coordinator.fetches
    telemetry.metrics.observed_counter(
        "txsync.bodies.fetched", "bodies fetched from peers", lambda: fetches.fetched
    )
    telemetry.metrics.observed_counter(
        "txsync.body.fetch.calls", "calls made to fetch bodies from peers", lambda: fetches.calls
    )
    interceptors = guarded_serving(telemetry, metrics_listen, access_file)
    if interceptors is None:
        return 2
    server = new_server(*interceptors)
    add_service(server, PeerServicer(coordinator), PEER_SERVICE)
    add_service(server, CoordinatorAdmin(coordinator), ADMIN_SERVICE, ADMIN_NOT_HERE)
    health_servicer = add_health_and_reflection(server, [PEER_SERVICE, ADMIN_SERVICE])
    healths = [health_servicer]
    admin_server = None
    if admin_listen is not None:
        # Plaintext admin and health for this host (probes, operators' CLI) beside the
        # mutual-TLS port the other DCs use.
        admin_server = new_server(*interceptors)
        add_service(admin_server, CoordinatorAdmin(coordinator), ADMIN_SERVICE, ADMIN_NOT_HERE)
        healths.append(add_health_and_reflection(admin_server, [ADMIN_SERVICE]))
        if admin_server.add_insecure_port(admin_listen) == 0:
            log.critical("cannot listen on %s (--admin-listen)", admin_listen)
            return 2
        await admin_server.start()
    if config.tls is None:
        log.warning("PLAINTEXT between DCs (--plaintext): for local development only")
        port = server.add_insecure_port(listen)
    else:
        port = server.add_secure_port(listen, config.tls.server_credentials())
    if port == 0:
        log.critical("cannot listen on %s", listen)
        return 2
    await server.start()
    try:
        await _start_when_the_store_answers(coordinator, store_wait_s)
    except grpc.aio.AioRpcError as error:
        log.critical(
            "cannot load the protocol state from the transaction-store at %s: %s: %s",
            config.store_address,
            error.code().name,
            error.details(),
        )
        await _stop_servers(server, admin_server, 0)
        return 3
    except RuntimeError as error:
        log.critical("%s", error)
        await _stop_servers(server, admin_server, 0)
        return 3
    for health in healths:
        await mark_serving(health, [PEER_SERVICE, ADMIN_SERVICE])

    publishing: set[asyncio.Task[None]] = set()

    def publish_quorum(quorum: QuorumState) -> None:
        status = (
            HealthCheckResponse.SERVING
            if quorum is QuorumState.MAJORITY
            else HealthCheckResponse.NOT_SERVING
        )
        for health in healths:
            task = asyncio.get_running_loop().create_task(health.set(QUORUM_HEALTH, status))
            publishing.add(task)  # the loop holds tasks only weakly
            task.add_done_callback(publishing.discard)

    coordinator.quorum_listeners.append(publish_quorum)
    assert coordinator.node is not None
    publish_quorum(coordinator.node.quorum_state())
    address = announce(listen, port, port_file)
    log.info("sync-coordinator %s listening on %s", config.node_id, address)
    if admin_listen is not None:
        log.info("admin and health (plaintext) on %s", admin_listen)

    await until_stopped(coordinator.failed)
    for health in healths:
        await health.enter_graceful_shutdown()
    await _stop_servers(server, admin_server, grace_s)
    await coordinator.stop()
    telemetry.close()
    if coordinator.restarting:
        log.warning("sync-coordinator ends to restart: %s", coordinator.restarting)
        return RESTARTING_EXIT_CODE
    if coordinator.failed.done():
        log.critical("sync-coordinator stopped: %s", coordinator.failed.result())
        return 1
    log.info("sync-coordinator stopped cleanly")
    return 0


async def _start_when_the_store_answers(coordinator: Coordinator, wait_s: float) -> None:
    """Load the protocol state, waiting up to ``wait_s`` for a store that is not up yet:
    the containers of a pod start together, in no order."""
    deadline = time.monotonic() + wait_s
    pause_s = 0.2
    while True:
        try:
            await coordinator.start()
            return
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            log.warning(
                "waiting for the transaction-store at %s (%s)",
                coordinator.config.store_address,
                error.code().name,
            )
            await asyncio.sleep(pause_s)
            pause_s = min(pause_s * 2, 2.0)


async def _stop_servers(
    server: grpc.aio.Server, admin_server: grpc.aio.Server | None, grace_s: float
) -> None:
    await server.stop(grace_s)
    if admin_server is not None:
        await admin_server.stop(grace_s)


def _peer(text: str) -> tuple[str, str]:
    node_id, separator, address = text.partition("=")
    if not separator or ":" not in address:
        raise argparse.ArgumentTypeError(f"{text!r} is not NODE_ID=HOST:PORT")
    try:
        check_node_id(node_id, "peer")
    except WireError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return node_id, address


def _weight(text: str) -> tuple[str, int]:
    node_id, separator, number = text.partition("=")
    if not separator or not number.isdigit() or not 1 <= int(number) <= WEIGHT_MAX:
        raise argparse.ArgumentTypeError(f"{text!r} is not NODE_ID=N with 1 <= N <= {WEIGHT_MAX}")
    try:
        check_node_id(node_id, "weight")
    except WireError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return node_id, int(number)


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "sync-coordinator",
        help="run a DC's sync-coordinator (rounds with the other DCs)",
        description=(
            "Agree with the other DCs on one order of all transactions (the TxLog sync "
            "protocol), through this DC's transaction-store."
        ),
        epilog=(
            "example:\n  txsync sync-coordinator --node-id dc1 --store 127.0.0.1:7001 "
            "--listen 127.0.0.1:7101 \\\n      --peer dc2=127.0.0.1:7201 --peer dc3=127.0.0.1:7301 "
            "\\\n      --tls-ca certs/ca.pem --tls-cert certs/dc1.pem --tls-key certs/dc1.key"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--node-id", required=True, help="this DC's node id")
    parser.add_argument("--store", required=True, help="host:port of this DC's transaction-store")
    parser.add_argument(
        "--peer",
        type=_peer,
        action="append",
        default=[],
        metavar="ID=HOST:PORT",
        help="another DC's coordinator; repeat per DC",
    )
    parser.add_argument(
        "--weight",
        type=_weight,
        action="append",
        default=[],
        metavar="ID=N",
        help="vote weight of a node (default 1 each); a view needs more than half the total",
    )
    parser.add_argument(
        "--join",
        action="store_true",
        help="join a running cluster: start outside the configuration and wait to be added "
        "(txsync admin ChangeMembership add, at any DC); --peer lists the current nodes",
    )
    parser.add_argument("--listen", default="127.0.0.1:7101", help="host:port for PeerService")
    parser.add_argument("--port-file", type=Path, help="write the bound host:port here")
    parser.add_argument(
        "--admin-listen",
        metavar="HOST:PORT",
        help="also serve admin and health checks in plaintext here (probes, local CLI)",
    )
    tuning = parser.add_argument_group("timings and limits (defaults suit a laptop and a WAN)")
    add_arguments(tuning, COORDINATOR_SETTINGS)
    parser.add_argument("--grace-seconds", type=float, default=5.0)
    tls = parser.add_argument_group(
        "security between DCs (mutual TLS; scripts/dev_ca.py makes development certificates)"
    )
    tls.add_argument("--tls-ca", type=Path, help="CA certificate (PEM) that signs every node")
    tls.add_argument("--tls-cert", type=Path, help="this node's certificate (PEM, CN = node id)")
    tls.add_argument("--tls-key", type=Path, help="this node's private key (PEM)")
    tls.add_argument(
        "--plaintext",
        action="store_true",
        help="no TLS between DCs: only for local development on loopback",
    )
    add_access_argument(parser)
    add_telemetry_arguments(parser)
    parser.set_defaults(handler=run)


def protocol_settings(options: argparse.Namespace) -> tuple[Timing, Limits]:
    """The core's timings and limits from the flags. Their bounds are checked where they
    are declared (``protocol.limits``); ValueError names the flags."""
    try:
        timing = Timing(**{name: getattr(options, name) for name in Timing.__dataclass_fields__})
        limits = Limits(
            incoming_txs_max=options.incoming_txs_max,
            local_admit_txs_max=min(
                Limits().local_admit_txs_max, options.incoming_txs_max // MEMBERS_MAX
            ),
            post_txs_max=options.post_txs_max,
            catchup_entries_max=options.catchup_entries_max,
            synced_window_max=options.synced_window_max,
        )
    except SettingError as error:
        raise ValueError(_as_flags(f"{error.name} {error.problem}")) from None
    return timing, limits


def _as_flags(text: str) -> str:
    """The settings named in ``text`` (snake_case fields) as their flags."""
    return re.sub(r"\b[a-z]+(?:_[a-z]+)+\b", lambda m: "--" + m[0].replace("_", "-"), text)


def run(options: argparse.Namespace) -> int:
    peers = dict(options.peer)
    if len(peers) != len(options.peer) or options.node_id in peers:
        print("error: every --peer needs its own node id, other than --node-id", file=sys.stderr)
        return 2
    if len(peers) + 1 > MEMBERS_MAX:
        print(f"error: at most {MEMBERS_MAX} nodes", file=sys.stderr)
        return 2
    weights = dict(options.weight)
    unknown = sorted(set(weights) - {options.node_id, *peers})
    if unknown:
        print(f"error: --weight for unconfigured node(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    try:
        timing, limits = protocol_settings(options)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    tls_files = (options.tls_ca, options.tls_cert, options.tls_key)
    if options.plaintext == any(tls_files) or (any(tls_files) and not all(tls_files)):
        print(
            "error: give --tls-ca, --tls-cert and --tls-key (mutual TLS between DCs), "
            "or --plaintext for local development",
            file=sys.stderr,
        )
        return 2
    tls = None
    if not options.plaintext:
        try:
            tls = TlsFiles(*(path.read_bytes() for path in tls_files))
        except OSError as error:
            print(f"error: cannot read TLS files: {error}", file=sys.stderr)
            return 2
    config = CoordinatorConfig(
        tls=tls,
        node_id=options.node_id,
        peers=peers,
        weights=weights,
        joining=options.join,
        store_address=options.store,
        timing=timing,
        limits=limits,
        dc_copy_bytes_per_s=options.dc_copy_bytes_per_s,
    )
    telemetry = ServiceTelemetry.start(SERVICE, options.node_id, options)
    return run_service(
        serve(
            config,
            listen=options.listen,
            port_file=options.port_file,
            grace_s=options.grace_seconds,
            telemetry=telemetry,
            admin_listen=options.admin_listen,
            metrics_listen=options.metrics_listen,
            access_file=options.access_file,
        )
    )
