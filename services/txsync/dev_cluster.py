"""``txsync dev up``: a local multi-DC cluster of real processes on this machine.

Per DC a transaction-store (the DC's client and admin front door), a sync-coordinator,
a worker-dispatch and ``--workers`` SQLite workers (default 2), each its own process on
loopback, plaintext and open (local development only), data and logs under
``--data/<dc>``. Coordinators reach each other through the link emulator when
``--wan-delay-ms`` is given. Once every service is healthy the endpoints go to
``<data>/cluster.json`` (what the CLI reads by default) and a short guide is printed.

Services start together, each once what it needs is serving (as a pod's containers
would): stores and workers at once, a DC's coordinator and dispatch once its store
answers. Progress is printed while they come up, under one ``--start-timeout``. A
service that exits is restarted with backoff and the restart is logged, as Kubernetes
would; the cluster keeps running meanwhile. Ctrl-C, SIGTERM or SIGHUP stops every
service cleanly and removes ``cluster.json``; the services die with ``dev up`` whatever
ends it (they are SIGKILLed by the kernel if it is killed). Starting again on the same
data directory resumes the same cluster (same DCs, same ports, same txlogs: the shape is
kept in ``<data>/layout.json``).

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from txsync.command_lines import coordinator_args, dispatch_args, store_args, worker_args
from txsync.link_emulator import LinkEmulator, LinkSettings
from txsync.parent_watch import child_environment
from txsync.rpc import RECONNECT_OPTIONS, health_status
from txsync.telemetry.trace_file import (
    TRACE_FILE_NAME,
    TraceFileCollector,
    transaction_trace,
    waterfall,
)

START_TIMEOUT_DEFAULT_S = 300.0
"""Generous on purpose: 15 processes each import gRPC and OpenTelemetry, and a loaded
2-core machine may take a minute for all of them. A healthy start ends far sooner."""
STOP_TIMEOUT_S = 15.0
"""A service still running this long after SIGTERM is killed."""
RESTART_BACKOFF_MIN_S = 1.0
RESTART_BACKOFF_MAX_S = 30.0
START_ATTEMPTS_MAX = 3
"""A service that exits this many times in a row without ever serving fails the start
(a port in use, a bad flag): restarting it further would only hide the cause."""
STABLE_AFTER_S = 30.0
"""A service up this long before it exited restarts after the shortest backoff again."""
HEALTH_CHECK_TIMEOUT_S = 2.0
PROGRESS_EVERY_S = 5.0
LOG_TAIL_LINES = 8
DCS_MAX = 9
WORKERS_MAX = 8
"""Ports base+100n+11.. hold the workers and +21.. their metrics: 8 fit in each range."""


@dataclass(eq=False)
class Service:
    """One process of the cluster, and what the supervisor knows of it."""

    name: str
    command: list[str]
    log_path: Path
    address: str
    needs: tuple[Service, ...] = ()
    """Services that must be serving before this one starts (or restarts)."""
    process: subprocess.Popen[bytes] | None = None
    serving: bool = False
    started_at: float = 0.0
    serving_since: float = 0.0
    restarts: int = 0
    exits_before_serving: int = 0
    backoff_s: float = 0.0
    not_before: float = 0.0
    """Monotonic time before which it is not (re)started: the restart backoff."""
    _channel: grpc.Channel | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it from here on
        # Its own session: Ctrl-C in the terminal reaches dev up alone, which then stops
        # the services in order. The kernel still kills them if dev up dies (parent_watch).
        self.process = subprocess.Popen(
            self.command,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=child_environment(),
        )
        log.close()
        self.serving = False
        self.started_at = time.monotonic()

    def check_serving(self) -> bool:
        """One health check (false while it is still starting). A check that fails drops
        its channel: one whose connection was refused tries again only after gRPC's
        reconnect backoff (200 ms, then 1.6 times longer each time), so a service that
        served in 0.4 s was seen at about 0.5 s, one at 0.6 s at about 1.0 s, and what
        waits for it started that much later (``make bench-startup``)."""
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.address, options=list(RECONNECT_OPTIONS))
        try:
            status = health_status(self._channel, timeout_s=HEALTH_CHECK_TIMEOUT_S)
        except grpc.RpcError:
            self.close()
            return False
        return status == health_pb2.HealthCheckResponse.SERVING

    def stop(self) -> None:
        if self.running:
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout_s: float) -> int | None:
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(f"    | {line}" for line in lines[-LOG_TAIL_LINES:])


def _write_whole(path: Path, text: str) -> None:
    """Write ``path`` so that a reader sees the old file or the whole new one: readers
    wait for cluster.json to exist and then read it, and one read it empty between the
    file's creation and its write (a fresh-clone CI run of the end-to-end test)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


