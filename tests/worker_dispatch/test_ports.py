"""worker-dispatch's ports, in one process: its store port (FollowEnqueued and
AdvanceStatesStream) and its worker port (an Apply stream per worker, heartbeats) against a
real store and two real SQLite workers served over gRPC on loopback. The decisions behind
them are pure (test_pipeline.py, test_health.py); these show the adapters carry them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import grpc

from tests.support.in_process import (
    WAIT_S,
    InProcessDc,
    body,
    reached,
    run_dcs,
    submit_inserts,
    until,
)
from txsync.protocol import TxState
from txsync.rpc import add_service, new_server
from txsync.v1 import worker_pb2
from txsync.worker.service import WorkerServicer
from txsync.worker.sqlite_backend import SqliteBackend
from txsync.worker_dispatch.dispatch import Dispatch

WORKER_SERVICE = worker_pb2.DESCRIPTOR.services_by_name["WorkerService"]


class _EarlierWorker(WorkerServicer):
    """A worker of the version before ``ApplyBatches``: it answers UNIMPLEMENTED."""

    ApplyBatches = None  # type: ignore[assignment]


@asynccontextmanager
async def _workers(
    tmp_path: Path, names: list[str], earlier: frozenset[str] = frozenset()
) -> AsyncIterator[dict[str, tuple[WorkerServicer, grpc.aio.Server, str]]]:
    async with AsyncExitStack() as stack:
        workers = {}
        for name in names:
            backend = SqliteBackend(tmp_path / f"{name}.sqlite")
            stack.callback(backend.close)
            kind = _EarlierWorker if name in earlier else WorkerServicer
            servicer = kind(name, backend, tmp_path / f"{name}-scratch")
            server, address = await _serve_worker_port(stack, servicer)
            workers[name] = (servicer, server, address)
        yield workers


async def _serve_worker_port(
    stack: AsyncExitStack, servicer: object
) -> tuple[grpc.aio.Server, str]:
    """Serve ``servicer`` as a worker port on a free loopback port until ``stack``
    closes (methods it lacks answer UNIMPLEMENTED)."""
    server = new_server()
    add_service(server, servicer, WORKER_SERVICE)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stack.push_async_callback(server.stop, 0)
    return server, f"127.0.0.1:{port}"


@asynccontextmanager
async def _dispatch(dc: InProcessDc, addresses: dict[str, str]) -> AsyncIterator[Dispatch]:
    dispatch = Dispatch(dc.store_address, addresses, stuck_after_s=10.0)
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(dispatch.watch_heartbeats()), loop.create_task(dispatch.run())]
    try:
        yield dispatch
    finally:
        for task in tasks:
            task.cancel()
        async with asyncio.timeout(WAIT_S):  # a task that outlives its cancel fails here
            await asyncio.gather(*tasks, return_exceptions=True)
        await dispatch.close()


def _states(dc: InProcessDc, tx_ids: list[str]) -> set[TxState | None]:
    return {record.state if (record := dc.store.state.tx(t)) else None for t in tx_ids}


def test_the_worker_port_carries_the_pipeline_and_survives_a_lost_worker(
    tmp_path: Path,
) -> None:
    async def scenario(dcs: dict[str, InProcessDc]) -> None:
        dc = dcs["dc1"]
        async with _workers(tmp_path, ["w1", "w2"]) as workers:
            addresses = {name: address for name, (_, _, address) in workers.items()}
            async with _dispatch(dc, addresses) as dispatch:
                create = (await dc.store.submit(body("CREATE TABLE t (x INTEGER)"))).tx_id
                inserts = await submit_inserts(dc, range(20))
                await until(reached(dc, [create, *inserts], TxState.OK), "all finished")
                assert _states(dc, [create, *inserts]) == {TxState.OK}
                servicers = [servicer for servicer, _, _ in workers.values()]
                await until(lambda: all(s.applied.position == 21 for s in servicers), "both at 21")
                assert servicers[0].applied.state_digest == servicers[1].applied.state_digest

                # The testing worker's port goes away: the role moves and work goes on.
                tester = dispatch.tester
                assert tester in workers
                await workers[tester][1].stop(0)
                more = await submit_inserts(dc, range(100, 105))
                await until(reached(dc, more, TxState.OK), "the next five finished")
                assert _states(dc, more) == {TxState.OK}
                assert dispatch.tester not in (None, tester)
                assert dispatch.workers[tester].healthy is False

    run_dcs(tmp_path, ["dc1"], scenario)


def test_a_worker_of_the_earlier_version_is_fed_one_transaction_per_message(
    tmp_path: Path,
) -> None:
    """Dispatch streams batches (``ApplyBatches``); a worker that answers UNIMPLEMENTED
    (upgraded after the DC's dispatch) is fed by ``Apply`` instead, and both agree."""

    async def scenario(dcs: dict[str, InProcessDc]) -> None:
        dc = dcs["dc1"]
        async with _workers(tmp_path, ["w1", "w2"], earlier=frozenset({"w2"})) as workers:
            addresses = {name: address for name, (_, _, address) in workers.items()}
            async with _dispatch(dc, addresses) as dispatch:
                create = (await dc.store.submit(body("CREATE TABLE t (x INTEGER)"))).tx_id
                inserts = await submit_inserts(dc, range(30))
                await until(reached(dc, [create, *inserts], TxState.OK), "all finished")
                servicers = [servicer for servicer, _, _ in workers.values()]
                await until(lambda: all(s.applied.position == 31 for s in servicers), "both at 31")
                assert servicers[0].applied.state_digest == servicers[1].applied.state_digest
                assert dispatch.workers["w1"].batched and not dispatch.workers["w2"].batched

    run_dcs(tmp_path, ["dc1"], scenario)


class _Heartbeats:
    """A worker port that serves only heartbeats: it answers them, or holds every one
    (``held``) until the server stops: a worker stuck, or stopping, while the dispatch
    asks."""

    def __init__(self, *, held: bool) -> None:
        self.held = held
        self.asked = 0

    async def Heartbeat(  # noqa: N802 - the gRPC method's name
        self, request: worker_pb2.HeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.HeartbeatResponse:
        self.asked += 1
        if self.held:
            await asyncio.Event().wait()
        return worker_pb2.HeartbeatResponse(position=0)


def test_a_worker_drained_during_its_heartbeat_stops_no_other_heartbeat() -> None:
    """Draining closes the worker's channel, which ends a heartbeat still out with
    CancelledError; that once ended every worker's heartbeats, and the dispatch with them
    (a worker scaled down, or registering again at a new address, mid-heartbeat)."""

    async def main() -> None:
        ports = {"held": _Heartbeats(held=True), "live": _Heartbeats(held=False)}
        async with AsyncExitStack() as stack:
            addresses = {
                name: (await _serve_worker_port(stack, servicer))[1]
                for name, servicer in ports.items()
            }
            # No store: heartbeats need none (its channel connects only when used).
            dispatch = Dispatch("127.0.0.1:1", addresses)
            stack.push_async_callback(dispatch.close)
            beats = asyncio.get_running_loop().create_task(dispatch.watch_heartbeats())
            try:
                await until(lambda: ports["held"].asked > 0, "a heartbeat held by the worker")
                assert await dispatch.drain("held")
                asked = ports["live"].asked
                await until(lambda: ports["live"].asked >= asked + 2 or beats.done(), "beats")
                assert not beats.done(), beats.exception()
            finally:
                beats.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beats

    asyncio.run(main())
