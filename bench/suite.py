"""``make bench``: TxSync beside etcd and MariaDB Galera on this machine, same load, same
emulated network; then TxSync's scaling; results to ``docs/benchmarks.md``.

    make bench                      (or: .venv/bin/python -m bench.suite --help)

For each round-trip time, every system is started as 3 nodes on loopback with the link
emulator (half the RTT each way) between every pair of nodes, all three at once, and
loaded by closed-loop clients at every node (``bench/load.py``) at several client
counts. The systems take turns point by point (TxSync, etcd, Galera, then again, ``--reps``
times), so that the host's drift over the run (20-40% an hour here) falls on all of them
alike rather than on whichever ran last (issue 52); the idle systems' CPU during each run
is recorded beside it. Per run: rows and transactions committed per second by the
system's own counter over the measured window (and rows as the clients saw them), client
latency p50/p99 (per node too), bytes crossing the emulated WAN per row, CPU time per
1,000 rows and peak memory per kind of server process, the harness's own CPU (the
clients' processes; the suite's process with the link emulators), Galera's
certification conflicts. TxSync also gets a light-load probe (submit -> ACCEPTED at every
DC and -> OK at every DC), a point answered at OK at the client's own DC (the peers apply
before they answer), batched submits both as ``SubmitBatch`` (``--batch`` transactions)
and as the peers' batch shape (one transaction of ``--batch`` upserts), workers'
applied/s, and the cost of its rounds (bytes and coordinator CPU per round against the
incoming queue). After the writes, reads side by side: one row by key at the client's own
node (TxSync's ``query``, Galera's local SELECT, etcd's linearizable and serializable
Range), p50/p99 and CPU per read. Then the scaling run: 3 -> 5 DCs, 1 -> 4 workers per DC.

Results go to ``build/bench/results.json``; ``bench/report.py`` turns them into
``docs/benchmarks.md`` and its plots. Nothing here asserts a time: it measures and prints.

The page names the build measured (the commit, and whether the services' files differed
from it). Every cluster starts its services from the files as they are then, so a run
during which those files change measures a mix of builds: the suite then keeps its
results but does not regenerate the page, and exits with status 1 (a run of session 29
so measured showed 3 s latencies that were no build's). Measure a build from a worktree
of its own, or leave the files alone until the run ends.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

import txsync
from bench import load
from bench.proc_stats import cpu_seconds, kind_of, peak_rss_mib
from bench.systems import EtcdSystem, GaleraSystem, Node, System, TxSyncSystem
from txsync.client import Client
from txsync.v1 import admin_pb2, admin_pb2_grpc

SPAWN_S = 2.5
"""Time for the client processes to start before their warm-up ends."""
PACKAGES = ("etcd-server", "etcd-client", "mariadb-server", "mariadb-client", "galera-4", "rsync")


@dataclass
class Run:
    system: str
    rtt_ms: float
    clients_per_node: int
    batch: int
    """Rows per call."""
    nodes: int = 3
    workers: int = 0
    rows_per_tx: int = 1
    """Rows in one transaction: ``batch`` for etcd's and Galera's batches and TxSync's
    batch shaped like theirs, 1 for TxSync's ``SubmitBatch`` (independent transactions)."""
    wait: str = ""
    """TxSync: what its clients waited for at their own DC ("accepted" or "ok")."""
    read: str = ""
    """Not "": a run of point reads (``load.Plan.read``); its rows are reads, counted by
    the clients."""
    committed_per_s: float = 0.0
    """Rows committed a second, by the system's own counter."""
    transactions_per_s: float = 0.0
    client_rows_per_s: float = 0.0
    """Rows committed a second as the clients counted them (a check on the system's own
    counter: they differ by the calls in flight at the window's edges)."""
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    node_p50_ms: dict[str, float] = field(default_factory=dict)
    node_roles: dict[str, str] = field(default_factory=dict)
    aborts: int = 0
    errors: list[str] = field(default_factory=list)
    wan_bytes_per_tx: float = 0.0
    cpu_ms_per_1k_tx: dict[str, float] = field(default_factory=dict)
    """CPU per 1,000 rows committed, per kind of process (summed over nodes), in
    milliseconds of CPU (a row is a transaction but in etcd's and Galera's batches)."""
    harness_cpu_ms_per_1k_tx: dict[str, float] = field(default_factory=dict)
    """The same for the harness: "clients" (their processes) and "suite" (this process:
    the link emulators of every system and the samplers)."""
    others_cpu_s_per_s: float = 0.0
    """CPU the other systems' processes, idle meanwhile, took a second in the window."""
    peak_mib: dict[str, float] = field(default_factory=dict)
    """Peak resident memory of the largest process of each kind."""
    applied_per_s_per_worker: float | None = None
    rounds: dict[str, float] | None = None


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class Timing:
    duration_s: float
    """Measured seconds per run."""
    warmup_s: float


