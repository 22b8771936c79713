"""The dispatch's state records against a real transaction store served over gRPC: a
TESTING and its outcome go in one batch with TESTING's own time, a long test is reported
TESTING on its own, a refusal for good drops the batch and asks the pipeline to re-read
the store, a store that goes away and comes back gets the batch on a new stream, and the
sender stops when cancelled, even as a record arrives."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from tests.support.in_process import WAIT_S, serve_store, until
from txsync.protocol import TxMeta, TxState
from txsync.rpc import new_channel
from txsync.telemetry import work
from txsync.transaction_store.step_rules import ProtocolStep, StateChangeRequest
from txsync.transaction_store.store import (
    StoreConfig,
    TransactionStore,
)
from txsync.v1 import common_pb2, store_pb2_grpc
from txsync.worker_dispatch.state_records import StateRecords

BATCHES = "AdvanceStatesStream"
"""Messages the store received on the stream: one per batch."""


@dataclass
class Harness:
    store: TransactionStore
    records: StateRecords
    dropped: list[None]
    server: grpc.aio.Server
    address: str
    sender: asyncio.Task[None]

    async def restart_server(self, while_down: Callable[[], Awaitable[None]]) -> None:
        """Stop serving the store, run ``while_down``, then serve it again at the same
        address (as a restarted store process would be)."""
        await self.server.stop(None)
        await while_down()
        self.server, _ = await serve_store(self.store, self.address)

    def state(self, tx_id: str) -> TxState | None:
        return self.store.get(tx_id).state

    async def enqueued(self, ts: int) -> str:
        """A transaction submitted here and synced: ENQUEUED, ready for the dispatch."""
        body = common_pb2.TxBody(statements=[common_pb2.Statement(sql=f"SELECT {ts}")])
        tx_id = (await self.store.submit(body)).tx_id
        meta = TxMeta(ts, tx_id, "dc1")
        await self.store.persist_step(
            ProtocolStep(
                counter=ts,
                incoming=[meta],
                synced_start=self.store.state.merge_base,
                synced=[meta],
                changes=[StateChangeRequest(tx_id, TxState.ACCEPTED)],
                service="sync-coordinator",
            )
        )
        assert self.state(tx_id) is TxState.ENQUEUED
        return tx_id


@asynccontextmanager
async def _harness(tmp_path: Path, testing_held_s: float) -> AsyncIterator[Harness]:
    store = await TransactionStore.open(StoreConfig(data_dir=tmp_path, node_id="dc1"))
    server, address = await serve_store(store)
    channel = new_channel(address, as_service=True)
    dropped: list[None] = []
    records = StateRecords(
        store_pb2_grpc.StoreInternalServiceStub(channel),
        on_dropped=lambda: dropped.append(None),
        testing_held_s=testing_held_s,
    )
    sender = asyncio.get_running_loop().create_task(records.run())
    harness = Harness(store, records, dropped, server, address, sender)
    try:
        yield harness
    finally:
        await _stopped(sender)
        await channel.close()
        await harness.server.stop(None)
        await store.close()


async def _stopped(sender: asyncio.Task[None]) -> None:
    """Cancel the sender and wait, within a deadline, until it has ended."""
    sender.cancel()
    async with asyncio.timeout(WAIT_S):
        await asyncio.gather(sender, return_exceptions=True)


def _ok(position: int) -> common_pb2.Outcome:
    return common_pb2.Outcome(state=common_pb2.TX_STATE_OK, position=position)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_testing_and_its_outcome_go_in_one_call_with_testing_s_own_time(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        # Held far longer than any test here takes: the outcome always comes first.
        async with _harness(tmp_path, testing_held_s=600) as h:
            tx_id = await h.enqueued(1)
            batches = work.received[BATCHES]
            h.records.record(tx_id, common_pb2.TX_STATE_TESTING)
            tested_by = _now_ms()
            await until(lambda: _now_ms() > tested_by + 20, "the clock moved on")
            assert h.state(tx_id) is TxState.ENQUEUED  # held, not sent
            h.records.record(tx_id, common_pb2.TX_STATE_OK, _ok(1))
            await until(lambda: h.state(tx_id) is TxState.OK, "OK recorded")
            assert work.received[BATCHES] == batches + 1
            testing, ok = h.store.get(tx_id).history[-2:]
            assert (testing.state, testing.service) == (TxState.TESTING, "worker-dispatch")
            assert testing.at_unix_ms <= tested_by < ok.at_unix_ms

    asyncio.run(main())


def test_a_long_test_is_reported_testing_on_its_own(tmp_path: Path) -> None:
    async def main() -> None:
        async with _harness(tmp_path, testing_held_s=0.05) as h:
            tx_id = await h.enqueued(1)
            batches = work.received[BATCHES]
            h.records.record(tx_id, common_pb2.TX_STATE_TESTING)
            await until(lambda: h.state(tx_id) is TxState.TESTING, "TESTING recorded alone")
            assert work.received[BATCHES] == batches + 1
            h.records.record(tx_id, common_pb2.TX_STATE_OK, _ok(1))
            await until(lambda: h.state(tx_id) is TxState.OK, "OK recorded")
            assert work.received[BATCHES] == batches + 2

    asyncio.run(main())


@pytest.mark.parametrize("testing_held_s", [0.05, 600])
def test_a_refused_batch_is_dropped_and_the_next_one_goes(
    tmp_path: Path, testing_held_s: float
) -> None:
    async def main() -> None:
        async with _harness(tmp_path, testing_held_s=testing_held_s) as h:
            first, second = await h.enqueued(1), await h.enqueued(2)
            # OK without TESTING: not a forward step, refused for good.
            h.records.record(first, common_pb2.TX_STATE_OK, _ok(1))
            await until(lambda: bool(h.dropped), "the refused batch dropped")
            assert h.state(first) is TxState.ENQUEUED
            h.records.record(second, common_pb2.TX_STATE_TESTING)
            h.records.record(second, common_pb2.TX_STATE_OK, _ok(2))
            await until(lambda: h.state(second) is TxState.OK, "the next batch recorded")

    asyncio.run(main())


def test_a_batch_the_store_did_not_answer_goes_again_on_a_new_stream(tmp_path: Path) -> None:
    async def main() -> None:
        async with _harness(tmp_path, testing_held_s=600) as h:
            first, second = await h.enqueued(1), await h.enqueued(2)
            h.records.record(first, common_pb2.TX_STATE_TESTING)
            h.records.record(first, common_pb2.TX_STATE_OK, _ok(1))
            await until(lambda: h.state(first) is TxState.OK, "recorded on the first stream")

            async def record_while_down() -> None:
                refusals = h.records.refusals
                h.records.record(second, common_pb2.TX_STATE_TESTING)
                h.records.record(second, common_pb2.TX_STATE_OK, _ok(2))
                await until(lambda: h.records.refusals > refusals, "the batch refused")
                assert h.state(second) is TxState.ENQUEUED

            await h.restart_server(record_while_down)
            await until(lambda: h.state(second) is TxState.OK, "recorded on a new stream")
            assert not h.dropped, "a store that went away refused nothing for good"

    asyncio.run(main())


def test_the_sender_stops_when_cancelled_as_a_record_arrives(tmp_path: Path) -> None:
    """On Python 3.11 ``asyncio.wait_for`` returns the result of what it waits for if
    that is done as its caller is cancelled, and the cancellation is lost: the sender then
    went on waiting for records for ever, and the dispatch's stop with it (a hang in CI)."""

    async def main() -> None:
        async with _harness(tmp_path, testing_held_s=600) as h:
            tx_id = await h.enqueued(1)
            h.records.record(tx_id, common_pb2.TX_STATE_TESTING)
            # The sender has taken the record and waits, with a deadline (the held
            # TESTING's), for the next one.
            await until(lambda: not h.records._ready.is_set(), "the sender waiting")
            h.records.record(tx_id, common_pb2.TX_STATE_OK, _ok(1))
            h.sender.cancel()  # in the same turn: the record's wake-up and the cancel race
            async with asyncio.timeout(WAIT_S):
                await asyncio.gather(h.sender, return_exceptions=True)
            assert h.sender.cancelled()

    asyncio.run(main())
