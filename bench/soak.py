"""A long history, then a steady load: is every process bounded by what is unfinished?

    make bench-soak        (or: .venv/bin/python -m bench.soak --help)

One 3-DC cluster of real processes (``txsync dev up``'s services, 1 SQLite worker per
DC, the store's default txlog settings). In one run:

1. **at the small history** (``--small``, 10,000): a steady load of ``--rate``
   single-row upserts a second on 10,000 keys, spread over the DCs, for ``--probe-s``;
   then dc1's transaction-store and worker are restarted, each timed exec to SERVING;
2. **the middle history**: batched upserts until ``--middle`` (100,000) transactions
   were ordered, then the same steady load and restarts (``--middle 0`` leaves it out);
3. **the long history**: batched upserts until ``--history`` (1,000,000) transactions
   were ordered, with progress;
4. **at the long history**: the same steady load for ``--steady-s`` (600), then the same
   restarts;
5. **a DC down** (``--dc-down-s``, 0: left out): dc3 stopped whole while the steady load
   goes on at dc1 and dc2 for that long, with dc1's coordinator and store restarted
   halfway (a pod restart: they never hear from dc3 again, and must let it go from the
   store's record); then dc3 started again and timed until the cluster is whole. Run
   it with a store flag such as ``--store-args "--peer-hold-max 20000"``: dc3's peers
   then let it go once it is that far behind, their memory and disk stay flat, and dc3
   comes back from a copy (``docs/operations.md``, "A DC down for long is let go").
   Without the bound the peers hold every position dc3 has not passed.

Why a middle history: the batched load's peak sets a high-water mark that the process's
allocator keeps (pymalloc returns an arena only when every object in it is gone; see
``docs/benchmarks.md``), and the small history is measured before any such load. The
middle history is measured after one, so middle -> long isolates what the history itself
adds: the figure the short test's "fails if memory grows with history" is about. The
summary also gives each store's RSS around its first rotation, the moment that mark is
set: the small history's steady phase comes before any (``first_rotations``).

Every ``--sample-s`` it samples the resident memory (VmRSS) of every process, each DC's
bytes on disk (txlog and worker database), the p99 of the submits (submit to ACCEPTED)
of the last interval, each process's CPU time (CPU per steady submit by process kind)
and the machine's idle and stolen time: where a p99 that drifts comes from. Rotations
come from the stores' logs (when, how long, how long they held the lock, how much they
truncated). It prints the comparison at the two histories against issue 47's targets,
writes the samples as JSON and draws the curves (``--out``, default
``docs/benchmarks/soak``). Nothing is asserted: the figures go to ``docs/benchmarks.md``
by hand, with the date. ``tests/dev_cluster/test_history_bounded.py`` is the short
version that fails.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shlex
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import grpc

from bench.proc_stats import cpu_seconds
from tests.support.dev_up import free_base_port
from txsync.client import BatchFailed, Client, TxSyncError
from txsync.dev_cluster import DevCluster, Service, layout_of
from txsync.v1 import admin_pb2, admin_pb2_grpc

KEYS = 10_000
UPSERT = "INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)"
BATCH = 500
"""Transactions per submit_many while the history is loaded."""
LOADERS = 12
"""Threads loading the history, spread over the DCs."""
STEADY_CLIENTS = 32
"""Callers of the steady load, each paced to its share of ``--rate`` (a submit waits
for ACCEPTED, about a round: 6 callers reached only 110 a second)."""
RESTART_TIMEOUT_S = 600.0
ROTATED = re.compile(
    r"^(\S+ \S+) INFO \S+ txlog rotated in (\d+) ms \(lock held (\d+) ms[^)]*\): (\d+) "
    r"transactions truncated, (\d+) kept"
)


@dataclass
class Sample:
    at_s: float
    phase: str
    history: int
    rss_mib: dict[str, float]
    """By process name ("dc1 transaction-store", ...)."""
    disk_mib: dict[str, float]
    """By DC: its txlog directory and worker databases."""
    submit_p99_ms: float | None
    submits: int
    txs_held: dict[str, int] = field(default_factory=dict)
    """By DC: the transactions its store holds in memory (unfinished, or not truncated)."""
    cpu_s: dict[str, float] = field(default_factory=dict)
    """By process name: CPU seconds it has used since it started (a restart starts it
    again): the differences between samples give CPU per submit over time."""
    host_cpu: dict[str, int] = field(default_factory=dict)
    """The machine's CPU time so far by kind ("idle", "steal", ...; /proc/stat, in
    ticks): a p99 that moves while the host gives less time to this machine (steal) or
    has none to spare (idle) is the host's, not the cluster's."""


@dataclass
class Rotation:
    dc: str
    at: str
    took_ms: int
    lock_ms: int
    truncated: int
    kept: int


@dataclass
class Results:
    samples: list[Sample] = field(default_factory=list)
    restarts_s: dict[str, dict[str, float]] = field(default_factory=dict)
    """Phase -> service kind -> seconds from exec to SERVING. The store is timed twice:
    as found, and again just after a rotation (``AFTER_ROTATION``)."""
    restarts_replayed: dict[str, dict[str, int]] = field(default_factory=dict)
    """Phase -> the store's restart (as ``restarts_s``) -> log entries it replayed (its
    "txlog recovered" line): what a restart's time follows."""
    rotations: list[Rotation] = field(default_factory=list)
    loaded_per_s: float = 0.0
    load_errors: int = 0
    """Batches of the history load that failed (and were loaded again)."""
    dc_back_s: float | None = None
    """With ``--dc-down-s``: seconds from starting dc3 again to a whole cluster."""
    dc_back_from_copy: bool = False
    """Whether dc3 came back by adopting a copy (its coordinator's log says so)."""
    started_unix: float = 0.0
    """Wall-clock time of ``at_s`` 0: places the rotations (logged in wall-clock time)
    among the samples."""


