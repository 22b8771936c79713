"""``txsync dev up``: a local multi-DC cluster of real processes on this machine.

Per DC a transaction-store (the DC's client and admin front door), a sync-coordinator,
a worker-dispatch and ``--workers`` SQLite workers (default 2), each its own process on
loopback, plaintext and open (local development only), data and logs under
``--data/<dc>``. Coordinators reach each other through the link emulator when
``--wan-delay-ms`` is given. Once every service is healthy the endpoints go to
``<data>/cluster.json`` (what the CLI reads by default) and a short guide is printed.

Nothing is restarted silently: if any service exits, the whole cluster is stopped and
the command exits non-zero, naming the service and its log. Ctrl-C or SIGTERM stops
every service cleanly and removes ``cluster.json``. Starting again on the same data
directory resumes the same cluster (same DCs, same ports, same txlogs: the shape is kept
in ``<data>/layout.json``).

``--witness`` adds a witness node (a store that takes no client transactions and a
coordinator that votes and relays), so that ``--dcs 2 --witness`` survives losing either
DC. The store, coordinator and dispatch of every DC serve Prometheus metrics. Traces go
wherever ``OTEL_EXPORTER_OTLP_ENDPOINT`` points (every service inherits the environment),
e.g. a local Jaeger: ``OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 make run``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from txsync.link_emulator import LinkEmulator, LinkSettings
from txsync.rpc import health_status

START_TIMEOUT_S = 30.0
DCS_MAX = 9
WORKERS_MAX = 8
"""Ports base+100n+11.. hold the workers: 8 fit below the next DC's range."""


@dataclass
class Service:
    name: str
    command: list[str]
    log_path: Path
    address: str
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it from here on
        self.process = subprocess.Popen(
            self.command, stdout=log, stderr=log, start_new_session=True
        )
        log.close()

    def wait_healthy(self, deadline: float) -> None:
        with grpc.insecure_channel(self.address) as channel:
            while True:
                assert self.process is not None
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} exited {self.process.returncode}; see {self.log_path}"
                    )
                try:
                    if health_status(channel) == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not become healthy; see {self.log_path}")
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout_s: float) -> int | None:
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def layout_of(
    data: Path, dcs: int, base_port: int, *, witness: bool, workers: int
) -> dict[str, Any]:
    """The cluster's shape; kept in cluster.json so that a restart resumes it. DC n uses
    ports base+100n+1 (store), +2 (coordinator), +3 (its metrics), +4 (dispatch), +5
    (its metrics), +6 (the store's metrics) and +11... (workers); a witness runs no
    workers."""
    nodes = [f"dc{n + 1}" for n in range(dcs)] + (["witness"] if witness else [])
    layout: dict[str, Any] = {"dcs": {}}
    for n, node in enumerate(nodes):
        base = base_port + 100 * (n + 1)
        dc: dict[str, Any] = {
            "store": f"127.0.0.1:{base + 1}",
            "coordinator": f"127.0.0.1:{base + 2}",
            "metrics": f"127.0.0.1:{base + 3}",
            "store_metrics": f"127.0.0.1:{base + 6}",
            "data": str(data / node),
            "witness": node == "witness",
            "workers": {},
        }
        if node != "witness" and workers:
            dc["dispatch"] = f"127.0.0.1:{base + 4}"
            dc["dispatch_metrics"] = f"127.0.0.1:{base + 5}"
            dc["workers"] = {
                f"{node}-w{w + 1}": f"127.0.0.1:{base + 11 + w}" for w in range(workers)
            }
        layout["dcs"][node] = dc
    return layout


def _metrics_flag(dc: dict[str, Any], key: str) -> list[str]:
    """Layouts written by older versions may lack a metrics port: then none is served."""
    return ["--metrics-listen", dc[key]] if key in dc else []


