"""DCs in one process for the ports' tests: each a real transaction-store served over
gRPC on loopback and a real sync-coordinator, peers of one another (no subprocesses, so
a test sees the objects behind the ports)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
class InProcessDc:
    store: TransactionStore
    store_server: grpc.aio.Server
    store_address: str
    coordinator: Coordinator
    peer_server: grpc.aio.Server
    peer_address: str


def body(sql: str) -> common_pb2.TxBody:
    return common_pb2.TxBody(statements=[common_pb2.Statement(sql=sql)])


async def submit_inserts(dc: InProcessDc, values: range) -> list[str]:
    """One ``INSERT INTO t VALUES (v)`` submitted at ``dc`` per value; their tx ids."""
    return [(await dc.store.submit(body(f"INSERT INTO t VALUES ({v})"))).tx_id for v in values]


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"not within {WAIT_S} s: {what}"
        await asyncio.sleep(0.01)


async def serve_store(
    store: TransactionStore, address: str = "127.0.0.1:0"
) -> tuple[grpc.aio.Server, str]:
    """Serve the store's internal API at ``address`` (a free port by default; an
    address served before, for a store process that comes back)."""
    server = new_server()
    add_service(server, StoreInternalServicer(store), STORE_SERVICE)
    port = server.add_insecure_port(address)
    assert port > 0, f"cannot serve at {address}"
    await server.start()
    return server, f"127.0.0.1:{port}"


@asynccontextmanager
async def in_process_dcs(
    tmp_path: Path, names: list[str], store_options: Mapping[str, Mapping[str, Any]] | None = None
) -> AsyncIterator[dict[str, InProcessDc]]:
    """One in-process DC per name (store + coordinator), peers of one another;
    ``store_options``: more ``StoreConfig`` fields for a DC's store, by name."""
    async with AsyncExitStack() as stack:
        peer_servers: dict[str, tuple[grpc.aio.Server, str]] = {}
        for name in names:  # peer ports first: every coordinator needs their addresses
            server = new_server()
            port = server.add_insecure_port("127.0.0.1:0")
            peer_servers[name] = (server, f"127.0.0.1:{port}")
        dcs: dict[str, InProcessDc] = {}
        for name in names:
            options = (store_options or {}).get(name, {})
            config = StoreConfig(data_dir=tmp_path / name, node_id=name, **options)
            store = await TransactionStore.open(config)
            stack.push_async_callback(store.close)
            store_server, store_address = await serve_store(store)
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
            dcs[name] = InProcessDc(
                store, store_server, store_address, coordinator, peer_server, peer_servers[name][1]
            )
        yield dcs


Scenario = Callable[[dict[str, InProcessDc]], Awaitable[None]]


def run_dcs(
    tmp_path: Path,
    names: list[str],
    scenario: Scenario,
    store_options: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    async def main() -> None:
        async with in_process_dcs(tmp_path, names, store_options) as dcs:
            await scenario(dcs)

    asyncio.run(main())


def reached(
    dc: InProcessDc, tx_ids: list[str], least: TxState = TxState.ENQUEUED
) -> Callable[[], bool]:
    """A condition: every one of ``tx_ids`` is ``least`` or later at ``dc``'s store."""

    def all_there() -> bool:
        records = [dc.store.state.tx(tx_id) for tx_id in tx_ids]
        return all(r is not None and r.state is not None and r.state >= least for r in records)

    return all_there