AFTER_ROTATION = "transaction-store, just after a rotation"
RECOVERED = re.compile(r"txlog recovered: (\d+) entries")


def _entries_replayed(store: Service) -> int:
    """The entries the store's last start replayed, from its log (0: not found)."""
    found = RECOVERED.findall(store.log_path.read_text(errors="replace"))
    return int(found[-1]) if found else 0


def rss_mib(pid: int) -> float:
    """``pid``'s resident memory (OSError once it has ended)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ProcessLookupError(f"process {pid} has no VmRSS: it is ending")


def _by_process(services: list[Service], read: Callable[[int], float]) -> dict[str, float]:
    """``read(pid)`` of every service running, by name."""
    found = {}
    for service in services:
        if service.process is not None and service.process.poll() is None:
            try:
                found[service.name] = read(service.process.pid)
            except OSError:
                continue  # it ended meanwhile
    return found


HOST_CPU_KINDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def _host_cpu() -> dict[str, int]:
    first = Path("/proc/stat").read_text().split("\n", 1)[0].split()  # "cpu  user nice ..."
    return dict(zip(HOST_CPU_KINDS, map(int, first[1:]), strict=False))


def _host_share(earlier: Sample, later: Sample) -> str:
    """The machine's time between two samples, as ", host idle 4%, steal 2%" (to end
    a sample's line), or "" if none was counted."""
    spent = {k: later.host_cpu.get(k, 0) - earlier.host_cpu.get(k, 0) for k in HOST_CPU_KINDS}
    total = sum(spent.values())
    if total <= 0:
        return ""
    return (
        f", host idle {100 * spent['idle'] / total:.0f}%, steal {100 * spent['steal'] / total:.0f}%"
    )


def cpu_ms_per_submit(earlier: Sample, later: Sample, kind: str) -> float | None:
    """CPU milliseconds the processes of ``kind`` (every DC's) used per steady submit
    between two samples; a process restarted meanwhile is left out of that interval."""
    if not later.submits:
        return None
    used = sum(
        later.cpu_s[name] - earlier.cpu_s[name]
        for name in later.cpu_s
        if _kind(name) == kind and later.cpu_s[name] >= earlier.cpu_s.get(name, float("inf"))
    )
    return 1000 * used / later.submits