def up(options: argparse.Namespace) -> int:
    data: Path = options.data.resolve()
    data.mkdir(parents=True, exist_ok=True)
    layout_file = data / "layout.json"  # the cluster's shape, kept to resume it
    state_file = data / "cluster.json"  # present exactly while the cluster is up
    state_file.unlink(missing_ok=True)  # left behind if a previous run was killed
    layout = layout_of(
        data, options.dcs, options.base_port, witness=options.witness, workers=options.workers
    )
    if layout_file.exists():
        saved = json.loads(layout_file.read_text())
        if sorted(saved["dcs"]) != sorted(layout["dcs"]) or any(
            sorted(saved["dcs"][node].get("workers", {})) != sorted(dc["workers"])
            for node, dc in layout["dcs"].items()
        ):
            print(
                f"error: {data} holds a cluster of {', '.join(saved['dcs'])}; use another "
                "--data, or the same --dcs, --workers and --witness as when it was made",
                file=sys.stderr,
            )
            return 2
        layout = saved
        print(f"resuming the cluster in {data}")
    else:
        layout_file.write_text(json.dumps(layout, indent=2) + "\n")
    emulator = LinkEmulator() if options.wan_delay_ms else None
    cluster = DevCluster(layout, emulator, options.wan_delay_ms / 2)
    stopping = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    code = 0
    try:
        cluster.start()
        state_file.write_text(json.dumps(layout, indent=2) + "\n")
        _print_guide(layout["dcs"], state_file, options.wan_delay_ms)
        while not stopping:
            exited = cluster.exited()
            if exited is not None:
                assert exited.process is not None
                print(
                    f"\n{exited.name} exited {exited.process.returncode}: stopping the "
                    f"cluster (see {exited.log_path})",
                    file=sys.stderr,
                )
                code = 1
                break
            time.sleep(0.2)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        code = 1
    finally:
        state_file.unlink(missing_ok=True)
        print("\nstopping the cluster ...", flush=True)
        cluster.stop()
        if emulator is not None:
            emulator.close()
        print("stopped.")
    return code