@dataclass(frozen=True)
class Point:
    """One shape of load: ``clients`` per node, ``batch`` rows per call."""

    clients: int
    batch: int = 1
    rows_per_tx: int = 1
    """TxSync: 1, a batch of independent transactions; ``batch``, one transaction."""
    wait: str = "accepted"
    """TxSync: "accepted" or "ok" at the client's own DC."""
    only: str = ""
    """The one system this point is for ("": every system)."""
    read: str = ""
    """Not "": point reads by key instead of writes (``load.Plan.read``)."""

    def label(self) -> str:
        if self.read:
            return f"{self.clients}/node reads ({self.read})"
        return f"{self.clients}/node batch {self.batch}x{self.rows_per_tx} wait {self.wait}"

    def for_system(self, system: System) -> bool:
        return not self.only or self.only == system.name


def points_of(clients: list[int], batch: int) -> list[Point]:
    """Single writes at every client count; TxSync answered at OK at the lightest; then
    batched against batched at the second count: the peers' one transaction of ``batch``
    rows, TxSync's ``SubmitBatch`` of ``batch`` transactions and TxSync's one transaction
    of ``batch`` upserts."""
    points = [Point(c) for c in clients]
    points.append(Point(min(clients), wait="ok", only="TxSync"))
    if batch > 1:  # batched against batched (issue 20)
        batched = clients[min(1, len(clients) - 1)]
        points.append(Point(batched, batch))
        points.append(Point(batched, batch, rows_per_tx=batch, only="TxSync"))
    return points


def read_points_of(clients: list[int]) -> list[Point]:
    """Point reads by key at the client's own node, at the lightest and the busiest
    client counts, after the writes (the keys are there): TxSync's ``query``, Galera's
    local SELECT, etcd's linearizable and serializable Range."""
    points = []
    for count in sorted({min(clients), max(clients)}):
        points += [Point(count, read="own DC", only="TxSync"),
                   Point(count, read="local", only="Galera"),
                   Point(count, read="linearizable", only="etcd"),
                   Point(count, read="serializable", only="etcd")]  # fmt: skip
    return points