def bytes_under(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


class Soak:
    def __init__(self, options: argparse.Namespace) -> None:
        self.options = options
        self.root = Path(tempfile.mkdtemp(prefix="soak-"))
        self.layout = layout_of(self.root, 3, free_base_port(3), witness=False, workers=1)
        store_args = shlex.split(options.store_args)
        self.cluster = DevCluster(self.layout, extra_args={"transaction-store": store_args})
        self.results = Results()
        self.started = time.monotonic()
        self.results.started_unix = time.time()
        self.phase = "start"
        self._latencies: list[float] = []
        self._lock = threading.Lock()
        self._sampling = threading.Event()
        self._supervision = threading.Lock()
        """Held by the supervisor's look and by a timed restart: the supervisor restarts
        what exits (a coordinator whose store restarted does, by design), as dev up's."""

    @property
    def stores(self) -> list[str]:
        return [dc["store"] for dc in self.layout["dcs"].values()]

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f} s] {text}", flush=True)

    # --- measuring -----------------------------------------------------------------

    def history(self) -> int:
        with grpc.insecure_channel(self.stores[0]) as channel:
            status = admin_pb2_grpc.AdminServiceStub(channel).GetStatus(
                admin_pb2.GetStatusRequest(), timeout=30
            )
        return int(status.local.merge_base.synced_len)

    def wait_whole(self) -> None:
        """Until every DC is healthy, in the view and without lag: a phase starts on a
        whole cluster. A DC cut off while the others order thousands of transactions a
        second fetches their bodies one by one afterwards (slowly: see the note in
        docs/benchmarks.md), which is not what this benchmark measures."""
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        while True:
            try:
                with grpc.insecure_channel(self.stores[0]) as channel:
                    answer = admin_pb2_grpc.AdminServiceStub(channel).GetStatus(
                        admin_pb2.GetStatusRequest(cluster=True), timeout=30
                    )
                statuses = [answer.local, *answer.others]
                if all(s.healthy and len(s.view.members) == 3 and not s.lag for s in statuses):
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not become whole again")
            time.sleep(0.5)

    def sample(self) -> Sample:
        rss = _by_process(self.cluster.services, rss_mib)
        disk = {
            dc: bytes_under(Path(entry["data"])) / 2**20 for dc, entry in self.layout["dcs"].items()
        }
        with self._lock:
            latencies, self._latencies = self._latencies, []
        p99 = statistics.quantiles(latencies, n=100)[98] * 1000 if len(latencies) >= 20 else None
        return Sample(
            round(time.monotonic() - self.started, 1), self.phase, self.history(), rss, disk,
            p99, len(latencies), self.txs_held(), _by_process(self.cluster.services, cpu_seconds),
            _host_cpu(),
        )  # fmt: skip

    def txs_held(self) -> dict[str, int]:
        """By DC (those answering): the transactions its store holds in memory."""
        held = {}
        for dc, entry in self.layout["dcs"].items():
            try:
                with grpc.insecure_channel(entry["store"]) as channel:
                    status = admin_pb2_grpc.AdminServiceStub(channel).GetStatus(
                        admin_pb2.GetStatusRequest(), timeout=30
                    )
            except grpc.RpcError:
                continue  # restarting
            held[dc] = int(status.local.retention.txs_held)
        return held

    def _supervise_loop(self) -> None:
        while not self._sampling.wait(0.2):
            with self._supervision:
                for event in self.cluster.supervise():
                    self.say(event)

    def _sample_loop(self) -> None:
        while not self._sampling.wait(self.options.sample_s):
            try:
                sample = self.sample()
            except grpc.RpcError:
                continue  # a store restarting
            earlier = self.results.samples[-1] if self.results.samples else None
            self.results.samples.append(sample)
            store_rss = max(v for k, v in sample.rss_mib.items() if "transaction-store" in k)
            disk = max(sample.disk_mib.values())
            held = max(sample.txs_held.values(), default=0)
            self.say(
                f"{sample.phase}: history {sample.history:,}, store RSS {store_rss:.0f} MiB, "
                f"held {held:,}, disk {disk:.0f} MiB, p99 {sample.submit_p99_ms or 0:.1f} ms"
                + (_host_share(earlier, sample) if earlier is not None else "")
            )

    # --- load ------------------------------------------------------------------------

    def load_history(self, until: int) -> None:
        """Batched upserts from LOADERS threads until ``until`` transactions are ordered."""
        start_history, started = self.history(), time.monotonic()
        left = [max(0, until - start_history)]
        lock = threading.Lock()

        def loader(n: int) -> None:
            address = self.stores[n % len(self.stores)]
            with Client(address, timeout=120, idempotent=False, batch_max=BATCH) as client:
                k = n
                while True:
                    with lock:
                        count = min(BATCH, left[0])
                        left[0] -= count
                    if count <= 0:
                        return
                    try:
                        client.submit_many(
                            [(UPSERT, ((k + i) % KEYS, k + i)) for i in range(count)],
                            wait="accepted",
                        )
                    except TxSyncError as error:
                        # Counted, and what failed is loaded again: one slow batch on a
                        # busy machine must not end a loader (and with it the phase's
                        # load). Its transactions that went through stay (no keys).
                        failed = len(error.errors) if isinstance(error, BatchFailed) else count
                        self.results.load_errors += 1
                        self.say(f"{failed} of a loader's batch failed ({error}); loading again")
                        with lock:
                            left[0] += failed
                    k += count

        _in_threads(loader, LOADERS)
        loaded = self.history() - start_history
        self.results.loaded_per_s = loaded / (time.monotonic() - started)
        self.say(f"loaded {loaded:,} in {time.monotonic() - started:.0f} s")

    def steady(self, seconds: float, stores: list[str] | None = None) -> None:
        """``--rate`` single upserts a second (wait accepted) from STEADY_CLIENTS threads,
        spread over ``stores`` (every DC's by default)."""
        stop = time.monotonic() + seconds
        gap = STEADY_CLIENTS / self.options.rate
        addresses = stores or self.stores

        def client_loop(n: int) -> None:
            address = addresses[n % len(addresses)]
            with Client(address, timeout=60, idempotent=False) as client:
                next_at, k = time.monotonic(), n
                while time.monotonic() < stop:
                    time.sleep(max(0.0, next_at - time.monotonic()))
                    begun = time.perf_counter()
                    try:
                        client.submit(UPSERT, k % KEYS, k, wait="accepted")
                    except Exception as error:
                        self.say(f"submit failed: {error}")
                        next_at += gap
                        continue
                    with self._lock:
                        self._latencies.append(time.perf_counter() - begun)
                    next_at += gap
                    k += STEADY_CLIENTS

        _in_threads(client_loop, STEADY_CLIENTS)

    def restart(self, kinds: tuple[str, ...] = ("transaction-store", "worker")) -> dict[str, float]:
        """Restart dc1's services of these kinds one at a time: exec to SERVING each."""
        took: dict[str, float] = {}
        for kind in kinds:
            took[kind] = self._restart_one(self._dc1(kind))
            self.say(f"dc1 {kind} restarted to SERVING in {took[kind]:.2f} s")
        return took

    def _dc1(self, kind: str) -> Service:
        return next(
            s for s in self.cluster.services if s.name.startswith("dc1") and s.name.endswith(kind)
        )

    def phase_restarts(self, phase: str) -> None:
        """The phase's timed restarts of dc1's store and worker; the store's again just
        after a rotation (an operator's ``txsync log truncate``). A store replays its
        newest snapshot and what was appended since (up to ``--log-file-bytes-max``): as
        found, the time follows where the current file is in its cycle, whatever the
        history; just after a rotation it is the snapshot's, which is what could grow
        with the history (the transactions kept)."""
        took = self.restart()
        store = self._dc1("transaction-store")
        replayed = {"transaction-store": _entries_replayed(store)}
        with grpc.insecure_channel(store.address) as channel:
            admin_pb2_grpc.AdminServiceStub(channel).TruncateLog(
                admin_pb2.TruncateLogRequest(), timeout=RESTART_TIMEOUT_S
            )
        took[AFTER_ROTATION] = self._restart_one(store)
        replayed[AFTER_ROTATION] = _entries_replayed(store)
        self.say(
            f"dc1 {AFTER_ROTATION} restarted to SERVING in {took[AFTER_ROTATION]:.2f} s "
            f"({replayed[AFTER_ROTATION]:,} entries replayed; as found "
            f"{replayed['transaction-store']:,})"
        )
        self.results.restarts_s[phase] = took
        self.results.restarts_replayed[phase] = replayed

    def _restart_one(self, service: Service) -> float:
        with self._supervision:
            _stopped([service])
            started = time.monotonic()
            service.start()
            deadline = started + RESTART_TIMEOUT_S
            # check_serving drops a failed check's channel: the start is seen when it
            # happens, not at gRPC's next reconnect attempt.
            while not service.check_serving():
                if time.monotonic() > deadline or not service.running:
                    raise RuntimeError(f"{service.name} did not serve again:\n{service.log_tail()}")
                time.sleep(0.02)
            took = time.monotonic() - started
            service.serving, service.serving_since = True, time.monotonic()
        return took

    def dc_down(self, seconds: float) -> None:
        """dc3 stopped whole (the supervisor leaves it down) while dc1 and dc2 take the
        steady load for ``seconds``, dc1's coordinator and store restarted halfway; then
        dc3 started again, and timed until the cluster is whole (``dc_back_s``)."""
        down = [s for s in self.cluster.services if s.name.split(" ")[0].startswith("dc3")]
        with self._supervision:
            for service in down:
                service.not_before = float("inf")  # supervise() starts none of them
            _stopped(down)
            for service in down:
                service.process, service.serving = None, False
        self.say(f"dc3 down: {', '.join(s.name for s in down)}")
        self.phase = "dc3 down"
        others = [dc["store"] for name, dc in self.layout["dcs"].items() if name != "dc3"]
        self.steady(seconds / 2, others)
        self.restart(("sync-coordinator", "transaction-store"))
        self.steady(seconds / 2, others)
        self.phase = "dc3 back"
        started = time.monotonic()
        with self._supervision:
            for service in down:
                service.not_before = 0.0
        self.wait_whole()
        self.results.dc_back_s = time.monotonic() - started
        coordinator = next(s for s in down if s.name.endswith("sync-coordinator"))
        said = coordinator.log_path.read_text(errors="replace")
        self.results.dc_back_from_copy = "DC COPY: the store adopted" in said
        back_s = self.results.dc_back_s
        self.say(f"dc3 back {_how_back(self.results)}: the cluster whole in {back_s:.1f} s")

    def rotations(self) -> list[Rotation]:
        found = []
        for dc, entry in self.layout["dcs"].items():
            log = Path(entry["data"]) / "transaction-store.log"
            for line in log.read_text(errors="replace").splitlines():
                match = ROTATED.match(line)
                if match:
                    at, took, lock, truncated, kept = match.groups()
                    found.append(Rotation(dc, at, int(took), int(lock), int(truncated), int(kept)))
        return found

    # --- the run -----------------------------------------------------------------------

    def run(self) -> Results:
        options = self.options
        self.cluster.start()
        sampler = threading.Thread(target=self._sample_loop, daemon=True)
        threading.Thread(target=self._supervise_loop, daemon=True).start()
        try:
            with Client(self.stores[0], timeout=120) as client:
                client.submit("CREATE TABLE kv (k INTEGER PRIMARY KEY, v INTEGER)", wait="ok")
            sampler.start()
            histories = [("small", options.small, options.probe_s)]
            if options.middle:
                histories.append(("middle", options.middle, options.probe_s))
            histories.append(("long", options.history, options.steady_s))
            for name, history, seconds in histories:
                self.wait_whole()  # each phase starts on a whole cluster
                self.phase = f"load {name}"
                self.load_history(history)
                self.phase = f"steady {name}"
                self.steady(seconds)
                self.phase_restarts(name)
            if options.dc_down_s:
                self.dc_down(options.dc_down_s)
        finally:
            self._sampling.set()
            self.results.rotations = self.rotations()
            self.cluster.stop()
        return self.results


