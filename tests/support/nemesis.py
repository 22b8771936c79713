"""A fault-injection run of our own over real processes (Jepsen's word: the nemesis).

A ``dev up`` cluster (``DevCluster``: 3 DCs x 2 SQLite workers, coordinators behind the
link emulator) runs in this process under its own supervisor, which restarts whatever
dies, as ``dev up`` does. A client per DC inserts one row per transaction, each with an
idempotency key, retrying the same key at its DC until the submit is acknowledged. A
schedule drawn from a seed meanwhile:

- ``kill``: SIGKILLs one service (store, coordinator, dispatch or worker);
- ``pause``: SIGSTOPs one service for a few seconds, then SIGCONTs it;
- ``cut``: cuts one DC's coordinator off from the others for a few seconds;
- ``crash``: SIGKILLs every service at once (the whole cluster), once, mid-run.

The stores truncate as in production, only sooner (``TRUNCATING``: a few hundred
positions kept and small log files), so the faults land in truncations and rotations
too (issue 47). What a store truncated cannot be read back at the end: ``_OrderWatch``
reads every DC's synced order as it grows, and the rows of the workers show what ran.

Then everything heals and the run waits (generously) for the cluster to settle, and
checks: the synced order is the same at every DC; every acknowledged transaction is in
it exactly once, OK at every DC that still holds it, and its row is on every worker
exactly once; no key's row was inserted twice on any worker; every worker is healthy at
one position with one state digest; every store truncated and rotated.

``TXSYNC_NEMESIS_S`` sets how long faults are injected (CI: 60; ``make nemesis``: 600),
``TXSYNC_NEMESIS_SEED`` the schedule; a failure names the seed.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import text_format

from tests.support.dev_up import free_base_port, list_workers
from txsync.dev_cluster import DevCluster, Service, layout_of
from txsync.link_emulator import LinkEmulator
from txsync.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    client_pb2,
    client_pb2_grpc,
    common_pb2,
    store_pb2,
    store_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)

FAULT_KINDS = ("kill", "pause", "cut")
FAULT_EVERY_S = (2.0, 5.0)
"""Time between two faults, drawn uniformly."""
OUTAGE_S = (1.0, 5.0)
"""How long a pause or a cut lasts, drawn uniformly."""
SETTLE_TIMEOUT_S = 600.0
"""After the last fault: long, since a loaded machine restarts 15 processes slowly."""
HISTORY_KEPT = 1_000
"""Positions a store keeps past what every peer and worker passed: about 20 s of the
clients' load, many more than an ``_OrderWatch`` falls behind between two reads (a
first CI run with 300 failed its check, on data every worker held the same)."""
TRUNCATING = [
    "--history-kept", str(HISTORY_KEPT),
    "--history-kept-ms", "0",
    "--log-file-bytes-max", str(256 * 1024),
]  # fmt: skip
"""Store flags: truncation after a few hundred positions, and a rotation about every 700
transactions (the defaults keep 2,000 positions and 10 s, and rotate at 16 MiB, which a
run of a minute does not reach)."""
WATCH_EVERY_S = 0.3
WATCH_CALL_TIMEOUT_S = 2.0
QUERY_ROWS_MAX = 10_000
"""The most rows one worker Query returns."""
CLIENT_PAUSE_S = 0.02
"""Between one client's submits: a steady load that leaves the faults room to act."""
SUBMIT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str
    target: str
    """A service's name (kill, pause), a DC (cut), or "" (crash)."""
    lasts_s: float = 0.0


