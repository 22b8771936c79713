"""The worker-dispatch process: ``txsync worker-dispatch``.

Feeds its DC's synced transactions to the workers named with ``--worker`` (see
``dispatch.py``) and serves the admin API's ``ListWorkers`` (position, role, health, out
of sync) with health checking and reflection.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from txsync.settings import DISPATCH_SETTINGS, FEED_GATHER_MS_DEFAULT, add_arguments
from txsync.telemetry import ServiceTelemetry, add_telemetry_arguments
from txsync.v1 import admin_pb2, worker_pb2
from txsync.worker_dispatch.admin import NOT_HERE, DispatchAdmin
from txsync.worker_dispatch.dispatch import Dispatch
from txsync.worker_dispatch.health import StorageWarnings
from txsync.worker_dispatch.service import DispatchServicer

if TYPE_CHECKING:
    from txsync.worker_dispatch.kubernetes_workers import WorkerPodWatch

log = logging.getLogger("txsync.worker_dispatch")

ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["AdminService"]
DISPATCH_SERVICE = worker_pb2.DESCRIPTOR.services_by_name["DispatchService"]


async def serve(
    store: str,
    workers: dict[str, str],
    *,
    listen: str,
    port_file: Path | None,
    telemetry: ServiceTelemetry,
    stuck_after_s: float = 10.0,
    feed_gather_ms: int = FEED_GATHER_MS_DEFAULT,
    storage_warnings: StorageWarnings | None = None,
    metrics_listen: str | None = None,
    access_file: Path | None = None,
    pod_watch: WorkerPodWatch | None = None,
) -> int:
    dispatch = Dispatch(
        store,
        workers,
        stuck_after_s=stuck_after_s,
        feed_gather_ms=feed_gather_ms,
        storage_warnings=storage_warnings,
        metrics=telemetry.metrics,
    )
    interceptors = guarded_serving(telemetry, metrics_listen, access_file)
    if interceptors is None:
        return 2
    server = new_server(*interceptors)
    add_service(server, DispatchAdmin(dispatch), ADMIN_SERVICE, NOT_HERE)
    add_service(server, DispatchServicer(dispatch), DISPATCH_SERVICE)
    health = add_health_and_reflection(server, [ADMIN_SERVICE, DISPATCH_SERVICE])
    port = server.add_insecure_port(listen)
    if port == 0:
        log.critical("cannot listen on %s", listen)
        return 2
    await server.start()
    loop = asyncio.get_running_loop()
    tasks = [
        loop.create_task(dispatch.watch_heartbeats(), name="heartbeats"),
        loop.create_task(dispatch.run(), name="pipeline"),
        loop.create_task(dispatch.watch_recoveries(), name="recoveries"),
        loop.create_task(dispatch.report_progress(), name="progress-reports"),
    ]
    if pod_watch is not None:
        pod_watch.start()
        from txsync.worker_dispatch.kubernetes_workers import follow_worker_pods  # noqa: PLC0415

        tasks.append(loop.create_task(follow_worker_pods(dispatch, pod_watch), name="k8s"))
    await mark_serving(health, [ADMIN_SERVICE, DISPATCH_SERVICE])
    address = announce(listen, port, port_file)
    log.info("worker-dispatch listening on %s; workers %s", address, ", ".join(workers))
    await until_stopped(*tasks)
    crashed = [task for task in tasks if task.done()]  # they run forever unless they fail
    await health.enter_graceful_shutdown()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if pod_watch is not None:
        pod_watch.stop()
    await server.stop(2)
    await dispatch.close()
    telemetry.close()
    if crashed:
        log.critical("worker-dispatch failed: %s ended: %r", crashed[0].get_name(),
                     crashed[0].exception())  # fmt: skip
        return 1
    log.info("worker-dispatch stopped cleanly")
    return 0


def _worker(text: str) -> tuple[str, str]:
    worker_id, separator, address = text.partition("=")
    if not separator or not worker_id or ":" not in address:
        raise argparse.ArgumentTypeError(f"{text!r} is not WORKER_ID=HOST:PORT")
    return worker_id, address


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "worker-dispatch",
        help="run a DC's worker-dispatch (feeds the agreed order to the workers)",
        description=(
            "Give each synced transaction to the testing worker first, then (on OK) to "
            "every other worker; spot dead and out-of-sync workers."
        ),
        epilog="example:\n  txsync worker-dispatch --store 127.0.0.1:7001 "
        "--worker w1=127.0.0.1:7011 --worker w2=127.0.0.1:7012 --listen 127.0.0.1:7003",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--store", required=True, help="host:port of this DC's transaction-store")
    parser.add_argument(
        "--worker",
        type=_worker,
        action="append",
        default=[],
        metavar="ID=HOST:PORT",
        help="a worker; repeat per worker (the first healthy one is the testing worker); "
        "workers started with --dispatch register themselves instead",
    )
    parser.add_argument(
        "--stuck-after-s",
        type=float,
        default=10.0,
        help="a worker with work in flight and no outcome for this long is taken out "
        "(the testing role moves on)",
    )
    add_arguments(parser.add_argument_group("feed"), DISPATCH_SETTINGS)
    parser.add_argument("--listen", default="127.0.0.1:7003", help="host:port for admin/health")
    parser.add_argument("--port-file", type=Path, help="write the bound host:port here")
    k8s = parser.add_argument_group(
        "Kubernetes", "follow the workers' StatefulSet (drain removed pods at once)"
    )
    k8s.add_argument("--kubernetes-workers", metavar="STATEFULSET",
                     help="the workers' StatefulSet (in this namespace)")  # fmt: skip
    k8s.add_argument("--kubernetes-namespace", help="default: this pod's namespace")
    k8s.add_argument("--kubernetes-api", metavar="URL",
                     help="an API server URL, not the in-cluster one (tests)")  # fmt: skip
    k8s.add_argument("--worker-port", type=int, default=7011,
                     help="the port workers listen on (default 7011)")  # fmt: skip
    add_access_argument(parser)
    add_telemetry_arguments(parser, dc_flag=True)
    parser.set_defaults(handler=run)


def run(options: argparse.Namespace) -> int:
    workers = dict(options.worker)
    if options.stuck_after_s <= 0:
        print("error: --stuck-after-s must be positive", file=sys.stderr)
        return 2
    if len(workers) != len(options.worker):
        print("error: every --worker needs its own id", file=sys.stderr)
        return 2
    telemetry = ServiceTelemetry.start("worker-dispatch", options.dc, options)
    pod_watch = None
    if options.kubernetes_workers:
        # The Kubernetes client costs about 0.3 s of start-up: only when asked for.
        from txsync.worker_dispatch.kubernetes_workers import (  # noqa: PLC0415
            WorkerPodWatch,
            api_client,
            current_namespace,
        )

        try:
            api = api_client(options.kubernetes_api)
        except Exception as error:  # the client raises its own ConfigException types
            # Outside a cluster the watch is off: workers register over gRPC anyway.
            logging.getLogger("txsync.worker_dispatch").warning(
                "not watching the workers' StatefulSet (no Kubernetes API here: %s); "
                "workers register themselves",
                error,
            )
        else:
            pod_watch = WorkerPodWatch(
                api,
                current_namespace(options.kubernetes_namespace),
                options.kubernetes_workers,
                options.worker_port,
            )
    return run_service(
        serve(
            options.store,
            workers,
            listen=options.listen,
            port_file=options.port_file,
            telemetry=telemetry,
            stuck_after_s=options.stuck_after_s,
            feed_gather_ms=options.feed_gather_ms,
            storage_warnings=StorageWarnings(
                options.disk_free_alarm_percent, options.database_bytes_alarm
            ),
            metrics_listen=options.metrics_listen,
            access_file=options.access_file,
            pod_watch=pod_watch,
        )
    )