def measure(
    system: System, nodes: list[Node], point: Point, *, rtt_ms: float, timing: Timing,
    others: tuple[System, ...] = (),
) -> Run:  # fmt: skip
    """One run: load every node with ``point.clients`` clients for ``duration_s``
    measured; ``others`` are the systems idle meanwhile (their CPU is recorded)."""
    clients, batch = point.clients, point.batch
    txsync = system if isinstance(system, TxSyncSystem) else None
    rows_per_tx = batch if system.batch_is_one_commit else point.rows_per_tx
    run = Run(system.name, rtt_ms, clients, batch, nodes=len(nodes), rows_per_tx=rows_per_tx,
              wait=point.wait if txsync and not point.read else "",
              read=point.read)  # fmt: skip
    run.node_roles = {n.name: n.role for n in nodes if n.role}
    measure_from = time.time() + SPAWN_S + timing.warmup_s
    stop_at = measure_from + timing.duration_s
    plans = [load.Plan(system.name, n.name, n.address, clients, measure_from, stop_at, batch,
                       point.rows_per_tx, point.wait, point.read) for n in nodes]  # fmt: skip
    pids = system.processes()
    other_pids = [pid for other in others for pid in other.processes().values()]
    with ThreadPoolExecutor(1) as pool:
        loading = pool.submit(load.run, plans)
        time.sleep(max(0.0, measure_from - time.time()))
        began = time.time()
        committed_before = system.committed()
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        others_before = sum(cpu_seconds(pid) for pid in other_pids)
        suite_before = time.process_time()
        bytes_before = sum(link.bytes_forwarded for link in system.emulator.links.values())
        applied_before = txsync.applied() if txsync else 0
        queue = _sample_queue(txsync, stop_at) if txsync else []
        time.sleep(max(0.0, stop_at - time.time()))
        transactions = system.committed() - committed_before
        suite_cpu = time.process_time() - suite_before
        committed = transactions * rows_per_tx  # rows, as TxSync's SubmitBatch counts them
        ended = time.time()
        cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
        others_cpu = sum(cpu_seconds(pid) for pid in other_pids) - others_before
        wan_bytes = sum(link.bytes_forwarded for link in system.emulator.links.values())
        wan_bytes -= bytes_before
        if txsync:
            run.workers = txsync.workers
            applied = txsync.applied() - applied_before
            run.applied_per_s_per_worker = applied / (ended - began) / (len(nodes) * txsync.workers)
            dc1_coordinator = next(
                (s for name, s in cpu.items() if name.startswith("sync-coordinator dc1")), 0.0
            )
            run.rounds = _round_costs(txsync, (began, ended), wan_bytes, dc1_coordinator, queue)
        results = loading.result()
    latencies = [ms for result in results for ms in result.latencies_ms]
    if point.read:  # nothing committed: reads as the clients counted them (per read below)
        transactions = committed = sum(r.committed for r in results)
    run.committed_per_s = committed / (ended - began)
    run.transactions_per_s = transactions / (ended - began)
    run.client_rows_per_s = sum(r.committed for r in results) / timing.duration_s
    run.others_cpu_s_per_s = others_cpu / (ended - began)
    if committed:
        clients_cpu = sum(r.cpu_s for r in results)
        run.harness_cpu_ms_per_1k_tx = {"clients": 1e6 * clients_cpu / committed,
                                        "suite": 1e6 * suite_cpu / committed}  # fmt: skip
    run.p50_ms, run.p99_ms = _percentile(latencies, 0.5), _percentile(latencies, 0.99)
    run.node_p50_ms = {r.node: _percentile(r.latencies_ms, 0.5) for r in results}
    run.aborts = sum(r.aborts for r in results)
    run.errors = [error for r in results for error in r.errors][:5]
    run.wan_bytes_per_tx = wan_bytes / committed if committed else 0.0
    by_kind: dict[str, float] = {}
    for name, seconds in cpu.items():
        by_kind[kind_of(name)] = by_kind.get(kind_of(name), 0.0) + seconds
    run.cpu_ms_per_1k_tx = {
        k: 1e6 * s / committed if committed else 0.0 for k, s in by_kind.items()
    }
    for name, pid in pids.items():
        run.peak_mib[kind_of(name)] = max(run.peak_mib.get(kind_of(name), 0.0), peak_rss_mib(pid))
    return run


def _sample_queue(system: TxSyncSystem, stop_at: float) -> list[int]:
    """dc1's incoming queue length every 0.25 s until ``stop_at``, in the background."""
    samples: list[int] = []
    address = system.nodes_addresses()[0]

    def sample() -> None:
        with grpc.insecure_channel(address) as channel:
            stub = admin_pb2_grpc.AdminServiceStub(channel)
            while time.time() < stop_at - 0.1:
                status = stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=5)
                samples.append(int(status.local.incoming_len))
                time.sleep(0.25)

    threading.Thread(target=sample, daemon=True).start()
    return samples


def _round_costs(system: TxSyncSystem, window: tuple[float, float], wan_bytes: int,
                 coordinator_cpu_s: float, queue: list[int]) -> dict[str, float]:  # fmt: skip
    """What dc1's rounds in the window carried and cost: bytes on the WAN (all links) and
    dc1's coordinator CPU per round, beside the incoming queue's mean length."""
    began, ended = window
    address = system.nodes_addresses()[0]
    with grpc.insecure_channel(address) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        answer = stub.ListRounds(admin_pb2.ListRoundsRequest(limit=1000), timeout=10)
    inside = [r for r in answer.rounds if began <= r.started.ToMilliseconds() / 1000 < ended]
    count = len(inside) or 1
    return {
        "rounds_per_s": len(inside) / (ended - began),
        "added_per_round": sum(r.added for r in inside) / count,
        "deadline_share": sum(r.outcome == "deadline" for r in inside) / count,
        "wan_bytes_per_round": wan_bytes / count,
        "coordinator_cpu_ms_per_round": 1000 * coordinator_cpu_s / count,
        "incoming_mean": statistics.fmean(queue) if queue else 0.0,
    }