def schedule(seed: int, duration_s: float, services: list[str], dcs: list[str]) -> list[Fault]:
    """The faults of one run, in time order: deterministic for a seed."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    kinds: list[str] = []
    at = rng.uniform(*FAULT_EVERY_S)
    while at < duration_s:
        if not kinds:  # every kind once in each run of len(FAULT_KINDS) faults
            kinds = rng.sample(FAULT_KINDS, len(FAULT_KINDS))
        kind = kinds.pop()
        target = rng.choice(dcs) if kind == "cut" else rng.choice(services)
        faults.append(Fault(at, kind, target, rng.uniform(*OUTAGE_S) if kind != "kill" else 0))
        at += rng.uniform(*FAULT_EVERY_S)
    faults.append(Fault(duration_s / 2, "crash", ""))
    return sorted(faults, key=lambda fault: fault.at_s)


@dataclass
class Report:
    seed: int
    faults: Counter[str] = field(default_factory=Counter)
    acknowledged: int = 0
    ordered: int = 0
    lost: int = 0
    duplicated: int = 0
    restarts: int = 0
    truncated: int = 0
    """Positions the store that truncated least had dropped when the check passed."""
    rotations: int = 0
    settled_after_s: float = 0.0
    problems: list[str] = field(default_factory=list)
    evidence: str = ""
    """When the run did not settle: each DC's workers as dispatch sees them and the log
    tails of the DCs named in ``problems`` (a CI machine's files are gone afterwards)."""

    def summary(self) -> str:
        faults = ", ".join(f"{kind} {n}" for kind, n in sorted(self.faults.items()))
        return (
            f"seed {self.seed}: {self.acknowledged} acknowledged, {self.ordered} ordered; "
            f"faults: {faults}; service restarts {self.restarts}; lost {self.lost}, "
            f"duplicated {self.duplicated}; truncated {self.truncated} at every DC, "
            f"{self.rotations} rotations; settled {self.settled_after_s:.0f} s after the "
            "last fault"
        )


class _Client(threading.Thread):
    """Inserts rows at one DC; each key retried at that DC until acknowledged."""

    def __init__(self, dc: str, address: str, stop: threading.Event) -> None:
        super().__init__(name=f"client-{dc}", daemon=True)
        self.dc, self.address, self.stop = dc, address, stop
        self.acknowledged: dict[str, str] = {}
        """key -> tx id."""

    def run(self) -> None:
        with grpc.insecure_channel(self.address) as channel:
            stub = client_pb2_grpc.ClientServiceStub(channel)
            n = 0
            while not self.stop.is_set():
                key = f"{self.dc}-{n}"
                body = common_pb2.TxBody(
                    statements=[
                        common_pb2.Statement(
                            sql="INSERT INTO t (k) VALUES (?)",
                            params=[common_pb2.SqlValue(text_value=key)],
                        )
                    ]
                )
                request = client_pb2.SubmitRequest(body=body, idempotency_key=key)
                try:
                    answer = stub.Submit(request, timeout=SUBMIT_TIMEOUT_S)
                except grpc.RpcError:
                    self.stop.wait(0.2)  # the DC is down or busy: the same key again
                    continue
                self.acknowledged[key] = answer.tx_id
                n += 1
                self.stop.wait(CLIENT_PAUSE_S)


class _OrderWatch(threading.Thread):
    """Reads one DC's synced order as it grows, before truncation drops it (a store keeps
    ``HISTORY_KEPT`` positions past what every peer and worker passed). One thread per
    DC, each call short: a paused or restarting store holds up only its own watch."""

    def __init__(self, dc: str, address: str, stop: threading.Event) -> None:
        super().__init__(name=f"order-watch-{dc}", daemon=True)
        self.dc, self.address, self.stop = dc, address, stop
        self.order: dict[int, str] = {}
        """Position -> transaction id, as read."""
        self.next_from = 0
        self.missed: list[tuple[int, int]] = []
        """Positions truncated before this watch read them (from, to): the order there
        is checked at the other DCs and by the workers' digests and rows only."""
        self._lock = threading.Lock()

    def run(self) -> None:
        with grpc.insecure_channel(self.address) as channel:
            stub = store_pb2_grpc.StoreInternalServiceStub(channel)
            while not self.stop.wait(WATCH_EVERY_S):
                self.read(stub)

    def read_now(self) -> None:
        with grpc.insecure_channel(self.address) as channel:
            self.read(store_pb2_grpc.StoreInternalServiceStub(channel))

    def read(self, stub: store_pb2_grpc.StoreInternalServiceStub) -> None:
        with self._lock:
            while True:
                request = store_pb2.ReadSyncedRequest(from_len=self.next_from, count_max=1024)
                try:
                    page = stub.ReadSynced(request, timeout=WATCH_CALL_TIMEOUT_S)
                except grpc.RpcError as error:
                    truncated = error.code() == grpc.StatusCode.FAILED_PRECONDITION
                    if truncated and self._skip_truncated():
                        continue
                    return  # down, restarting, or (OUT_OF_RANGE) replaying: read it later
                if not page.entries:
                    return
                for meta in page.entries:
                    self.next_from += 1
                    self.order[self.next_from] = meta.tx_id

    def _skip_truncated(self) -> bool:
        """Go on where the store's history starts now (true if that is further on)."""
        try:
            history_from = _status(self.address).retention.history_from
        except grpc.RpcError:
            return False
        if history_from - 1 <= self.next_from:
            return False
        self.missed.append((self.next_from + 1, history_from - 1))
        self.next_from = history_from - 1
        return True


class NemesisRun:
    def __init__(self, seed: int, duration_s: float, root: Path | None = None) -> None:
        self.seed, self.duration_s = seed, duration_s
        self.root = root or Path(tempfile.mkdtemp(prefix="nemesis-"))
        self.layout: dict[str, Any] = layout_of(
            self.root, 3, free_base_port(3), witness=False, workers=2
        )
        self.emulator = LinkEmulator(seed)
        self.cluster = DevCluster(
            self.layout, self.emulator, extra_args={"transaction-store": TRUNCATING}
        )
        watching = threading.Event()
        self.watches = {
            dc: _OrderWatch(dc, self.layout["dcs"][dc]["store"], watching)
            for dc in self.layout["dcs"]
        }
        self.report = Report(seed)
        self.log_lines: list[str] = []
        self.clients: list[_Client] = []

    def _log(self, text: str) -> None:
        self.log_lines.append(f"{time.monotonic():.1f} {text}")

    @property
    def dcs(self) -> list[str]:
        return list(self.layout["dcs"])

    def run(self) -> Report:
        try:
            self.cluster.start(progress=self._log)
            self._create_table()
            for watch in self.watches.values():
                watch.start()
            stop = threading.Event()
            self.clients = [_Client(dc, self.layout["dcs"][dc]["store"], stop) for dc in self.dcs]
            for client in self.clients:
                client.start()
            try:
                self.act()
            finally:
                stop.set()
                for client in self.clients:
                    client.join(timeout=SUBMIT_TIMEOUT_S * 3)
            acknowledged = {k: t for c in self.clients for k, t in c.acknowledged.items()}
            self.report.acknowledged = len(acknowledged)
            self._settle_and_check(acknowledged)
        finally:
            for watch in self.watches.values():
                watch.stop.set()
            self.cluster.stop()
            self.emulator.close()
        self.report.rotations = sum(
            _rotations(Path(entry["data"])) for entry in self.layout["dcs"].values()
        )
        return self.report

    def _supervise(self) -> None:
        for event in self.cluster.supervise():
            self._log(event)
            self.report.restarts += ": restart " in event

    def _create_table(self) -> None:
        first = self.layout["dcs"][self.dcs[0]]["store"]
        with grpc.insecure_channel(first) as channel:
            stub = client_pb2_grpc.ClientServiceStub(channel)
            body = common_pb2.TxBody(statements=[common_pb2.Statement(sql="CREATE TABLE t (k)")])
            answer = stub.Submit(
                client_pb2.SubmitRequest(body=body, wait_for=common_pb2.TX_STATE_OK), timeout=120
            )
            assert answer.state == common_pb2.TX_STATE_OK, answer

    def act(self) -> None:
        """What happens while the clients insert: the seed's faults. A run of another
        kind overrides it (tests/upgrade: DCs switched between releases)."""
        services = {s.name: s for s in self.cluster.services}
        faults = schedule(self.seed, self.duration_s, sorted(services), self.dcs)
        undo: list[tuple[float, str, Any]] = []  # (when, what, argument)
        started = time.monotonic()
        while True:
            now = time.monotonic() - started
            self._supervise()
            while faults and faults[0].at_s <= now:
                fault = faults.pop(0)
                self.report.faults[fault.kind] += 1
                self._log(f"fault: {fault.kind} {fault.target} {fault.lasts_s:.1f} s")
                if fault.kind == "kill":
                    _signal(services[fault.target], signal.SIGKILL)
                elif fault.kind == "crash":
                    for service in services.values():
                        _signal(service, signal.SIGKILL)
                elif fault.kind == "pause":
                    process = services[fault.target].process
                    if process is not None and process.poll() is None:
                        process.send_signal(signal.SIGSTOP)
                        undo.append((now + fault.lasts_s, "cont", process))
                else:  # cut
                    others = set(self.dcs) - {fault.target}
                    self.emulator.partition({fault.target}, others)
                    undo.append((now + fault.lasts_s, "heal", None))
            for entry in [u for u in undo if u[0] <= now]:
                undo.remove(entry)
                _undo(entry, self.emulator)
            if not faults and not undo and now >= self.duration_s:
                return
            time.sleep(0.05)

    def _settle_and_check(self, acknowledged: dict[str, str]) -> None:
        self.emulator.heal()
        started = time.monotonic()
        deadline = started + SETTLE_TIMEOUT_S
        problems = ["not checked yet"]
        while time.monotonic() < deadline:
            self._supervise()
            try:
                problems = self._check(acknowledged)
            except grpc.RpcError as error:
                problems = [f"not answering: {error.code().name} {error.details()}"]
            if not problems:
                break
            time.sleep(1.0)
        self.report.settled_after_s = time.monotonic() - started
        self.report.problems = problems
        if problems:
            self.report.evidence = self._evidence(problems)

    def _evidence(self, problems: list[str]) -> str:
        lines: list[str] = []
        for dc in self.dcs:
            try:
                workers = list_workers(self.layout["dcs"][dc]["store"])
            except grpc.RpcError as error:
                lines.append(f"{dc}: workers not listed: {error.code().name}")
                continue
            for w in workers:
                lines.append(
                    f"{dc} {w.worker_id}: position {w.position}, healthy {w.healthy}, "
                    f"testing {w.testing}, out of sync {w.out_of_sync}, "
                    f"digest {w.state_digest.hex()[:12]}"
                )
        named = [dc for dc in self.dcs if any(dc in problem for problem in problems)]
        for dc in named:
            address = self.layout["dcs"][dc]["store"]
            try:
                status = text_format.MessageToString(_status(address), as_one_line=True)
                lines.append(f"{dc} status: {status}")
                with grpc.insecure_channel(address) as channel:
                    stub = client_pb2_grpc.ClientServiceStub(channel)
                    for problem in problems:
                        tx_id, _, where = problem.partition(" is TX_STATE_")
                        if where.endswith(f" at {dc}"):
                            got = stub.Get(client_pb2.GetRequest(tx_id=tx_id), timeout=30)
                            got.ClearField("body")
                            got_text = text_format.MessageToString(got, as_one_line=True)
                            lines.append(f"{dc} {tx_id}: {got_text}")
            except grpc.RpcError as error:
                lines.append(f"{dc}: status not read: {error.code().name}")
        for service in self.cluster.services:
            if any(service.log_path.parent.name == dc for dc in named):
                try:
                    tail = service.log_path.read_text(errors="replace").splitlines()[-40:]
                except OSError as error:
                    tail = [f"not read: {error}"]
                lines += [f"{service.name} ({service.log_path}):", *(f"  | {t}" for t in tail)]
        return "\n".join(lines)

    def _check(self, acknowledged: dict[str, str]) -> list[str]:
        stores = {dc: self.layout["dcs"][dc]["store"] for dc in self.dcs}
        problems: list[str] = []
        merged: dict[int, str] = {}
        for dc, watch in self.watches.items():
            watch.read_now()
            for at, tx_id in watch.order.items():
                if merged.setdefault(at, tx_id) != tx_id:
                    problems.append(f"{dc}'s order differs at position {at}")
                    break
        ends = {dc: _status(address).merge_base.synced_len for dc, address in stores.items()}
        end = ends[self.dcs[0]]
        if set(ends.values()) != {end}:
            problems.append(f"the DCs' synced orders end apart: {ends}")
        unseen = [at for at in range(1, end + 1) if at not in merged]
        if unseen:  # truncated at every DC before a watch read it: a watch starved
            problems.append(f"{len(unseen)} positions read at no DC, from {unseen[0]}")
        counts = Counter(merged.values())
        self.report.ordered = end
        self.report.lost = sum(1 for t in acknowledged.values() if counts[t] == 0)
        twice = sum(1 for n in counts.values() if n > 1)
        if self.report.lost:
            problems.append(f"{self.report.lost} acknowledged transactions not ordered")
        position = {tx_id: at for at, tx_id in merged.items()}
        truncated: list[int] = []
        for dc, address in stores.items():
            history_from = _status(address).retention.history_from
            truncated.append(history_from - 1)
            with grpc.insecure_channel(address) as channel:
                stub = client_pb2_grpc.ClientServiceStub(channel)
                for tx_id in acknowledged.values():
                    if position.get(tx_id, 0) < history_from:
                        continue  # truncated: its row shows whether it ran (below)
                    state = stub.Get(client_pb2.GetRequest(tx_id=tx_id), timeout=30).state
                    if state != common_pb2.TX_STATE_OK:
                        problems.append(f"{tx_id} is {common_pb2.TxState.Name(state)} at {dc}")
                        break
            workers = list_workers(address)
            if not all(w.healthy and not w.out_of_sync for w in workers):
                problems.append(f"{dc}: a worker unhealthy or out of sync")
            if {(w.position, w.state_digest) for w in workers} != {(end, workers[0].state_digest)}:
                problems.append(f"{dc}: workers not all at {end} with one digest")
        self.report.truncated = min(truncated)
        if problems:
            return problems
        digests = {w.state_digest for a in stores.values() for w in list_workers(a)}
        if len(digests) != 1:
            problems.append("workers of different DCs hold different digests")
        for dc in self.dcs:
            for worker_id, address in self.layout["dcs"][dc]["workers"].items():
                rows = _rows_per_key(address)
                most = max(rows.values(), default=0)
                twice += most > 1
                if most > 1:
                    problems.append(f"{worker_id}: a key inserted {most} times")
                missing = [key for key in acknowledged if key not in rows]
                if missing:
                    problems.append(f"{worker_id}: no row for {len(missing)} acknowledged keys")
        self.report.duplicated = twice
        return problems


def _rows_per_key(worker_address: str) -> dict[str, int]:
    """How many rows each key has at one worker (a key's transaction ran once: one),
    read in pages of ``QUERY_ROWS_MAX`` keys."""
    rows: dict[str, int] = {}
    with grpc.insecure_channel(worker_address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        while True:
            after = max(rows, default="")
            sql = "SELECT k, count(*) FROM t WHERE k > ? GROUP BY k ORDER BY k LIMIT ?"
            params = [
                common_pb2.SqlValue(text_value=after),
                common_pb2.SqlValue(int_value=QUERY_ROWS_MAX),
            ]
            request = worker_pb2.WorkerServiceQueryRequest(
                statement=common_pb2.Statement(sql=sql, params=params), max_rows=QUERY_ROWS_MAX
            )
            page = stub.Query(request, timeout=30).rows
            rows.update((row.values[0].text_value, row.values[1].int_value) for row in page)
            if len(page) < QUERY_ROWS_MAX:
                return rows


def _rotations(data: Path) -> int:
    log = data / "transaction-store.log"
    return log.read_text(errors="replace").count(" txlog rotated in ") if log.exists() else 0


def _status(address: str) -> admin_pb2.DcStatus:
    with grpc.insecure_channel(address) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        return stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=30).local


def _signal(service: Service, signum: signal.Signals) -> None:
    process = service.process
    if process is not None and process.poll() is None:
        process.send_signal(signum)  # SIGKILL ends a paused process too


def _undo(entry: tuple[float, str, Any], emulator: LinkEmulator) -> None:
    _, what, argument = entry
    if what == "cont":
        process: subprocess.Popen[bytes] = argument
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
    else:
        emulator.heal()


def settings_from_environment() -> tuple[int, float]:
    seed = int(os.environ.get("TXSYNC_NEMESIS_SEED", "16"))
    duration_s = float(os.environ.get("TXSYNC_NEMESIS_S", "60"))
    return seed, duration_s
