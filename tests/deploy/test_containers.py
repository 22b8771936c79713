"""Three DCs as containers of the image on a Docker network (testcontainers), under the
faults a deployment meets: a DC's master killed and restarted, a DC cut from the network
and reconnected, a coordinator paused, workers scaled up and down.

Each DC is laid out like its Kubernetes pods: a master "pod" (a pause container holding
the network namespace, joined by the store, coordinator and dispatch containers) and one
container per worker. Clients submit at every DC that can be reached. After each fault
the checks of PROTOCOL.md §4 that can be seen from outside hold: the synced orders are
prefixes of one another and, once healed, equal (prefix consistency), no transaction
twice, every acknowledged submit ordered everywhere (no loss), and every worker of every
DC at the end of the order with the same database digest.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import docker
import grpc
import pytest
from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network

from txsync.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    client_pb2,
    client_pb2_grpc,
    common_pb2,
    store_pb2,
    store_pb2_grpc,
)

pytestmark = pytest.mark.docker
DCS = ("dc1", "dc2", "dc3")
IMAGE = "txsync:dev"


def _container(command: list[str], **kwargs: Any) -> DockerContainer:
    container = DockerContainer(IMAGE, **kwargs).with_command(command)
    return container


@dataclass
class ContainerDc:
    node: str
    run: str
    network: Network
    pause: DockerContainer | None = None
    services: list[DockerContainer] = field(default_factory=list)
    workers: dict[str, DockerContainer] = field(default_factory=dict)

    @property
    def host(self) -> str:
        return f"{self.run}-{self.node}"

    def start_master(self) -> None:
        others = [dc for dc in DCS if dc != self.node]
        pause = DockerContainer(IMAGE, entrypoint=["sleep", "infinity"])
        pause.with_network(self.network).with_network_aliases(self.host)
        pause.with_name(f"{self.host}-pause")
        for port in (7001, 7005):  # published on loopback only, on free host ports
            pause.ports[f"{port}/tcp"] = ("127.0.0.1", None)  # type: ignore[assignment]
        pause.start()
        self.pause = pause
        joined = {"network_mode": f"container:{pause.get_wrapped_container().id}"}
        data = "/var/lib/txsync"
        commands = {
            "store": ["transaction-store", "--node-id", self.node, "--data", f"{data}/store",
                      "--listen", "0.0.0.0:7001", "--coordinator", "127.0.0.1:7005",
                      "--dispatch", "127.0.0.1:7004",
                      *[f"--peer-store={dc}={self.run}-{dc}:7001" for dc in others]],
            "coordinator": ["sync-coordinator", "--node-id", self.node, "--plaintext",
                            "--store", "127.0.0.1:7001", "--listen", "0.0.0.0:7002",
                            "--admin-listen", "0.0.0.0:7005",
                            *[f"--peer={dc}={self.run}-{dc}:7002" for dc in others]],
            "dispatch": ["worker-dispatch", "--store", "127.0.0.1:7001", "--dc", self.node,
                         "--listen", "0.0.0.0:7004"],
        }  # fmt: skip
        self.services = []
        for name, command in commands.items():
            service = _container(command, **joined).with_name(f"{self.host}-{name}")
            service.start()
            self.services.append(service)

    def add_worker(self, name: str) -> None:
        host = f"{self.host}-{name}"
        worker = _container(
            ["worker", "--worker-id", name, "--dc", self.node, "--data", "/var/lib/txsync/w",
             "--listen", "0.0.0.0:7011", "--dispatch", f"{self.host}:7004",
             "--advertise", f"{host}:7011"],
        )  # fmt: skip
        worker.with_network(self.network).with_network_aliases(host).with_name(host)
        worker.start()
        self.workers[name] = worker

    def master_containers(self) -> list[Any]:
        return [c.get_wrapped_container() for c in [self.pause, *self.services] if c]

    def address(self, port: int) -> str:
        assert self.pause is not None
        wrapped = self.pause.get_wrapped_container()
        wrapped.reload()
        published = wrapped.ports[f"{port}/tcp"]
        assert published, f"{port} is not published"
        return f"127.0.0.1:{published[0]['HostPort']}"

    def stop(self) -> None:
        for container in [*self.workers.values(), *self.services, self.pause]:
            if container is not None:
                container.get_wrapped_container().remove(force=True)


@pytest.fixture
def cluster(image: str) -> Iterator[dict[str, ContainerDc]]:
    os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"  # Ryuk's image cannot be pulled
    run = f"txs{uuid.uuid4().hex[:6]}"
    with Network() as network:
        dcs = {node: ContainerDc(node, run, network) for node in DCS}
        try:
            for dc in dcs.values():
                dc.start_master()
            for dc in dcs.values():
                for worker in ("w1", "w2"):
                    dc.add_worker(worker)
            yield dcs
        finally:
            for dc in dcs.values():
                dc.stop()


class Clients:
    """Submits at the DCs that answer; remembers every acknowledged transaction."""

    def __init__(self, dcs: dict[str, ContainerDc]) -> None:
        self.dcs = dcs
        self.acked: list[str] = []
        self._n = 0

    def submit(self, nodes: tuple[str, ...], count: int) -> None:
        for node in nodes:
            with grpc.insecure_channel(self.dcs[node].address(7001)) as channel:
                stub = client_pb2_grpc.ClientServiceStub(channel)
                for _ in range(count):
                    self._n += 1
                    statement = common_pb2.Statement(
                        sql="INSERT INTO t (n, dc) VALUES (?, ?)",
                        params=[common_pb2.SqlValue(int_value=self._n),
                                common_pb2.SqlValue(text_value=node)],
                    )  # fmt: skip
                    body = common_pb2.TxBody(statements=[statement])
                    answer = stub.Submit(client_pb2.SubmitRequest(body=body), timeout=10)
                    self.acked.append(answer.tx_id)


def _order(dc: ContainerDc) -> list[str]:
    with grpc.insecure_channel(dc.address(7001)) as channel:
        stub = store_pb2_grpc.StoreInternalServiceStub(channel)
        ids: list[str] = []
        while True:
            page = stub.ReadSynced(
                store_pb2.ReadSyncedRequest(from_len=len(ids), count_max=1024), timeout=10
            )
            if not page.entries:
                return ids
            ids += [meta.tx_id for meta in page.entries]


def _workers(dc: ContainerDc) -> list[admin_pb2.WorkerStatus]:
    with grpc.insecure_channel(dc.address(7001)) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        return list(stub.ListWorkers(admin_pb2.ListWorkersRequest(), timeout=10).workers)


def _wait(what: str, condition: Callable[[], bool], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if condition():
                return
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.5)


def _check_prefixes(dcs: dict[str, ContainerDc], nodes: tuple[str, ...]) -> None:
    """Prefix consistency and no duplicates among the DCs that answer now."""
    orders = [_order(dcs[node]) for node in nodes]
    for order in orders:
        assert len(order) == len(set(order)), "a transaction ordered twice"
    for a in orders:
        for b in orders:
            shorter, longer = sorted((a, b), key=len)
            assert longer[: len(shorter)] == shorter, "two DCs' orders fork"


def _check_converged(dcs: dict[str, ContainerDc], clients: Clients) -> None:
    """Healed: one order everywhere holding every acknowledged submit; every worker at
    its end with the same digest."""

    def same_order() -> bool:
        orders = [_order(dc) for dc in dcs.values()]
        return all(o == orders[0] for o in orders) and set(clients.acked) <= set(orders[0])

    _wait("every DC holds the same order with every acknowledged submit", same_order)
    end = len(_order(dcs["dc1"]))

    def workers_done() -> bool:
        listed = [w for dc in dcs.values() for w in _workers(dc)]
        every_one = len(listed) == sum(len(dc.workers) for dc in dcs.values())
        at_end = all(w.position == end and w.healthy for w in listed)
        return every_one and at_end and len({w.state_digest for w in listed}) == 1

    _wait("every worker at the end of the order with one digest", workers_done)


def test_faults_at_the_container_level(cluster: dict[str, ContainerDc]) -> None:
    dcs = cluster
    clients = Clients(dcs)
    _wait("every DC answers", lambda: all(_order(dc) == [] for dc in dcs.values()))
    with grpc.insecure_channel(dcs["dc1"].address(7001)) as channel:
        stub = client_pb2_grpc.ClientServiceStub(channel)
        create = common_pb2.Statement(sql="CREATE TABLE t (n INTEGER PRIMARY KEY, dc TEXT)")
        created = stub.Submit(
            client_pb2.SubmitRequest(body=common_pb2.TxBody(statements=[create])), timeout=10
        )
        clients.acked.append(created.tx_id)
    clients.submit(DCS, 5)
    _check_converged(dcs, clients)

    # 1. dc3's master is killed (SIGKILL, every container of the pod) and restarted.
    for container in dcs["dc3"].master_containers():
        container.kill()
    clients.submit(("dc1", "dc2"), 5)
    _check_prefixes(dcs, ("dc1", "dc2"))
    for container in dcs["dc3"].master_containers():
        container.start()
    _wait("dc3 answers again", lambda: isinstance(_order(dcs["dc3"]), list))
    clients.submit(DCS, 3)
    _check_converged(dcs, clients)

    # 2. dc2 is cut from the network (docker network disconnect) and reconnected.
    pause = dcs["dc2"].master_containers()[0]
    docker_network = docker.from_env().networks.get(dcs["dc2"].network.name)
    docker_network.disconnect(pause)
    clients.submit(("dc1", "dc3"), 5)
    _check_prefixes(dcs, ("dc1", "dc3"))
    docker_network.connect(pause, aliases=[dcs["dc2"].host])
    clients.submit(DCS, 3)
    _check_converged(dcs, clients)

    # 3. dc1's coordinator is paused (docker pause: frozen, not dead), then resumed.
    coordinator = dcs["dc1"].master_containers()[2]
    coordinator.pause()
    clients.submit(("dc2", "dc3"), 5)
    time.sleep(4)  # past the exclusion timeout: the others go on without dc1
    coordinator.unpause()
    clients.submit(DCS, 3)
    _check_converged(dcs, clients)

    # 4. Workers scaled: a third worker joins dc2 and catches up; one of dc3's leaves.
    dcs["dc2"].add_worker("w3")
    leaving = dcs["dc3"].workers.pop("w2").get_wrapped_container()
    leaving.stop(timeout=20)  # SIGTERM: the worker drains itself
    leaving.remove()  # no longer in dc3's workers: ContainerDc.stop() skips it
    clients.submit(DCS, 3)
    _wait("dc2 has three workers, dc3 one", lambda: (len(_workers(dcs["dc2"])),
          len(_workers(dcs["dc3"]))) == (3, 1))  # fmt: skip
    _check_converged(dcs, clients)
    assert len(clients.acked) == 1 + 15 + 10 + 9 + 10 + 9 + 10 + 9 + 9
