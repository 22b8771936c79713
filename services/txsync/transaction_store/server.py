"""The transaction-store process: ``txsync transaction-store``.

Serves ``ClientService`` and ``StoreInternalService`` with gRPC health checking and
reflection. On SIGTERM or SIGINT it reports NOT_SERVING, stops accepting calls, lets
in-flight calls finish (up to ``--grace-seconds``), makes the log durable and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from txsync.access import add_access_argument, guarded_serving
from txsync.rpc import (
    add_health_and_reflection,
    add_service,
    announce,
    mark_serving,
    new_server,
    run_service,
    until_stopped,
)
from txsync.settings import STORE_LIMITS, add_arguments
from txsync.telemetry import Gauge, ServiceTelemetry, add_telemetry_arguments
from txsync.tls import read_pem, server_credentials
from txsync.transaction_store.admin import NOT_HERE, AdminServicer
from txsync.transaction_store.dc_admin import DcAdmin, DcServices
from txsync.transaction_store.retention import HISTORY_KEPT_BY_AGE_MOST, kept_on_purpose
from txsync.transaction_store.service import ClientServicer, StoreInternalServicer
from txsync.transaction_store.store import StoreConfig, TransactionStore
from txsync.transaction_store.txlog.files import LogCorruptionError
from txsync.v1 import admin_pb2, client_pb2, store_pb2

log = logging.getLogger("txsync.transaction_store")

CLIENT_SERVICE = client_pb2.DESCRIPTOR.services_by_name["ClientService"]
STORE_SERVICE = store_pb2.DESCRIPTOR.services_by_name["StoreInternalService"]
ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["AdminService"]
SERVICES = (CLIENT_SERVICE, STORE_SERVICE, ADMIN_SERVICE)
UNDECODED = ("SubmitBatch",)
"""Client calls decoded by their handler when it has room (``ClientServicer.SubmitBatch``)."""


def _store_gauges(store: TransactionStore) -> list[Gauge]:
    state, config = store.state, store.config
    return [
        Gauge(
            "txsync.store.incoming",
            "transactions INCOMING here (submits are refused at --incoming-max)",
            lambda: len(state.incoming) + len(state.pending_local),
        ),
        Gauge(
            "txsync.store.open_body_bytes",
            "bytes of bodies not yet finished (submits are refused at --body-bytes-max)",
            lambda: state.open_body_bytes,
            unit="By",
        ),
        Gauge(
            "txsync.store.synced_length",
            "entries of the synced queue in the txlog",
            lambda: state.merge_base.synced_len,
        ),
        Gauge(
            "txsync.store.unfinished",
            "transactions INCOMING here, or ordered and not yet OK or FAILED here (this "
            "DC's submits are refused at --unfinished-max)",
            lambda: state.incoming_state_txs + store.ordered_unfinished(),
        ),
        Gauge(
            "txsync.store.unpassed",
            "synced positions past what the slowest peer DC in the view or worker here "
            "passed (this DC's submits are refused at --unpassed-max: flow control)",
            lambda: store.unpassed()[0],
        ),
        # The limits themselves, so that a dashboard or alert divides by them.
        Gauge("txsync.store.incoming.limit", "--incoming-max",
              lambda: config.incoming_txs_max),
        Gauge("txsync.store.unfinished.limit", "--unfinished-max",
              lambda: config.unfinished_txs_max),
        Gauge("txsync.store.unpassed.limit", "--unpassed-max",
              lambda: config.unpassed_max),
        Gauge("txsync.store.open_body.limit", "--body-bytes-max",
              lambda: config.open_body_bytes_max, unit="By"),
    ]  # fmt: skip


async def serve(
    config: StoreConfig,
    listen: str,
    port_file: Path | None,
    grace_s: float,
    *,
    telemetry: ServiceTelemetry,
    dc_services: DcServices,
    metrics_listen: str | None = None,
    access_file: Path | None = None,
    internal_listen: str | None = None,
    tls: grpc.ServerCredentials | None = None,
    allow_plaintext_tokens: bool = False,
    health_listen: str | None = None,
) -> int:
    """``internal_listen``: serve ``StoreInternalService`` there only (the pod's loopback,
    where the DC's coordinator and dispatch run), not on the client port.
    ``health_listen``: serve gRPC health checking alone there, in plaintext: the
    kubelet's gRPC probe speaks no TLS, and a TCP probe passes as soon as the port is
    bound, before the log is recovered."""
    try:
        store = await TransactionStore.open(config)
    except LogCorruptionError as error:
        log.critical("%s", error)
        return 3
    recovery = store.recovery
    log.info(
        "txlog recovered: %d entries (%d since the snapshot) in %d batches from %s%s",
        recovery.entries,
        recovery.entries_since_snapshot,
        recovery.batches,
        ", ".join(recovery.files_replayed) or "a new log",
        f"; TORN TAIL: {recovery.torn_tail}" if recovery.torn_tail else "",
    )
    telemetry.metrics.gauges(_store_gauges(store))
    interceptors = guarded_serving(
        telemetry,
        metrics_listen,
        access_file,
        refuse_plaintext_tokens=tls is None and not allow_plaintext_tokens,
    )
    if interceptors is None:
        return 2
    dc_admin = DcAdmin(dc_services)
    server = new_server(*interceptors)
    add_service(server, ClientServicer(store, dc_admin), CLIENT_SERVICE, undecoded=UNDECODED)
    add_service(server, AdminServicer(store, dc_admin), ADMIN_SERVICE, NOT_HERE)
    servers = [server]
    public = SERVICES if internal_listen is None else (CLIENT_SERVICE, ADMIN_SERVICE)
    internal_health = None
    if internal_listen is None:
        add_service(server, StoreInternalServicer(store), STORE_SERVICE)
    else:
        internal = new_server(*interceptors)
        add_service(internal, StoreInternalServicer(store), STORE_SERVICE)
        internal_health = add_health_and_reflection(internal, [STORE_SERVICE])
        if internal.add_insecure_port(internal_listen) == 0:
            log.critical("cannot listen on %s (--internal-listen)", internal_listen)
            return 2
        servers.append(internal)
    health_servicer = add_health_and_reflection(server, public)
    probe_health = None
    if health_listen is not None:
        probe = new_server()
        probe_health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(probe_health, probe)
        if probe.add_insecure_port(health_listen) == 0:
            log.critical("cannot listen on %s (--health-listen)", health_listen)
            return 2
        servers.append(probe)
    port = server.add_secure_port(listen, tls) if tls else server.add_insecure_port(listen)
    if port == 0:
        log.critical("cannot listen on %s", listen)
        return 2
    for serving in servers:
        await serving.start()
    if internal_health is not None:
        await mark_serving(internal_health, [STORE_SERVICE])
    await mark_serving(health_servicer, public)
    if probe_health is not None:
        await mark_serving(probe_health, public)
    address = announce(listen, port, port_file)
    log.info(
        "transaction-store %s listening on %s%s%s",
        config.node_id,
        address,
        " (TLS)" if tls else "",
        f" (internal API on {internal_listen})" if internal_listen else "",
    )

    await until_stopped()
    log.info("shutting down: finishing in-flight calls (up to %.0f s)", grace_s)
    await health_servicer.enter_graceful_shutdown()
    if probe_health is not None:
        await probe_health.enter_graceful_shutdown()
    for serving in servers:
        await serving.stop(grace_s)
    await dc_admin.close()
    await store.close()
    telemetry.close()
    log.info("transaction-store stopped cleanly")
    return 0


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "transaction-store",
        help="run a DC's transaction-store (the txlog and the client API)",
        description=(
            "Serve a DC's durable transaction log: the client API (submit, get, wait, list) "
            "and the internal API of the sync-coordinator and worker-dispatch."
        ),
        epilog=(
            "example:\n  txsync transaction-store --node-id dc1 --data ./data/dc1 "
            "--listen 127.0.0.1:7001"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--node-id", required=True, help="this DC's node id (e.g. dc1)")
    parser.add_argument("--data", type=Path, required=True, help="data directory (txlog/ inside)")
    parser.add_argument("--listen", default="127.0.0.1:7001", help="host:port (port 0: any)")
    parser.add_argument("--port-file", type=Path, help="write the bound host:port here")
    add_arguments(parser.add_argument_group("limits"), STORE_LIMITS)
    parser.add_argument("--grace-seconds", type=float, default=10.0,
                        help="how long in-flight calls may finish at shutdown")  # fmt: skip
    parser.add_argument("--allow-nondeterministic", action="store_true",
                        help="accept statements whose result differs per worker "
                             "(random(), 'now', ...): replicas may then diverge")  # fmt: skip
    parser.add_argument("--witness", action="store_true",
                        help="this node is a witness: it votes and relays transactions "
                             "between DCs but takes none from clients")  # fmt: skip
    dc = parser.add_argument_group(
        "the DC's admin front door",
        "this store answers the admin API for its DC (and the cluster) by asking these",
    )
    dc.add_argument("--coordinator", metavar="HOST:PORT",
                    help="this DC's sync-coordinator (its admin API, plaintext)")  # fmt: skip
    dc.add_argument("--dispatch", metavar="HOST:PORT", help="this DC's worker-dispatch")
    dc.add_argument("--peer-store", action="append", default=[], type=_peer_store,
                    metavar="NODE_ID=HOST:PORT",
                    help="another DC's store, for the cluster view (repeat)")  # fmt: skip
    parser.add_argument("--internal-listen", metavar="HOST:PORT",
                        help="serve the internal API (the DC's coordinator and dispatch) "
                             "here only, not on --listen: e.g. the pod's loopback, so that "
                             "clients reaching the client port cannot reach it (default: "
                             "on --listen too)")  # fmt: skip
    tls = parser.add_argument_group("TLS on the client port (docs/operations.md)")
    tls.add_argument("--tls-cert", type=Path, help="the store's certificate (PEM)")
    tls.add_argument("--tls-key", type=Path, help="its private key (PEM)")
    tls.add_argument("--tls-client-ca", type=Path,
                     help="CA (PEM) whose client certificates every client must present; "
                          "they identify callers (the access file's [[identity]])")  # fmt: skip
    tls.add_argument("--peer-tls-ca", type=Path,
                     help="CA (PEM) that signs the other DCs' stores, asked over TLS for "
                          "cluster-wide status (their node id is the name checked)")  # fmt: skip
    tls.add_argument("--health-listen", metavar="HOST:PORT",
                     help="serve gRPC health checking alone here, in plaintext, for probes "
                          "that speak no TLS (the kubelet's gRPC probe) while --listen "
                          "does")  # fmt: skip
    tls.add_argument("--allow-plaintext-tokens", action="store_true",
                     help="take bearer tokens over plaintext from other machines too (only "
                          "on a network you trust: anyone on the path can read them)")  # fmt: skip
    add_access_argument(parser)
    add_telemetry_arguments(parser)
    parser.set_defaults(handler=run)


def _peer_store(text: str) -> tuple[str, str]:
    node_id, separator, address = text.partition("=")
    if not separator or not node_id or ":" not in address:
        raise argparse.ArgumentTypeError(f"{text!r} is not NODE_ID=HOST:PORT")
    return node_id, address


def run(options: argparse.Namespace) -> int:
    config = StoreConfig(
        data_dir=options.data,
        node_id=options.node_id,
        incoming_txs_max=options.incoming_max,
        unfinished_txs_max=options.unfinished_max,
        unpassed_max=options.unpassed_max,
        open_body_bytes_max=options.body_bytes_max,
        log_file_bytes_max=options.log_file_bytes_max,
        log_file_entries_max=options.log_file_entries_max,
        history_kept=options.history_kept,
        history_kept_ms=options.history_kept_ms,
        backups_kept=options.backups_kept,
        peer_hold_max=options.peer_hold_max,
        body_missing_alarm_s=options.body_missing_alarm_s,
        idempotency_window_ms=options.idempotency_window_s * 1000,
        witness=options.witness,
        allow_nondeterministic=options.allow_nondeterministic,
        dispatch_address="" if options.witness else options.dispatch or "",
    )
    if (options.tls_cert is None) != (options.tls_key is None):
        print("error: give both --tls-cert and --tls-key, or neither", file=sys.stderr)
        return 2
    kept = kept_on_purpose(config.history_kept, config.history_kept_ms)
    if config.unpassed_max and config.unpassed_max <= kept:
        # The positions kept on purpose count against the bound (``retention.unpassed``):
        # at or below them, every report's delay would refuse this DC's submits.
        print(
            f"error: --unpassed-max ({config.unpassed_max}) must exceed the newest "
            f"positions kept on purpose ({kept}: --history-kept, and the age window of "
            f"--history-kept-ms, at most {HISTORY_KEPT_BY_AGE_MOST}), or be 0 (off)",
            file=sys.stderr,
        )
        return 2
    if options.tls_client_ca and not options.tls_cert:
        print("error: --tls-client-ca needs --tls-cert and --tls-key", file=sys.stderr)
        return 2
    try:
        tls = None
        if options.tls_cert:
            client_ca = options.tls_client_ca and read_pem(options.tls_client_ca, "client CA")
            tls = server_credentials(
                read_pem(options.tls_cert, "certificate"),
                read_pem(options.tls_key, "key"),
                client_ca or None,
            )
        peer_ca = read_pem(options.peer_tls_ca, "peer CA") if options.peer_tls_ca else None
    except OSError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    dc_services = DcServices(
        coordinator=options.coordinator,
        dispatch=options.dispatch,
        peer_stores=dict(options.peer_store),
        peer_ca=peer_ca,
    )
    telemetry = ServiceTelemetry.start("transaction-store", options.node_id, options)
    return run_service(
        serve(
            config,
            options.listen,
            options.port_file,
            options.grace_seconds,
            telemetry=telemetry,
            dc_services=dc_services,
            metrics_listen=options.metrics_listen,
            access_file=options.access_file,
            internal_listen=options.internal_listen,
            tls=tls,
            allow_plaintext_tokens=options.allow_plaintext_tokens,
            health_listen=options.health_listen,
        )
    )