def _stopped(services: list[Service]) -> None:
    """SIGTERM to each, then wait for each (killed past 120 s) and close its channel."""
    for service in services:
        service.stop()
    for service in services:
        service.wait_stopped(120)
        service.close()


def _in_threads(work: Callable[[int], None], count: int) -> None:
    """``work(0)`` .. ``work(count - 1)``, each in a thread of its own, until all end."""
    threads = [threading.Thread(target=work, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _kind(name: str) -> str:
    """ "dc1 transaction-store" -> "transaction-store"; "dc1-w1 worker" -> "worker"."""
    return name.split(" ", 1)[1]


def summary(results: Results) -> str:
    """The comparison of the steady phases, as a Markdown table, with the rotations: each
    measure at each history, long against small (issue 47's target) and, when a middle
    history was measured, long against middle (both after a batched load's peak)."""
    phases = [
        (name, samples)
        for name in ("small", "middle", "long")
        if (samples := [s for s in results.samples if s.phase == f"steady {name}"])
    ]
    names = [name for name, _ in phases]
    if "small" not in names or "long" not in names:
        return "not enough samples in the steady phases"
    by_phase = dict(phases)
    ratios = ["long/small (target)"] + (["long/middle"] if "middle" in by_phase else [])
    lines = [
        "| measure | " + " | ".join(f"at the {n} history" for n in names) + " | "
        + " | ".join(ratios) + " |",
        "| --- " * (1 + len(names) + len(ratios)) + "|",
    ]  # fmt: skip

    def row(measure: str, values: Mapping[str, float], unit: str, target: str = "") -> str:
        cells = [
            f"{values[n]:.2f} {unit}"
            if unit in ("s", "ms of CPU")
            else f"{values[n]:,.0f} {unit}".rstrip()
            for n in names
        ]
        cells.append(f"{values['long'] / values['small']:.2f}{target}")
        if "middle" in by_phase:
            cells.append(f"{values['long'] / values['middle']:.2f}")
        return f"| {measure} | " + " | ".join(cells) + " |"

    lines.append(
        "| history at the end of the phase | "
        + " | ".join(f"{by_phase[n][-1].history:,}" for n in names)
        + " |" + " |" * len(ratios)
    )  # fmt: skip
    kinds = sorted({_kind(name) for _, samples in phases for s in samples for name in s.rss_mib})
    for kind in kinds:
        peaks = {
            n: max(v for s in samples for k, v in s.rss_mib.items() if _kind(k) == kind)
            for n, samples in phases
        }
        lines.append(row(f"RSS, {kind} (largest)", peaks, "MiB", " (1.2)"))
    disks = {n: max(max(s.disk_mib.values()) for s in samples) for n, samples in phases}
    lines.append(row("disk per DC (largest)", disks, "MiB"))
    p99s = {
        n: statistics.median(s.submit_p99_ms for s in samples if s.submit_p99_ms is not None)
        for n, samples in phases
    }
    lines.append(row("submit p99 (median of the samples)", p99s, "ms"))
    for kind in kinds:
        per_submit = {
            n: v
            for n, samples in phases
            if (v := _median_cpu_per_submit(samples, kind)) is not None
        }
        if len(per_submit) == len(phases):
            lines.append(row(f"CPU per steady submit, {kind} (all DCs)", per_submit, "ms of CPU"))
    restarts, replayed = results.restarts_s, results.restarts_replayed
    for kind in restarts.get("small", {}):
        seconds = {n: restarts[n][kind] for n in names if kind in restarts.get(n, {})}
        if len(seconds) == len(names):
            lines.append(row(f"restart to SERVING, {kind}", seconds, "s", " (2)"))
        entries = {n: replayed[n][kind] for n in names if kind in replayed.get(n, {})}
        if len(entries) == len(names) and all(entries.values()):
            lines.append(row(f"log entries replayed, {kind}", entries, ""))
    rotations = results.rotations
    if rotations:
        took = sorted(r.took_ms for r in rotations)
        lock = sorted(r.lock_ms for r in rotations)
        lines += [
            "",
            f"{len(rotations)} rotations; took median {statistics.median(took):.0f} ms, "
            f"longest {took[-1]} ms; lock held median {statistics.median(lock):.0f} ms, "
            f"longest {lock[-1]} ms; {sum(r.truncated for r in rotations):,} transactions "
            f"truncated; kept at most {max(r.kept for r in rotations):,}.",
        ]
    lines.append(rotation_windows(results, by_phase["long"]))
    lines.append(first_rotations(results))
    lines.append(
        f"\nHistory loaded at {results.loaded_per_s:,.0f} tx/s; "
        f"{results.load_errors} batches failed and were loaded again."
    )
    lines.append(dc_down_summary(results))
    return "\n".join(lines)


def _median_cpu_per_submit(samples: list[Sample], kind: str) -> float | None:
    """The median over a phase's intervals of ``cpu_ms_per_submit``: the steady load's
    cost at that history, by process kind, with no restart's interval in it."""
    values = [
        v
        for earlier, later in itertools.pairwise(samples)
        if (v := cpu_ms_per_submit(earlier, later, kind)) is not None
    ]
    return statistics.median(values) if values else None


def dc_down_summary(results: Results) -> str:
    """With ``--dc-down-s``: the others' store RSS, transactions held and disk at the
    first and the last sample of dc3's absence, and how it came back."""
    down = [s for s in results.samples if s.phase == "dc3 down"]
    if len(down) < 2 or results.dc_back_s is None:
        return ""
    first, last = down[0], down[-1]
    lines = [
        f"\ndc3 down for {last.at_s - first.at_s:.0f} s of samples (history "
        f"{first.history:,} -> {last.history:,}), first -> last sample:"
    ]
    for dc in ("dc1", "dc2"):
        rss = [sample.rss_mib.get(f"{dc} transaction-store", 0.0) for sample in (first, last)]
        held = [sample.txs_held.get(dc, 0) for sample in (first, last)]
        disk = [sample.disk_mib.get(dc, 0.0) for sample in (first, last)]
        lines.append(
            f"- {dc}: store RSS {rss[0]:.0f} -> {rss[1]:.0f} MiB, held {held[0]:,} -> "
            f"{held[1]:,}, disk {disk[0]:.0f} -> {disk[1]:.0f} MiB"
        )
    lines.append(
        f"dc3 came back {_how_back(results)}; the cluster was whole "
        f"{results.dc_back_s:.1f} s later."
    )
    return "\n".join(lines)


def _how_back(results: Results) -> str:
    return "from a copy" if results.dc_back_from_copy else "by catching up"


def _rotation_span(results: Results, rotation: Rotation) -> tuple[float, float]:
    """When ``rotation`` began and ended, in seconds of the run (``Sample.at_s``)."""
    logged = datetime.strptime(rotation.at, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    ended = logged - results.started_unix  # the line is written when it ends
    return ended - rotation.took_ms / 1000, ended


def first_rotations(results: Results) -> str:
    """Each store's RSS in the last sample before its first rotation began and the
    first after it ended: a store's first rotation under a batched load set its
    allocator's high-water mark for good (2026-12-02: +11 to +14 MiB at every store
    within that second, none at the rotations after, flat to 1M), and the small
    history's steady phase comes before any rotation."""
    if not results.started_unix:
        return ""
    lines = []
    for dc in sorted({r.dc for r in results.rotations}):
        first = min(
            (r for r in results.rotations if r.dc == dc), key=lambda r: _rotation_span(results, r)
        )
        began, ended = _rotation_span(results, first)
        name = f"{dc} transaction-store"
        before = [s for s in results.samples if s.at_s < began and name in s.rss_mib]
        after = [s for s in results.samples if s.at_s > ended and name in s.rss_mib]
        if before and after:
            lines.append(
                f"{dc} {before[-1].rss_mib[name]:.0f} -> {after[0].rss_mib[name]:.0f} MiB "
                f"(history {before[-1].history:,}, {first.kept:,} kept)"
            )
    if not lines:
        return ""
    return "\nStore RSS around each store's first rotation: " + "; ".join(lines) + "."


def rotation_windows(results: Results, steady: list[Sample]) -> str:
    """The submit p99 of the steady samples whose interval saw a rotation begin or end,
    against the median p99 of the others (issue 47's target: within 1.5x)."""
    if not results.started_unix or len(steady) < 2:
        return ""
    interval = steady[1].at_s - steady[0].at_s
    touched: set[int] = set()
    for rotation in results.rotations:
        began, ended = _rotation_span(results, rotation)
        for index, sample in enumerate(steady):
            if sample.at_s - interval < ended and began <= sample.at_s:
                touched.add(index)
    with_rotation = [steady[i].submit_p99_ms for i in sorted(touched)]
    others = [s.submit_p99_ms for i, s in enumerate(steady) if i not in touched]
    rotated = [p for p in with_rotation if p is not None]
    quiet = [p for p in others if p is not None]
    if not rotated or not quiet:
        return "\nNo steady sample at the long history saw a rotation."
    baseline = statistics.median(quiet)
    return (
        f"\nSubmit p99 at the long history in the {len(rotated)} samples that saw a rotation: "
        f"{', '.join(f'{p:.0f}' for p in rotated)} ms, against a median of {baseline:.0f} ms "
        f"in the other {len(quiet)} (worst {max(rotated) / baseline:.2f}x; target 1.5x)."
    )


def draw(results: Results, out: Path) -> Path:
    from matplotlib.figure import Figure  # noqa: PLC0415 - only when drawing

    figure = Figure(figsize=(10, 11), layout="constrained")
    rss, disk, p99, cpu = figure.subplots(4, 1, sharex=True)
    at = [s.at_s for s in results.samples]
    for name in sorted({n for s in results.samples for n in s.rss_mib}):
        rss.plot(at, [s.rss_mib.get(name, float("nan")) for s in results.samples], label=name)
    rss.set_ylabel("RSS (MiB)")
    rss.legend(fontsize=6, ncol=3)
    for dc in sorted({d for s in results.samples for d in s.disk_mib}):
        disk.plot(at, [s.disk_mib.get(dc, float("nan")) for s in results.samples], label=dc)
    disk.set_ylabel("disk per DC (MiB)")
    disk.legend(fontsize=7)
    p99.plot(
        at,
        [s.submit_p99_ms if s.submit_p99_ms is not None else float("nan") for s in results.samples],
    )
    p99.set_ylabel("submit p99 (ms)")
    history = p99.twinx()
    history.plot(at, [s.history for s in results.samples], color="grey", linestyle=":")
    history.set_ylabel("history (transactions)")
    # Within one phase only: a steady phase's first interval also holds the load's CPU
    # before it, over a few steady submits (a spike of 7 s a submit at 250 s in the 1M
    # run of 2026-12-03 16:17 that flattened the rest).
    pairs = [(a, b) for a, b in itertools.pairwise(results.samples) if a.phase == b.phase]
    for kind in sorted({_kind(n) for s in results.samples for n in s.cpu_s}):
        per_submit = [cpu_ms_per_submit(a, b, kind) for a, b in pairs]
        cpu.plot(
            [b.at_s for _, b in pairs],
            [v if v is not None else float("nan") for v in per_submit],
            label=kind,
        )
    cpu.set_ylabel("CPU per steady submit (ms)")
    cpu.set_xlabel("seconds")
    cpu.legend(fontsize=7)
    for axes in (rss, disk, p99, cpu):
        for phase_start in _phase_starts(results):
            axes.axvline(phase_start[0], color="lightgrey", linewidth=0.8)
    path = out.with_suffix(".png")
    figure.savefig(path, dpi=90)
    return path


def _phase_starts(results: Results) -> list[tuple[float, str]]:
    starts: list[tuple[float, str]] = []
    for sample in results.samples:
        if not starts or starts[-1][1] != sample.phase:
            starts.append((sample.at_s, sample.phase))
    return starts


OPTIONS: tuple[tuple[str, type, object, str], ...] = (
    ("--history", int, 1_000_000, "the long history, in transactions"),
    ("--small", int, 10_000, "the small history, in transactions"),
    ("--middle", int, 100_000, "the middle history, in transactions (0: none)"),
    ("--steady-s", float, 600.0, "seconds of steady load at the long history"),
    ("--probe-s", float, 120.0, "seconds of steady load at the small history"),
    ("--rate", float, 250.0, "steady submits a second"),
    ("--sample-s", float, 10.0, "seconds between samples"),
    (
        "--dc-down-s",
        float,
        0.0,
        "then dc3 down this long under the steady load, and back (0: left out)",
    ),
    ("--out", Path, Path("docs/benchmarks/soak"), "where the JSON and the PNG go"),
    (
        "--store-args",
        str,
        "",
        "extra transaction-store flags, e.g. '--unfinished-max 4096' (tuning experiments)",
    ),
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for flag, kind, default, meaning in OPTIONS:
        help_text = f"{meaning} (default %(default)s)"
        parser.add_argument(flag, type=kind, default=default, help=help_text)
    parser.add_argument(
        "--keep-data",
        action="store_true",
        help="leave the cluster's data directory (txlogs, service logs, worker databases) "
        "for inspection; by default it is deleted at the end of a run that did not fail",
    )
    options = parser.parse_args()
    if not 0 < options.small < options.history:
        parser.error("--small must be positive and below --history")
    if options.middle and not options.small < options.middle < options.history:
        parser.error("--middle must lie between --small and --history (or be 0)")
    soak = Soak(options)
    try:
        results = soak.run()
    except BaseException:
        print(f"the cluster's data, left to see what failed: {soak.root}")
        raise
    if options.keep_data:
        print(f"the cluster's data (txlogs, logs, databases): {soak.root}")
    else:
        shutil.rmtree(soak.root, ignore_errors=True)  # 100 MB at 150k, more at 1M
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.with_suffix(".json").write_text(json.dumps(asdict(results), indent=1))
    print(summary(results))
    print(f"curves: {draw(results, options.out)}; samples: {options.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