def probe(system: TxSyncSystem, samples: int) -> dict[str, float]:
    """Light load: one transaction at a time, each DC in turn submitting; the time until
    every DC has it ACCEPTED, and until every DC has it OK (its workers applied it)."""
    # A client per DC (each asks its own DC only), without keys: a probe, not a writer.
    clients = [Client(a, idempotent=False, timeout=30) for a in system.nodes_addresses()]
    accepted: list[float] = []
    finished: list[float] = []
    from bench.systems import KEYS, TXSYNC_UPSERT  # noqa: PLC0415

    try:
        with ThreadPoolExecutor(2 * len(clients)) as pool:
            for n in range(samples + 3):
                started = time.perf_counter()
                origin = clients[n % len(clients)]
                tx_id = origin.submit(TXSYNC_UPSERT, n % KEYS, "p", wait=None).tx_id

                def until(client: Client, state: str, tx: str = tx_id) -> float:
                    client.wait(tx, state)  # Timeout if not within 30 s
                    return time.perf_counter()

                waits_a = [pool.submit(until, c, "accepted") for c in clients]
                waits_o = [pool.submit(until, c, "ok") for c in clients]
                at_a = max(w.result() for w in waits_a)
                at_o = max(w.result() for w in waits_o)
                if n >= 3:
                    accepted.append((at_a - started) * 1000)
                    finished.append((at_o - started) * 1000)
                time.sleep(0.02)
    finally:
        for client in clients:
            client.close()
    return {
        "accepted_all_p50_ms": _percentile(accepted, 0.5),
        "accepted_all_p99_ms": _percentile(accepted, 0.99),
        "ok_all_p50_ms": _percentile(finished, 0.5),
        "ok_all_p99_ms": _percentile(finished, 0.99),
        "samples": float(len(accepted)),
    }


SERVICES_DIR = Path(txsync.__file__).resolve().parent
"""The services every cluster of the run starts (they import the same package)."""


def services_fingerprint(root: Path = SERVICES_DIR) -> str:
    """Every source file under ``root`` by path, size and modification time: differs
    once any is edited, added or removed."""
    files = sorted(path for path in root.rglob("*") if path.suffix in (".py", ".so", ".pyi"))
    stats = [(str(path.relative_to(root)), path.stat()) for path in files]
    return repr([(name, stat.st_size, stat.st_mtime_ns) for name, stat in stats])


def build_of(root: Path = SERVICES_DIR) -> str:
    """The commit the services come from, short, with " + local changes" when their
    files differ from it ("unknown" outside a git checkout)."""

    commit = _first_line(["git", "-C", str(root), "rev-parse", "--short", "HEAD"])
    if not commit:
        return "unknown"
    changes = _first_line(["git", "-C", str(root), "status", "--porcelain", "--", "."])
    return commit + (" + local changes" if changes else "")


def _first_line(command: list[str]) -> str | None:
    """The first line ``command`` prints ("" for none); None if it cannot be run."""
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return None
    printed = out.stdout.strip()
    return printed.splitlines()[0] if printed else ""