class StartFailed(RuntimeError):
    """The cluster did not come up within its start timeout."""


def layout_of(
    data: Path, dcs: int, base_port: int, *, witness: bool, workers: int
) -> dict[str, Any]:
    """The cluster's shape; kept in cluster.json so that a restart resumes it. DC n uses
    ports base+100n+1 (store), +2 (coordinator), +3 (its metrics), +4 (dispatch), +5
    (its metrics), +6 (the store's metrics), +11... (workers) and +21... (their
    metrics); a witness runs no workers."""
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
            dc["worker_metrics"] = {
                f"{node}-w{w + 1}": f"127.0.0.1:{base + 21 + w}" for w in range(workers)
            }
        layout["dcs"][node] = dc
    return layout


def up(options: argparse.Namespace) -> int:
    say = _Say()
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
            say(
                f"error: {data} holds a cluster of {', '.join(saved['dcs'])}; use another "
                "--data, or the same --dcs, --workers and --witness as when it was made",
                error=True,
            )
            return 2
        layout = saved
        say(f"resuming the cluster in {data}")
    else:
        _write_whole(layout_file, json.dumps(layout, indent=2) + "\n")
    stopping: list[str] = []

    def request_stop(signum: int, frame: object) -> None:
        stopping.append(signal.Signals(signum).name)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, request_stop)
    emulator = LinkEmulator() if options.wan_delay_ms else None
    traces = _start_trace_file(data) if options.traces else None
    cluster = DevCluster(layout, emulator, options.wan_delay_ms / 2)
    code = 0
    try:
        cluster.start(options.start_timeout, progress=say, stopping=lambda: bool(stopping))
        if not stopping:
            _write_whole(state_file, json.dumps(layout, indent=2) + "\n")
            _print_guide(layout["dcs"], state_file, options.wan_delay_ms, say)
            if traces is not None:
                say(f"traces: {traces.path} (txsync dev trace TX_ID --data {options.data})")
        while not stopping:
            for event in cluster.supervise():
                say(event, error=True)
            time.sleep(0.2)
    except StartFailed as error:
        say(f"error: {error}", error=True)
        code = 1
    finally:
        state_file.unlink(missing_ok=True)
        say("\nstopping the cluster ...")
        cluster.stop()
        if emulator is not None:
            emulator.close()
        if traces is not None:
            traces.close()  # after the services: they flush their last spans as they stop
        say("stopped.")
    return code


def _start_trace_file(data: Path) -> TraceFileCollector:
    """The local trace collector of ``--traces``, which every service exports to (they
    inherit the environment)."""
    collector = TraceFileCollector(data / TRACE_FILE_NAME)
    collector.start()
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.endpoint
    os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "500")  # spans in the file within 1 s
    return collector


def trace(options: argparse.Namespace) -> int:
    """``txsync dev trace TX_ID``: the transaction's trace from ``--traces``' file."""
    path = options.data / TRACE_FILE_NAME
    if not path.exists():
        print(f"error: no {path}: start the cluster with `txsync dev up --traces`",
              file=sys.stderr)  # fmt: skip
        return 2
    lines = waterfall(transaction_trace(path, options.tx_id))
    if not lines:
        print(f"no spans of {options.tx_id} in {path} (yet: services send theirs within a "
              "second or so)")  # fmt: skip
        return 1
    print("    start  duration  span [service dc]")
    print("\n".join(lines))
    return 0


class _Say:
    """Prints that never kill ``dev up``: once its output is gone (the terminal closed,
    or the reader of a pipe went away), the rest is dropped and the cluster still stops
    cleanly."""

    def __init__(self) -> None:
        self.closed = False

    def __call__(self, text: str, *, error: bool = False) -> None:
        if self.closed:
            return
        try:
            print(text, file=sys.stderr if error else sys.stdout, flush=True)
        except (BrokenPipeError, OSError):
            self.closed = True


