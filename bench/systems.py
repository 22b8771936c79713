"""The three systems under the same load: TxSync, etcd and MariaDB Galera, each as 3 (or
more) nodes on loopback with the same link emulator between every pair.

A ``System`` starts its cluster, names the address a client at each node talks to, counts
what it has committed (its own counter: TxSync's synced order length, etcd's revision,
Galera's last committed seqno), and lists its server processes, so that the suite can
read their CPU time and peak memory from /proc.

Every system writes the same transaction: one row, upserted by a key drawn from
``KEYS`` keys, with a 100-byte value.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc

from bench.peers.etcd import EtcdCluster
from bench.peers.galera import GaleraCluster
from tests.support.dev_up import free_base_port
from txsync.client import Client
from txsync.dev_cluster import DevCluster, layout_of
from txsync.link_emulator import LinkEmulator
from txsync.v1 import admin_pb2, admin_pb2_grpc

KEYS = 10_000
VALUE_BYTES = 100
TXSYNC_TABLE = "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)"
TXSYNC_UPSERT = "INSERT INTO t (id, v) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET v = excluded.v"
GALERA_TABLE = "CREATE TABLE bench.t (id BIGINT PRIMARY KEY, v VARCHAR(200) NOT NULL)"
GALERA_UPSERT = "INSERT INTO bench.t (id, v) VALUES (%s, %s) ON DUPLICATE KEY UPDATE v = VALUES(v)"
TXSYNC_SELECT = "SELECT v FROM t WHERE id = ?"
GALERA_SELECT = "SELECT v FROM bench.t WHERE id = %s"


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    """Where a client local to this node connects."""
    role: str = ""
    """etcd: "leader" or "follower"."""


class System(Protocol):
    name: str
    emulator: LinkEmulator
    batch_is_one_commit: bool
    """``committed()`` counts a batched call's writes as one (etcd's revision, Galera's
    last committed transaction), so the suite multiplies by the batch's size; TxSync
    orders each submit of a batch as its own transaction."""

    def start(self) -> list[Node]: ...

    def committed(self) -> int: ...

    def processes(self) -> dict[str, int]:
        """Each server process's pid, by a name whose first word is its kind."""
        ...

    def stop(self) -> None: ...


@dataclass
class TxSyncSystem:
    """``txsync dev up``'s services (``DevCluster``) started in the benchmark's process,
    coordinators behind the link emulator, ``workers`` SQLite workers per DC."""

    one_way_delay_ms: float
    dcs: int = 3
    workers: int = 1
    coordinator_args: tuple[str, ...] = ()
    """Extra flags for every sync-coordinator (tuning experiments)."""
    name: str = "TxSync"
    batch_is_one_commit: bool = False
    emulator: LinkEmulator = field(default_factory=LinkEmulator)
    cluster: DevCluster | None = None
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bench-txsync-")))

    def start(self) -> list[Node]:
        base = free_base_port(self.dcs)
        layout = layout_of(self.root, self.dcs, base, witness=False, workers=self.workers)
        self.cluster = DevCluster(
            layout,
            self.emulator,
            self.one_way_delay_ms,
            extra_args={"sync-coordinator": list(self.coordinator_args)},
        )
        self.cluster.start()
        nodes = [Node(dc, entry["store"]) for dc, entry in layout["dcs"].items()]
        with Client(nodes[0].address, timeout=60) as client:
            client.submit(TXSYNC_TABLE, wait="ok")
        return nodes

    def nodes_addresses(self) -> list[str]:
        assert self.cluster is not None
        return [dc["store"] for dc in self.cluster.layout["dcs"].values()]

    def committed(self) -> int:
        address = self.nodes_addresses()[0]
        with grpc.insecure_channel(address) as channel:
            status = admin_pb2_grpc.AdminServiceStub(channel).GetStatus(
                admin_pb2.GetStatusRequest(), timeout=10
            )
        return int(status.local.merge_base.synced_len)

    def applied(self) -> int:
        """Transactions applied, summed over every worker of every DC."""
        assert self.cluster is not None
        total = 0
        for dc in self.cluster.layout["dcs"].values():
            with grpc.insecure_channel(dc["store"]) as channel:
                workers = admin_pb2_grpc.AdminServiceStub(channel).ListWorkers(
                    admin_pb2.ListWorkersRequest(), timeout=10
                )
            total += sum(worker.position for worker in workers.workers)
        return total

    def processes(self) -> dict[str, int]:
        assert self.cluster is not None
        found = {}
        for service in self.cluster.services:
            assert service.process is not None
            dc, kind = service.name.split(" ", 1)
            found[f"{kind} {dc}"] = service.process.pid
        return found

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        self.emulator.close()
        # A run leaves ~1 GB of logs, bodies and databases; etcd's and Galera's
        # clusters remove theirs too.
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class EtcdSystem:
    one_way_delay_ms: float
    size: int = 3
    name: str = "etcd"
    batch_is_one_commit: bool = True
    emulator: LinkEmulator = field(default_factory=LinkEmulator)
    cluster: EtcdCluster | None = None

    def start(self) -> list[Node]:
        root = Path(tempfile.mkdtemp(prefix="bench-etcd-"))
        self.cluster = EtcdCluster(root, self.size, self.emulator, self.one_way_delay_ms)
        self.cluster.start()
        leader = self.cluster.leader()
        return [
            Node(m.name, m.client_address, "leader" if m.name == leader else "follower")
            for m in self.cluster.members
        ]

    def committed(self) -> int:
        assert self.cluster is not None
        return self.cluster.revision()

    def processes(self) -> dict[str, int]:
        assert self.cluster is not None
        return {f"etcd {name}": pid for name, pid in self.cluster.pids.items()}

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        self.emulator.close()


@dataclass
class GaleraSystem:
    one_way_delay_ms: float
    size: int = 3
    name: str = "Galera"
    batch_is_one_commit: bool = True
    emulator: LinkEmulator = field(default_factory=LinkEmulator)
    cluster: GaleraCluster | None = None

    def start(self) -> list[Node]:
        root = Path(tempfile.mkdtemp(prefix="bench-galera-"))
        self.cluster = GaleraCluster(root, self.size, self.emulator, self.one_way_delay_ms)
        self.cluster.start()
        first = self.cluster.nodes[0]
        self.cluster.execute(first, "CREATE DATABASE bench")
        self.cluster.execute(first, GALERA_TABLE)
        return [Node(n.name, f"127.0.0.1:{n.port}") for n in self.cluster.nodes]

    def committed(self) -> int:
        assert self.cluster is not None
        return self.cluster.status_value(self.cluster.nodes[0], "wsrep_last_committed")

    def certification_failures(self) -> int:
        """Write sets refused by certification, plus local transactions aborted by a
        replicated one (brute-force aborts), over every node."""
        assert self.cluster is not None
        return sum(
            self.cluster.status_value(node, name)
            for node in self.cluster.nodes
            for name in ("wsrep_local_cert_failures", "wsrep_local_bf_aborts")
        )

    def send_windows(self) -> dict[str, str]:
        """The send windows the first node runs with (issue 52: stated on the page)."""
        assert self.cluster is not None
        names = ("evs.send_window", "evs.user_send_window")
        return self.cluster.provider_options(self.cluster.nodes[0], names)

    def processes(self) -> dict[str, int]:
        assert self.cluster is not None
        return {f"mariadbd {name}": pid for name, pid in self.cluster.pids.items()}

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        self.emulator.close()
