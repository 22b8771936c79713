"""The coordinator's ports, in one process: its store port (``PersistSteps`` and the
local-submit watch) against a real transaction-store served over gRPC on loopback, and
its peer port (``PeerLink`` and ``PeerServicer``) between two such DCs. The shell behind
them is pure (test_shell.py); these show the adapters carry its writes, answers and
sends, and that a store that goes away ends the coordinator's incarnation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from txsync.protocol import TxState
from txsync.rpc import add_service, new_server
from txsync.sync_coordinator.coordinator import Coordinator, CoordinatorConfig
from txsync.sync_coordinator.peer_service import PeerServicer
from txsync.sync_coordinator.server import PEER_SERVICE
from txsync.transaction_store.service import StoreInternalServicer
from txsync.transaction_store.store import StoreConfig, TransactionStore
from txsync.v1 import common_pb2, store_pb2

STORE_SERVICE = store_pb2.DESCRIPTOR.services_by_name["StoreInternalService"]
WAIT_S = 60.0
"""Generous: the condition is polled, never slept for."""


@dataclass
class _Dc:
    store: TransactionStore
    store_server: grpc.aio.Server
    coordinator: Coordinator


def _body(n: int) -> common_pb2.TxBody:
    return common_pb2.TxBody(statements=[common_pb2.Statement(sql=f"INSERT INTO t VALUES ({n})")])


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"not within {WAIT_S} s: {what}"
        await asyncio.sleep(0.01)


async def _serve_store(store: TransactionStore) -> tuple[grpc.aio.Server, str]:
    server = new_server()
    add_service(server, StoreInternalServicer(store), STORE_SERVICE)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@asynccontextmanager
async def _dcs(tmp_path: Path, names: list[str]) -> AsyncIterator[dict[str, _Dc]]:
    """One in-process DC per name (store + coordinator), peers of one another."""
    async with AsyncExitStack() as stack:
        peer_servers: dict[str, tuple[grpc.aio.Server, str]] = {}
        for name in names:  # peer ports first: every coordinator needs their addresses
            server = new_server()
            port = server.add_insecure_port("127.0.0.1:0")
            peer_servers[name] = (server, f"127.0.0.1:{port}")
        dcs: dict[str, _Dc] = {}
        for name in names:
            config = StoreConfig(data_dir=tmp_path / name, node_id=name)
            store = await TransactionStore.open(config)
            stack.push_async_callback(store.close)
            store_server, store_address = await _serve_store(store)
            stack.push_async_callback(store_server.stop, 0)
            peers = {other: peer_servers[other][1] for other in names if other != name}
            coordinator = Coordinator(
                CoordinatorConfig(node_id=name, peers=peers, store_address=store_address)
            )
            peer_server = peer_servers[name][0]
            add_service(peer_server, PeerServicer(coordinator), PEER_SERVICE)
            await peer_server.start()
            stack.push_async_callback(peer_server.stop, 0)
            await coordinator.start()
            stack.push_async_callback(coordinator.stop)
            dcs[name] = _Dc(store, store_server, coordinator)
        yield dcs


Scenario = Callable[[dict[str, _Dc]], Awaitable[None]]


def _run(tmp_path: Path, names: list[str], scenario: Scenario) -> None:
    async def main() -> None:
        async with _dcs(tmp_path, names) as dcs:
            await scenario(dcs)

    asyncio.run(main())


def _enqueued(dc: _Dc, tx_ids: list[str]) -> Callable[[], bool]:
    def all_there() -> bool:
        records = [dc.store.state.tx(tx_id) for tx_id in tx_ids]
        return all(r is not None and r.state is TxState.ENQUEUED for r in records)

    return all_there


def test_the_store_port_carries_writes_and_their_answers(tmp_path: Path) -> None:
    async def scenario(dcs: dict[str, _Dc]) -> None:
        dc = dcs["dc1"]  # a cluster of one: it orders alone
        submitted = [(await dc.store.submit(_body(n))).tx_id for n in range(20)]
        await _until(_enqueued(dc, submitted), "every submit ENQUEUED")
        shell = dc.coordinator.shell
        assert shell is not None
        await _until(lambda: not shell.writes_in_flight, "every write answered")
        assert dc.store.state.merge_base.synced_len == 20
        assert shell.pending_synced() == []
        assert not dc.coordinator.failed.done()

    _run(tmp_path, ["dc1"], scenario)


def test_a_store_that_goes_away_ends_the_incarnation(tmp_path: Path) -> None:
    """Memory may have run ahead of the disk: the coordinator must stop (and be restarted
    from durable state), not linger holding sends."""

    async def scenario(dcs: dict[str, _Dc]) -> None:
        dc = dcs["dc1"]
        await dc.store_server.stop(0)
        reason = await asyncio.wait_for(dc.coordinator.failed, WAIT_S)
        assert "ended" in reason, reason

    _run(tmp_path, ["dc1"], scenario)


def test_the_peer_port_carries_posts_and_bodies(tmp_path: Path) -> None:
    async def scenario(dcs: dict[str, _Dc]) -> None:
        first = [(await dcs["dc1"].store.submit(_body(n))).tx_id for n in range(10)]
        second = [(await dcs["dc2"].store.submit(_body(100 + n))).tx_id for n in range(10)]
        for name, dc in dcs.items():
            await _until(_enqueued(dc, [*first, *second]), f"every submit ENQUEUED at {name}")
        orders = [dc.store.read_synced(0, 100)[1] for dc in dcs.values()]
        assert orders[0] == orders[1] and len(orders[0]) == 20
        for dc in dcs.values():  # every body arrived, pushed or fetched through the peer port
            for tx_id in [*first, *second]:
                assert await dc.store.read_body(tx_id) is not None, tx_id
        assert all(link.sent > 0 for dc in dcs.values() for link in dc.coordinator.links.values())
        # What admin reads: a copy, naming the peer and how far its last post was.
        snapshot = dcs["dc1"].coordinator.snapshot()
        assert snapshot is not None and [p.node_id for p in snapshot.peers] == ["dc2"]
        last_post = snapshot.peers[0].last_post
        assert last_post is not None and last_post[1].synced_len <= 20
        assert snapshot.merge_base.synced_len == 20 and snapshot.lag == 0

    _run(tmp_path, ["dc1", "dc2"], scenario)
