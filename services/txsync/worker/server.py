"""The worker process: ``txsync worker``.

Serves ``WorkerService`` over one database (SQLite in ``--data``, or PostgreSQL with
``--postgres``) with gRPC health checking and reflection. On SIGTERM or SIGINT it reports
NOT_SERVING, lets in-flight calls finish (up to ``--grace-seconds``) and exits 0; a
transaction cut off by a harder stop is rolled back by the database and applied again
when dispatch resends it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from txsync.access import add_access_argument, guarded_serving
from txsync.rpc import (
    add_health_and_reflection,
    add_service,
    announce,
    mark_serving,
    new_channel,
    new_server,
    run_service,
    until_stopped,
)
from txsync.settings import WORKER_LIMITS, add_arguments
from txsync.telemetry import ServiceTelemetry, add_telemetry_arguments
from txsync.v1 import worker_pb2, worker_pb2_grpc
from txsync.worker.backend import Backend
from txsync.worker.service import WorkerServicer
from txsync.worker.sqlite_backend import SqliteBackend

log = logging.getLogger("txsync.worker")

WORKER_SERVICE = worker_pb2.DESCRIPTOR.services_by_name["WorkerService"]
DISPATCH_SILENT_S = 5.0
"""Dispatch asks every second; this long without a heartbeat means it forgot us."""
REREGISTER_CHECK_S = 1.0


async def _register(dispatch: str, request: worker_pb2.RegisterWorkerRequest) -> None:
    """Register with dispatch, retrying until it answers (it may start after us)."""
    async with new_channel(dispatch, as_service=True) as channel:
        stub = worker_pb2_grpc.DispatchServiceStub(channel)
        while True:
            try:
                await stub.RegisterWorker(request, timeout=5)
            except grpc.aio.AioRpcError as error:
                log.warning("dispatch %s: %s; retrying", dispatch, error.code().name)
                await asyncio.sleep(1)
                continue
            log.info("registered with worker-dispatch at %s", dispatch)
            return


async def _stay_registered(
    dispatch: str, request: worker_pb2.RegisterWorkerRequest, servicer: WorkerServicer
) -> None:
    """Register, and register again whenever dispatch stops asking for heartbeats: a
    restarted dispatch (its pod killed, say) knows only the workers given on its command
    line, and would otherwise never feed us again."""
    while True:
        await _register(dispatch, request)
        registered_s = time.monotonic()
        while True:
            await asyncio.sleep(REREGISTER_CHECK_S)
            last = servicer.last_heartbeat_s
            silent_since = max(registered_s, last or registered_s)
            if time.monotonic() - silent_since > DISPATCH_SILENT_S:
                log.warning(
                    "dispatch %s has not asked for %.0f s: registering again",
                    dispatch,
                    time.monotonic() - silent_since,
                )
                break


async def _drain(dispatch: str, worker_id: str) -> None:
    async with new_channel(dispatch, as_service=True) as channel:
        stub = worker_pb2_grpc.DispatchServiceStub(channel)
        try:
            await stub.DrainWorker(worker_pb2.DrainWorkerRequest(worker_id=worker_id), timeout=5)
        except grpc.aio.AioRpcError as error:
            log.warning("could not tell dispatch %s we drain: %s", dispatch, error.code().name)


async def serve(
    worker_id: str,
    backend: Backend,
    *,
    scratch: Path,
    listen: str,
    port_file: Path | None,
    grace_s: float,
    telemetry: ServiceTelemetry,
    dispatch: str | None = None,
    advertise: str | None = None,
    metrics_listen: str | None = None,
    access_file: Path | None = None,
) -> int:
    servicer = WorkerServicer(worker_id, backend, scratch)
    interceptors = guarded_serving(telemetry, metrics_listen, access_file)
    if interceptors is None:
        return 2
    server = new_server(*interceptors)
    add_service(server, servicer, WORKER_SERVICE)
    health = add_health_and_reflection(server, [WORKER_SERVICE])
    port = server.add_insecure_port(listen)
    if port == 0:
        log.critical("cannot listen on %s", listen)
        return 2
    await server.start()
    await mark_serving(health, [WORKER_SERVICE])
    address = announce(listen, port, port_file)
    applied = servicer.applied
    log.info(
        "worker %s (%s) listening on %s; applied up to position %d",
        worker_id,
        backend.name,
        address,
        applied.position,
    )
    registering = None
    if dispatch is not None:
        request = worker_pb2.RegisterWorkerRequest(
            worker_id=worker_id, url=advertise or address, backend=backend.name
        )
        registering = asyncio.get_running_loop().create_task(
            _stay_registered(dispatch, request, servicer)
        )
    await until_stopped()
    servicer.draining = True
    if registering is not None:
        registering.cancel()
        await asyncio.gather(registering, return_exceptions=True)
    if dispatch is not None:
        await _drain(dispatch, worker_id)
    await health.enter_graceful_shutdown()
    await server.stop(grace_s)
    # An apply still running after the grace period (a statement that takes long) is
    # abandoned without a verdict; dispatch sends it again after the restart.
    backend.interrupt()
    servicer.close()
    backend.close()
    telemetry.close()
    log.info("worker %s stopped cleanly at position %d", worker_id, servicer.applied.position)
    return 0


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "worker",
        help="run a worker: apply the agreed order to a SQL database",
        description=(
            "Apply a DC's synced transactions, in order and exactly once, to one database "
            "(SQLite, WAL), and serve reads after a position."
        ),
        epilog="example:\n  txsync worker --worker-id dc1-w1 --data ./data/dc1/w1 "
        "--listen 127.0.0.1:7011",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--worker-id", required=True, help="this worker's id (e.g. dc1-w1)")
    parser.add_argument(
        "--data", type=Path, help="data directory of a SQLite worker (worker.sqlite inside)"
    )
    parser.add_argument(
        "--postgres",
        metavar="CONNINFO",
        help="apply to this PostgreSQL database instead (psycopg conninfo, e.g. "
        "'host=127.0.0.1 dbname=app user=txsync')",
    )
    parser.add_argument("--listen", default="127.0.0.1:7011", help="host:port (port 0: any)")
    parser.add_argument("--port-file", type=Path, help="write the bound host:port here")
    parser.add_argument(
        "--dispatch",
        metavar="HOST:PORT",
        help="register with this worker-dispatch at start (and drain from it at stop)",
    )
    parser.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        help="the address dispatch dials (default: the address bound; give it when "
        "listening on 0.0.0.0, e.g. the pod's DNS name)",
    )
    parser.add_argument("--grace-seconds", type=float, default=5.0,
                        help="how long in-flight calls may finish at shutdown; an apply "
                             "still running then is abandoned, without a verdict")  # fmt: skip
    limits = parser.add_argument_group(
        "limits (the same at every worker, so every replica reaches one verdict)"
    )
    add_arguments(limits, WORKER_LIMITS)
    add_access_argument(parser)
    add_telemetry_arguments(parser, dc_flag=True)
    parser.set_defaults(handler=run)


def _open_backend(options: argparse.Namespace) -> Backend:
    """The worker's database; psycopg is imported only for PostgreSQL (it costs a SQLite
    worker about 100 ms of start-up). Its errors come back as OSError."""
    if not options.postgres:
        return SqliteBackend(
            options.data / "worker.sqlite",
            steps_max=options.steps_max,
            value_bytes_max=options.value_bytes_max,
            growth_bytes_max=options.growth_bytes_max,
            touched_digest=bool(options.touched_digest),
            heap_bytes_max=options.heap_bytes_max,
            content_check_every=options.content_check_every,
        )
    import psycopg  # noqa: PLC0415

    from txsync.worker.postgres_backend import PostgresBackend  # noqa: PLC0415

    try:
        return PostgresBackend(
            options.postgres,
            statement_timeout_ms=options.statement_timeout_ms,
            content_check_every=options.content_check_every,
        )
    except psycopg.Error as error:
        raise OSError(str(error)) from error


def run(options: argparse.Namespace) -> int:
    telemetry = ServiceTelemetry.start("worker", options.dc, options)
    if (options.data is None) == (options.postgres is None):
        print("error: give --data (SQLite) or --postgres CONNINFO, not both", file=sys.stderr)
        return 2
    backend: Backend
    try:
        backend = _open_backend(options)
    except (OSError, sqlite3.Error) as error:
        print(f"error: cannot open the database: {error}", file=sys.stderr)
        return 2
    scratch = options.data or Path(tempfile.mkdtemp(prefix="txsync-worker-"))
    scratch.mkdir(parents=True, exist_ok=True)
    return run_service(
        serve(
            options.worker_id,
            backend,
            scratch=scratch,
            listen=options.listen,
            port_file=options.port_file,
            grace_s=options.grace_seconds,
            telemetry=telemetry,
            dispatch=options.dispatch,
            metrics_listen=options.metrics_listen,
            advertise=options.advertise,
            access_file=options.access_file,
        )
    )