class DevCluster:
    """Every service of a layout (``layout_of``), started and stopped together: what
    ``txsync dev up`` runs, and what the benchmarks start in their own process.

    Coordinators reach each other through ``emulator`` (one link per directed pair, with
    ``one_way_delay_ms``) when one is given, else directly. ``extra_args`` adds flags to
    one kind of service (``"sync-coordinator"``, ``"transaction-store"``,
    ``"worker-dispatch"``, ``"worker"``)."""

    def __init__(
        self,
        layout: dict[str, Any],
        emulator: LinkEmulator | None = None,
        one_way_delay_ms: float = 0.0,
        extra_args: dict[str, list[str]] | None = None,
    ) -> None:
        self.layout = layout
        self.emulator = emulator
        extra = extra_args or {}
        dcs: dict[str, dict[str, Any]] = layout["dcs"]
        python = [sys.executable, "-m", "txsync.cli.main"]
        services: list[Service] = []
        for node, dc in dcs.items():
            Path(dc["data"]).mkdir(parents=True, exist_ok=True)
            front_door = ["--coordinator", dc["coordinator"]]
            if dc.get("dispatch"):
                front_door += ["--dispatch", dc["dispatch"]]
            for peer, peer_dc in dcs.items():
                if peer != node:
                    front_door += ["--peer-store", f"{peer}={peer_dc['store']}"]
            services.append(
                Service(
                    f"{node} transaction-store",
                    [*python, "transaction-store", "--node-id", node, "--data", dc["data"],
                     "--listen", dc["store"], *(["--witness"] if dc.get("witness") else []),
                     *front_door, *_metrics_flag(dc, "store_metrics"),
                     *extra.get("transaction-store", [])],
                    Path(dc["data"]) / "transaction-store.log",
                    dc["store"],
                )
            )  # fmt: skip
        for node, dc in dcs.items():
            peers = []
            for peer, peer_dc in dcs.items():
                if peer == node:
                    continue
                port = int(peer_dc["coordinator"].rsplit(":", 1)[1])
                if emulator is not None:
                    settings = LinkSettings(delay_ms=one_way_delay_ms)
                    port = emulator.add_link(node, peer, port, settings)
                peers += ["--peer", f"{peer}=127.0.0.1:{port}"]
            for worker_id, address in dc.get("workers", {}).items():
                services.append(
                    Service(
                        f"{worker_id} worker",
                        [*python, "worker", "--worker-id", worker_id, "--dc", node,
                         "--data", str(Path(dc["data"]) / worker_id), "--listen", address,
                         *extra.get("worker", [])],
                        Path(dc["data"]) / f"{worker_id}.log",
                        address,
                    )
                )  # fmt: skip
            if dc.get("dispatch"):
                workers = [f"--worker={w}={a}" for w, a in dc["workers"].items()]
                services.append(
                    Service(
                        f"{node} worker-dispatch",
                        [*python, "worker-dispatch", "--store", dc["store"], "--dc", node,
                         "--listen", dc["dispatch"], *workers,
                         *_metrics_flag(dc, "dispatch_metrics"), *extra.get("worker-dispatch", [])],
                        Path(dc["data"]) / "worker-dispatch.log",
                        dc["dispatch"],
                    )
                )  # fmt: skip
            services.append(
                Service(
                    f"{node} sync-coordinator",
                    [*python, "sync-coordinator", "--node-id", node, "--store", dc["store"],
                     "--listen", dc["coordinator"], "--plaintext", *peers,
                     *_metrics_flag(dc, "metrics"), *extra.get("sync-coordinator", [])],
                    Path(dc["data"]) / "sync-coordinator.log",
                    dc["coordinator"],
                )
            )  # fmt: skip

        self.services = services

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start every service in turn, each once the previous one is healthy."""
        deadline = time.monotonic() + timeout_s
        for service in self.services:
            service.start()
            service.wait_healthy(deadline)

    def exited(self) -> Service | None:
        """A service that has exited, if any."""
        for service in self.services:
            if service.process is not None and service.process.poll() is not None:
                return service
        return None

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()
        for service in reversed(self.services):
            service.wait_stopped(timeout_s=15)


def _print_guide(dcs: dict[str, dict[str, Any]], state_file: Path, wan_delay_ms: float) -> None:
    first = next(iter(dcs))
    print()
    witnesses = sum(1 for dc in dcs.values() if dc.get("witness"))
    print(
        f"TxSync: {len(dcs) - witnesses} DCs"
        + (" and a witness" if witnesses else "")
        + " up"
        + (f", {wan_delay_ms:.0f} ms RTT between them" if wan_delay_ms else "")
    )
    for node, dc in dcs.items():
        role = "  (witness: votes and relays, takes no transactions)" if dc.get("witness") else ""
        print(f"  {node}: client API {dc['store']}   coordinator {dc['coordinator']}{role}")
        served = [dc[key] for key in ("store_metrics", "metrics", "dispatch_metrics") if key in dc]
        if served:
            print("       metrics " + "  ".join(f"http://{a}/metrics" for a in served))
        if dc.get("workers"):
            print(f"       {len(dc['workers'])} SQLite workers; worker-dispatch {dc['dispatch']}")
        print(f"       data and logs in {dc['data']}")
    print(f"endpoints: {state_file}")
    print()
    where = (
        "" if state_file == Path("data/cluster.json").resolve() else f" --endpoints {state_file}"
    )
    last = [node for node, dc in dcs.items() if not dc.get("witness")][-1]
    print("try it (in another terminal):")
    print(f"  .venv/bin/txsync submit{where} --dc {first} \\")
    print("      --sql 'CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)' --wait ok")
    print(f"  .venv/bin/txsync submit{where} --dc {last} \\")
    print("      --sql 'INSERT INTO accounts VALUES (?, ?)' --param 1 --param 100 --wait ok")
    print(f"  .venv/bin/txsync query{where} --dc {first} --sql 'SELECT * FROM accounts'")
    print(f"  .venv/bin/txsync status{where}      (also: members, workers, rounds, tx list)")
    print("Ctrl-C stops every service; `make run` again resumes the same cluster.")
    sys.stdout.flush()


def register(commands: Any) -> None:
    dev = commands.add_parser("dev", help="local development cluster")
    sub = dev.add_subparsers(dest="dev_command", metavar="COMMAND", required=True)
    parser = sub.add_parser(
        "up",
        help="start a local multi-DC cluster of real processes",
        description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dcs", type=int, default=3, help="number of DCs (default 3)")
    parser.add_argument("--data", type=Path, default=Path("data"), help="data directory")
    parser.add_argument(
        "--base-port",
        type=int,
        default=7000,
        help="DC n listens on base+100n+1 (store) and base+100n+2 (coordinator)",
    )
    parser.add_argument("--wan-delay-ms", type=float, default=0.0,
                        help="round-trip time injected between DCs (link emulator)")  # fmt: skip
    parser.add_argument("--workers", type=int, default=2,
                        help="SQLite workers per DC (default 2; 0: none)")  # fmt: skip
    parser.add_argument("--witness", action="store_true",
                        help="add a witness node (votes and relays, takes no transactions): "
                             "with --dcs 2 the cluster survives losing either DC")  # fmt: skip
    parser.set_defaults(handler=_checked_up)


def _checked_up(options: argparse.Namespace) -> int:
    if not 1 <= options.dcs <= DCS_MAX:
        print(f"error: --dcs must be 1..{DCS_MAX}", file=sys.stderr)
        return 2
    if not 1024 <= options.base_port <= 65535 - 100 * (DCS_MAX + 1):
        print("error: --base-port out of range", file=sys.stderr)
        return 2
    if not 0 <= options.workers <= WORKERS_MAX:
        print(f"error: --workers must be 0..{WORKERS_MAX}", file=sys.stderr)
        return 2
    if options.wan_delay_ms < 0:
        print("error: --wan-delay-ms must not be negative", file=sys.stderr)
        return 2
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return up(options)