class DevCluster:
    """Every service of a layout (``layout_of``), started together and supervised: what
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
            peer_stores = {peer: d["store"] for peer, d in dcs.items() if peer != node}
            # Layouts written by older versions may lack the metrics ports (.get: none).
            store = Service(
                f"{node} transaction-store",
                [*python, *store_args(
                    node, dc["data"], dc["store"], coordinator=dc["coordinator"],
                    dispatch=dc.get("dispatch"), peer_stores=peer_stores,
                    witness=bool(dc.get("witness")), metrics_listen=dc.get("store_metrics"),
                    extra=extra.get("transaction-store", []),
                )],
                Path(dc["data"]) / "transaction-store.log",
                dc["store"],
            )  # fmt: skip
            services.append(store)
            peers: dict[str, str] = {}
            for peer, peer_dc in dcs.items():
                if peer == node:
                    continue
                port = int(peer_dc["coordinator"].rsplit(":", 1)[1])
                if emulator is not None:
                    settings = LinkSettings(delay_ms=one_way_delay_ms)
                    port = emulator.add_link(node, peer, port, settings)
                peers[peer] = f"127.0.0.1:{port}"
            for worker_id, address in dc.get("workers", {}).items():
                services.append(
                    Service(
                        f"{worker_id} worker",
                        [*python, *worker_args(
                            worker_id, node, str(Path(dc["data"]) / worker_id), address,
                            metrics_listen=dc.get("worker_metrics", {}).get(worker_id),
                            extra=extra.get("worker", []),
                        )],
                        Path(dc["data"]) / f"{worker_id}.log",
                        address,
                    )
                )  # fmt: skip
            if dc.get("dispatch"):
                services.append(
                    Service(
                        f"{node} worker-dispatch",
                        [*python, *dispatch_args(
                            dc["store"], dc["dispatch"], node, workers=dc["workers"],
                            metrics_listen=dc.get("dispatch_metrics"),
                            extra=extra.get("worker-dispatch", []),
                        )],
                        Path(dc["data"]) / "worker-dispatch.log",
                        dc["dispatch"],
                        needs=(store,),
                    )
                )  # fmt: skip
            services.append(
                Service(
                    f"{node} sync-coordinator",
                    [*python, *coordinator_args(
                        node, dc["store"], dc["coordinator"], peers=peers,
                        metrics_listen=dc.get("metrics"),
                        extra=extra.get("sync-coordinator", []),
                    )],
                    Path(dc["data"]) / "sync-coordinator.log",
                    dc["coordinator"],
                    needs=(store,),
                )
            )  # fmt: skip
        self.services = services

    def start(
        self,
        timeout_s: float = START_TIMEOUT_DEFAULT_S,
        progress: Callable[[str], None] | None = None,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        """Start every service, each once what it ``needs`` is serving, and return once
        all serve. ``progress`` hears what is still awaited every few seconds and every
        restart; StartFailed names the services not serving after ``timeout_s`` (with the
        end of their logs). Returns early once ``stopping()`` says so."""
        started = time.monotonic()
        deadline = started + timeout_s
        next_report = started + PROGRESS_EVERY_S
        say = progress or (lambda text: None)
        say(f"starting {len(self.services)} services ...")
        while not stopping():
            for event in self.supervise():
                say(event)
            for broken in self.services:
                if broken.exits_before_serving >= START_ATTEMPTS_MAX:
                    raise StartFailed(
                        f"{broken.name} exited {broken.exits_before_serving} times without "
                        f"serving; log {broken.log_path}\n{broken.log_tail()}"
                    )
            waiting = [s for s in self.services if not s.serving]
            if not waiting:
                say(f"all {len(self.services)} services serving after "
                    f"{time.monotonic() - started:.1f} s")  # fmt: skip
                return
            now = time.monotonic()
            if now > deadline:
                raise StartFailed(
                    f"not serving after {timeout_s:.0f} s (--start-timeout): "
                    + "".join(f"\n  {s.name}: {self._awaited(s, now)}; log {s.log_path}\n"
                              f"{s.log_tail()}" for s in waiting)
                )  # fmt: skip
            if now >= next_report:
                next_report = now + PROGRESS_EVERY_S
                say(f"  {len(self.services) - len(waiting)}/{len(self.services)} serving; "
                    + ", ".join(f"{s.name} ({self._awaited(s, now)})" for s in waiting[:4])
                    + (f" and {len(waiting) - 4} more" if len(waiting) > 4 else ""))  # fmt: skip
            time.sleep(0.05)

    @staticmethod
    def _awaited(service: Service, now: float) -> str:
        if service.running:
            return f"starting for {now - service.started_at:.0f} s"
        blocked = [n.name for n in service.needs if not n.serving]
        if blocked:
            return "waits for " + ", ".join(blocked)
        return f"restarts in {max(0.0, service.not_before - now):.0f} s"

    def supervise(self) -> list[str]:
        """One look at every service: start what may start, notice what serves, and
        schedule a restart with backoff for what exited. Returns what happened worth
        telling (exits and restarts)."""
        events: list[str] = []
        now = time.monotonic()
        for service in self.services:
            process = service.process
            if process is not None and process.poll() is not None:
                up_for = now - service.serving_since if service.serving else 0.0
                service.exits_before_serving = (
                    0 if service.serving else service.exits_before_serving + 1
                )
                if up_for >= STABLE_AFTER_S:
                    service.backoff_s = RESTART_BACKOFF_MIN_S
                else:
                    service.backoff_s = min(
                        RESTART_BACKOFF_MAX_S, max(RESTART_BACKOFF_MIN_S, 2 * service.backoff_s)
                    )
                service.not_before = now + service.backoff_s
                service.process, service.serving = None, False
                events.append(
                    f"{service.name} exited {process.returncode}: restarting in "
                    f"{service.backoff_s:.0f} s (see {service.log_path})"
                )
            if service.process is None:
                ready = all(needed.serving for needed in service.needs)
                if ready and now >= service.not_before:
                    if service.not_before:
                        service.restarts += 1
                        events.append(f"{service.name}: restart {service.restarts}")
                    service.start()
            elif not service.serving and service.check_serving():
                service.serving, service.serving_since = True, time.monotonic()
        return events

    def stop(self) -> None:
        """SIGTERM to every service, those that others need (the stores) last, and wait
        for each; one still running after STOP_TIMEOUT_S is killed."""
        needed = {n for s in self.services for n in s.needs}
        for group in (
            [s for s in self.services if s not in needed],
            [s for s in self.services if s in needed],
        ):
            for service in group:
                service.stop()
            for service in group:
                service.wait_stopped(timeout_s=STOP_TIMEOUT_S)
        for service in self.services:
            service.close()


def _print_guide(
    dcs: dict[str, dict[str, Any]], state_file: Path, wan_delay_ms: float, say: _Say
) -> None:
    first = next(iter(dcs))
    say("")
    witnesses = sum(1 for dc in dcs.values() if dc.get("witness"))
    say(
        f"TxSync: {len(dcs) - witnesses} DCs"
        + (" and a witness" if witnesses else "")
        + " up"
        + (f", {wan_delay_ms:.0f} ms RTT between them" if wan_delay_ms else "")
    )
    for node, dc in dcs.items():
        role = "  (witness: votes and relays, takes no transactions)" if dc.get("witness") else ""
        say(f"  {node}: client API {dc['store']}   coordinator {dc['coordinator']}{role}")
        served = [dc[key] for key in ("store_metrics", "metrics", "dispatch_metrics") if key in dc]
        served += dc.get("worker_metrics", {}).values()
        if served:
            say("       metrics " + "  ".join(f"http://{a}/metrics" for a in served))
        if dc.get("workers"):
            say(f"       {len(dc['workers'])} SQLite workers; worker-dispatch {dc['dispatch']}")
        say(f"       data and logs in {dc['data']}")
    say(f"endpoints: {state_file}")
    say("")
    where = (
        "" if state_file == Path("data/cluster.json").resolve() else f" --endpoints {state_file}"
    )
    last = [node for node, dc in dcs.items() if not dc.get("witness")][-1]
    say("try it (in another terminal):")
    say(f"  .venv/bin/txsync submit{where} --dc {first} \\")
    say("      --sql 'CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)' --wait ok")
    say(f"  .venv/bin/txsync submit{where} --dc {last} \\")
    say("      --sql 'INSERT INTO accounts VALUES (?, ?)' --param 1 --param 100 --wait ok")
    say(f"  .venv/bin/txsync query{where} --dc {first} --sql 'SELECT * FROM accounts'")
    say(f"  .venv/bin/txsync status{where}      (also: members, workers, rounds, tx list)")
    say("Ctrl-C stops every service; `make run` again resumes the same cluster.")


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
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=START_TIMEOUT_DEFAULT_S,
        metavar="SECONDS",
        help="give up if not every service serves by then (default "
        f"{START_TIMEOUT_DEFAULT_S:.0f}; progress is printed meanwhile)",
    )
    parser.add_argument(
        "--traces", action="store_true",
        help=f"collect the services' traces into DATA/{TRACE_FILE_NAME} (no Jaeger "
        "needed); `txsync dev trace TX_ID` prints one",
    )  # fmt: skip
    parser.set_defaults(handler=_checked_up)
    shown = sub.add_parser(
        "trace",
        help="print a transaction's trace from `dev up --traces`",
        description="A transaction's trace, collected by `txsync dev up --traces`, as a "
        "waterfall: each span's start after the first, its duration, its service and DC.",
    )
    shown.add_argument("tx_id", metavar="TX_ID", help="the transaction's id")
    shown.add_argument("--data", type=Path, default=Path("data"), help="data directory")
    shown.set_defaults(handler=trace)


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
    if options.start_timeout <= 0:
        print("error: --start-timeout must be positive", file=sys.stderr)
        return 2
    if options.wan_delay_ms < 0:
        print("error: --wan-delay-ms must not be negative", file=sys.stderr)
        return 2
    if options.traces and os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        print("error: --traces collects the traces itself; OTEL_EXPORTER_OTLP_ENDPOINT "
              "sends them elsewhere: choose one", file=sys.stderr)  # fmt: skip
        return 2
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return up(options)