def machine() -> dict[str, str]:
    def version(command: list[str]) -> str:
        line = _first_line(command)
        return "not installed" if line is None else line or "?"

    return {
        "platform": platform.platform(),
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "etcd": version(["etcd", "--version"]),
        "mariadb": version(["mariadbd", "--version"]),
        "galera": version(["dpkg-query", "-W", "-f", "${Version}", "galera-4"]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "build": build_of(),
    }


def _make(name: str, one_way_ms: float, coordinator_args: tuple[str, ...]) -> System:
    if name == "TxSync":
        return TxSyncSystem(one_way_ms, coordinator_args=coordinator_args)
    if name == "etcd":
        return EtcdSystem(one_way_ms)
    if name == "Galera":
        return GaleraSystem(one_way_ms)
    raise ValueError(name)


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 2)[2])  # fmt: skip
    parser.add_argument("--rtts", default="0,10,50", help="round-trip times in ms")
    parser.add_argument("--systems", default="TxSync,etcd,Galera")
    parser.add_argument("--clients", default="1,4,16", help="clients per node, each a point")
    parser.add_argument("--reps", type=int, default=3, help="runs of each point (median shown)")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.5, help="seconds before measuring")
    parser.add_argument("--batch", type=int, default=50,
                        help="writes per batched call: TxSync SubmitBatch, etcd Txn, Galera "
                        "multi-row upsert")  # fmt: skip
    parser.add_argument("--probe-samples", type=int, default=30)
    parser.add_argument("--scaling-rtt", type=float, default=10.0,
                        help="RTT of the scaling run; negative: skip it")  # fmt: skip
    parser.add_argument("--coordinator-args", default="",
                        help="extra sync-coordinator flags for TxSync, e.g. "
                             "'--repost-gap-ms 10' (tuning experiments)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("build/bench/results.json"))
    parser.add_argument("--doc", default="docs/benchmarks.md",
                        help="the page to regenerate ('' for none)")  # fmt: skip
    options = parser.parse_args()
    started = time.monotonic()
    fingerprint = services_fingerprint()
    results: dict[str, Any] = {"machine": machine(), "options": vars(options) | {
        "out": str(options.out)}, "runs": [], "reads": [], "probes": [],
        "scaling": []}  # fmt: skip
    clients = [int(c) for c in options.clients.split(",")]
    timing = Timing(options.duration, options.warmup)
    coordinator_args = tuple(options.coordinator_args.split())
    for rtt in (float(r) for r in options.rtts.split(",")):
        with ExitStack() as stack:
            running: list[tuple[System, list[Node]]] = []
            for name in options.systems.split(","):
                system = _make(name, rtt / 2, coordinator_args)
                stack.callback(system.stop)
                _log(f"{name} at {rtt:.0f} ms RTT: starting")
                running.append((system, system.start()))
            for system, _ in running:
                if isinstance(system, TxSyncSystem):
                    _log("  probe: one transaction at a time")
                    results["probes"].append({"rtt_ms": rtt} | probe(system, options.probe_samples))
            points = [(p, "runs") for p in points_of(clients, options.batch)]
            points += [(p, "reads") for p in read_points_of(clients)]
            for point, kind in points:
                for rep in range(options.reps):
                    for system, nodes in running:  # in turn: drift falls on all alike
                        if not point.for_system(system):
                            continue
                        others = tuple(other for other, _ in running if other is not system)
                        run = measure(system, nodes, point, rtt_ms=rtt, timing=timing,
                                      others=others)  # fmt: skip
                        results[kind].append(asdict(run))
                        _log(f"  {system.name} {point.label()} run {rep + 1}: "
                             f"{run.committed_per_s:.0f} rows/s, "
                             f"{run.transactions_per_s:.0f} tx/s, p50 {run.p50_ms:.1f} ms, "
                             f"p99 {run.p99_ms:.1f} ms, {len(run.errors)} errors")  # fmt: skip
            for system, _ in running:
                if isinstance(system, GaleraSystem):
                    results.setdefault("galera_conflicts", {})[str(rtt)] = (
                        system.certification_failures()
                    )
                    results.setdefault("galera_settings", {})[str(rtt)] = system.send_windows()
    if options.scaling_rtt >= 0 and "TxSync" in options.systems:
        per_node = clients[min(1, len(clients) - 1)]
        for dcs, workers in ((3, 1), (4, 1), (5, 1), (3, 2), (3, 4)):
            system = TxSyncSystem(options.scaling_rtt / 2, dcs=dcs, workers=workers,
                                  coordinator_args=coordinator_args)  # fmt: skip
            _log(f"scaling: {dcs} DCs x {workers} workers at {options.scaling_rtt:.0f} ms RTT")
            try:
                nodes = system.start()
                for _ in range(options.reps):
                    run = measure(system, nodes, Point(per_node), rtt_ms=options.scaling_rtt,
                                  timing=timing)  # fmt: skip
                    results["scaling"].append(asdict(run))
                    _log(f"  {run.committed_per_s:.0f} tx/s, p50 {run.p50_ms:.1f} ms, applied "
                         f"{run.applied_per_s_per_worker:.0f}/s per worker")  # fmt: skip
            finally:
                system.stop()
    results["seconds"] = time.monotonic() - started
    changed = services_fingerprint() != fingerprint
    results["services_changed_during_run"] = changed
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(results, indent=1) + "\n")
    _log(f"results: {options.out} ({results['seconds'] / 60:.1f} min)")
    if changed:
        _log(f"the services under {SERVICES_DIR} changed during the run: its clusters "
             "ran different builds, so the page is not regenerated (see --help)")  # fmt: skip
        return 1
    if options.doc:
        from bench.report import render  # noqa: PLC0415 - matplotlib only when rendering

        render(results, Path(options.doc))
        _log(f"page: {options.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
