"""A local multi-DC cluster of real processes (a transaction-store and a sync-coordinator
per DC, and with ``workers`` a worker-dispatch and one SQLite worker) on loopback,
optionally with emulated WAN links between the coordinators."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from tests.support.processes import (
    ServiceProcess,
    free_port,
    sync_coordinator,
    transaction_store,
    worker,
    worker_dispatch,
)
from tests.support.waiting import wait_until
from txsync.link_emulator import LinkEmulator, LinkSettings
from txsync.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    client_pb2,
    client_pb2_grpc,
    common_pb2,
    store_pb2,
    store_pb2_grpc,
)

CONVERGE_TIMEOUT_S = 60.0


@dataclass
class Dc:
    node_id: str
    store: ServiceProcess
    coordinator: ServiceProcess
    dispatch: ServiceProcess | None = None
    worker: ServiceProcess | None = None

    @property
    def processes(self) -> list[ServiceProcess]:
        """Its processes, in the order they stop (the reverse of their start)."""
        others = [p for p in (self.dispatch, self.worker) if p is not None]
        return [self.coordinator, *others, self.store]


class LocalCluster:
    def __init__(
        self,
        root: Path,
        size: int,
        *,
        one_way_delay_ms: float | None = None,
        coordinator_args: tuple[str, ...] = ("--round-timeout-ms", "300"),
        tls_dir: Path | None = None,
        names: list[str] | None = None,
        store_args: dict[str, tuple[str, ...]] | None = None,
        joining: frozenset[str] = frozenset(),
        metrics: bool = False,
        workers: bool = False,
    ) -> None:
        """``one_way_delay_ms`` None: coordinators talk directly; else through the link
        emulator with that one-way delay on every directed link. ``tls_dir``: mutual TLS
        with the certificates there (scripts/dev_ca.py); None: plaintext. ``names``: node
        ids (default dc1..dcN); ``store_args``: extra flags for some nodes' stores;
        ``joining``: nodes outside the initial configuration (started with --join; the
        others do not list them); ``metrics``: coordinators serve Prometheus metrics on
        ``metrics_ports``; ``workers``: each DC applies, with a worker-dispatch and one
        SQLite worker (the test creates its tables)."""
        self.metrics_ports: dict[str, int] = {}
        ids = names or [f"dc{n + 1}" for n in range(size)]
        assert len(ids) == size
        ports = {node: free_port() for node in ids}
        self.emulator: LinkEmulator | None = None
        dial = {(a, b): ports[b] for a in ids for b in ids if a != b}
        if one_way_delay_ms is not None:
            self.emulator = LinkEmulator()
            for a, b in dial:
                settings = LinkSettings(delay_ms=one_way_delay_ms)
                dial[(a, b)] = self.emulator.add_link(a, b, ports[b], settings)
        self.dcs: list[Dc] = []
        try:
            self._start(
                root,
                ids,
                ports,
                dial,
                coordinator_args=coordinator_args,
                tls_dir=tls_dir,
                store_args=store_args or {},
                joining=joining,
                metrics=metrics,
                workers=workers,
            )
        except BaseException:
            self.stop()  # do not leave half a cluster running
            raise

    def _start(
        self,
        root: Path,
        ids: list[str],
        ports: dict[str, int],
        dial: dict[tuple[str, str], int],
        *,
        coordinator_args: tuple[str, ...],
        tls_dir: Path | None,
        store_args: dict[str, tuple[str, ...]],
        joining: frozenset[str],
        metrics: bool,
        workers: bool,
    ) -> None:
        self.ports = ports
        for node in ids:
            applying: tuple[str, ...] = ()
            dispatch_port = free_port()
            if workers:
                applying = ("--dispatch", f"127.0.0.1:{dispatch_port}")
            store = transaction_store(
                root / node, node, *applying, *store_args.get(node, ()), port=free_port()
            )
            store.start()
            dispatch = applier = None
            if workers:
                applier = worker(root / node / "w1", f"{node}-w1", port=free_port())
                applier.start()
                dispatch = worker_dispatch(
                    root / node / "dispatch", store.address, {f"{node}-w1": applier.address},
                    port=dispatch_port,
                )  # fmt: skip
                dispatch.start()
            peers = {p: dial[(node, p)] for p in ids if p != node and p not in joining}
            security: tuple[str, ...] = ("--plaintext",)
            if tls_dir is not None:
                security = (
                    "--tls-ca", str(tls_dir / "ca.pem"),
                    "--tls-cert", str(tls_dir / f"{node}.pem"),
                    "--tls-key", str(tls_dir / f"{node}.key"),
                )  # fmt: skip
            join: tuple[str, ...] = ("--join",) if node in joining else ()
            if metrics:
                self.metrics_ports[node] = free_port()
                join += ("--metrics-listen", f"127.0.0.1:{self.metrics_ports[node]}")
            coordinator = sync_coordinator(
                root / node, node, store.address, ports[node], peers, *security,
                *coordinator_args, *join,
            )  # fmt: skip
            self.dcs.append(Dc(node, store, coordinator, dispatch, applier))
        for dc in self.dcs:
            dc.coordinator.start()

    def stop(self) -> None:
        """Stop every service; fail (after stopping them all) if one did not exit 0."""
        unclean = []
        for dc in self.dcs:
            for process in dc.processes:
                running = process.process is not None and process.process.poll() is None
                if running and process.terminate() != 0:
                    unclean.append(process.log())
        if self.emulator is not None:
            self.emulator.close()
        assert not unclean, unclean

    def dc(self, node_id: str) -> Dc:
        return next(dc for dc in self.dcs if dc.node_id == node_id)

    def status(self, dc: Dc) -> admin_pb2.DcStatus:
        """The coordinator's own status: its view and quorum state."""
        with grpc.insecure_channel(dc.coordinator.address) as channel:
            stub = admin_pb2_grpc.AdminServiceStub(channel)
            return stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=5).local

    def metric(self, dc: Dc, name: str) -> float:
        """One value from the coordinator's Prometheus endpoint."""
        url = f"http://127.0.0.1:{self.metrics_ports[dc.node_id]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode()
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"no metric {name} at {url}")

    def wait_for(self, what: str, condition: Callable[[], bool], timeout_s: float = 120.0) -> None:
        wait_until(what, condition, timeout_s)

    def synced(self, dc: Dc) -> list[str]:
        with grpc.insecure_channel(dc.store.address) as channel:
            stub = store_pb2_grpc.StoreInternalServiceStub(channel)
            ids: list[str] = []
            while True:
                answer = stub.ReadSynced(
                    store_pb2.ReadSyncedRequest(from_len=len(ids), count_max=1024)
                )
                if not answer.entries:
                    return ids
                ids.extend(m.tx_id for m in answer.entries)

    def wait_converged(self, expected: set[str], dcs: list[Dc] | None = None) -> list[str]:
        """Wait until every DC (or each of ``dcs``) has synced exactly ``expected``,
        checking on the way that the orders never fork; returns the common order."""
        deadline = time.monotonic() + CONVERGE_TIMEOUT_S
        dcs = dcs or self.dcs
        while True:
            orders = [self.synced(dc) for dc in dcs]
            for order in orders:
                shortest = min(len(order), len(orders[0]))
                assert order[:shortest] == orders[0][:shortest], "the DCs' orders forked"
            if all(set(order) == expected for order in orders):
                assert all(order == orders[0] for order in orders), "the DCs' orders differ"
                return orders[0]
            if time.monotonic() > deadline:
                counts = {dc.node_id: len(o) for dc, o in zip(dcs, orders, strict=True)}
                raise AssertionError(f"no convergence on {len(expected)} txs: {counts}")
            time.sleep(0.1)


def submit_row(stub: client_pb2_grpc.ClientServiceStub, dc: Dc, n: int) -> str:
    """Submit the one-row transaction that inserts (dc, n) into ``t``; its id."""
    body = common_pb2.TxBody(
        statements=[
            common_pb2.Statement(
                sql="INSERT INTO t (dc, n) VALUES (?, ?)",
                params=[
                    common_pb2.SqlValue(text_value=dc.node_id),
                    common_pb2.SqlValue(int_value=n),
                ],
            )
        ]
    )
    return str(stub.Submit(client_pb2.SubmitRequest(body=body)).tx_id)


def submit_at(dc: Dc, count: int, acked: list[str], lock: threading.Lock) -> None:
    """Submit ``count`` one-row transactions at ``dc``, one after another, recording
    each acknowledged id in ``acked``."""
    with grpc.insecure_channel(dc.store.address) as channel:
        stub = client_pb2_grpc.ClientServiceStub(channel)
        for n in range(count):
            tx_id = submit_row(stub, dc, n)
            with lock:
                acked.append(tx_id)
