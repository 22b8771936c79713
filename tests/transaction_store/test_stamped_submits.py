"""Stamped submits: the store's side of the replay rule (docs/protocol.md, "The submit's
counter, stamped by the store"), checked on a real store and after a restart, which
replays the very log it wrote."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.support.in_process import WAIT_S
from tests.transaction_store.held_writes import hold_writes
from txsync.protocol import TxMeta
from txsync.transaction_store.local_submits import LocalSubmit
from txsync.transaction_store.step_rules import ProtocolStep
from txsync.transaction_store.store import (
    StoreConfig,
    TransactionStore,
)
from txsync.v1 import common_pb2

Scenario = Callable[[TransactionStore], Awaitable[None]]


def _body(n: int = 1) -> common_pb2.TxBody:
    return common_pb2.TxBody(statements=[common_pb2.Statement(sql=f"INSERT INTO t VALUES ({n})")])


def _run(tmp_path: Path, *scenarios: Scenario) -> None:
    """Each scenario on the store opened afresh from the same directory."""

    async def main() -> None:
        for scenario in scenarios:
            store = await TransactionStore.open(
                StoreConfig(data_dir=tmp_path, node_id="dc1", stamp_clock_us=lambda: 0)
            )
            try:
                await scenario(store)
            finally:
                await store.close()

    asyncio.run(main())


async def _submit(store: TransactionStore) -> str:
    return (await store.submit(_body())).tx_id


async def _first_watched(store: TransactionStore) -> list[LocalSubmit]:
    watch = store.watch_local_submits()
    try:
        return await asyncio.wait_for(anext(watch), WAIT_S)
    finally:
        await watch.aclose()


def test_a_counter_made_before_the_submit_was_stepped_voids_its_stamp(tmp_path: Path) -> None:
    """The coordinator wrote counter 5 without having stepped the submit stamped 1: it
    may have posted 5 without it, so the stamp is void, before and after a restart, and
    the submit is handed over to be stamped anew."""
    tx_id = ""

    async def write(store: TransactionStore) -> None:
        nonlocal tx_id
        tx_id = await _submit(store)
        assert store.get(tx_id).meta == TxMeta(1, tx_id, "dc1")
        await store.persist_step(ProtocolStep(counter=5, local_seq=0))
        await check(store)

    async def check(store: TransactionStore) -> None:
        assert store.get(tx_id).meta is None and tx_id not in store.state.incoming
        assert list(store.state.pending_local) == [tx_id] and not store.state.unsettled
        (handed,) = await _first_watched(store)
        assert (handed.tx_id, handed.ts, handed.local_seq) == (tx_id, 0, 0)

    _run(tmp_path, write, check)


def test_a_counter_made_after_the_submit_was_stepped_keeps_its_stamp(tmp_path: Path) -> None:
    tx_id = ""

    async def write(store: TransactionStore) -> None:
        nonlocal tx_id
        tx_id = await _submit(store)
        await store.persist_step(ProtocolStep(counter=5, local_seq=1))
        await check(store)

    async def check(store: TransactionStore) -> None:
        assert store.get(tx_id).meta == TxMeta(1, tx_id, "dc1")
        assert store.state.incoming[tx_id] == TxMeta(1, tx_id, "dc1")
        assert not store.state.pending_local and not store.state.unsettled

    _run(tmp_path, write, check)


def test_a_counter_below_the_stamp_leaves_it_open_and_a_new_epoch_settles_it(
    tmp_path: Path,
) -> None:
    """A counter below the stamp says nothing of it; a new coordinator (its epoch) takes
    the stamps as they are, so a counter written after that voids none of them."""
    tx_id = ""

    async def write(store: TransactionStore) -> None:
        nonlocal tx_id
        await store.persist_step(ProtocolStep(counter=5))
        tx_id = await _submit(store)
        assert store.state.unsettled == {tx_id: (6, 1)}
        await store.persist_step(ProtocolStep(counter=5, local_seq=0))
        assert store.state.unsettled == {tx_id: (6, 1)}

    async def restart(store: TransactionStore) -> None:
        assert store.state.unsettled == {tx_id: (6, 1)}  # replayed open
        (handed,) = await _first_watched(store)  # the coordinator may not hold it
        assert (handed.ts, handed.local_seq) == (6, 1)
        await store.load_protocol_state(4_096)  # the log had no epoch: all are kept
        assert not store.state.unsettled
        await store.persist_step(ProtocolStep(counter=9, local_seq=0))
        assert store.get(tx_id).meta == TxMeta(6, tx_id, "dc1")

    _run(tmp_path, write, restart)


def test_stamped_anew_the_meta_replaces_the_stamp(tmp_path: Path) -> None:
    """The coordinator's counter had passed the stamp when it stepped the submit: it
    writes the meta it stamped anew, which the store takes in place of the stamp, open
    or void, and a submit stamped afterwards goes above it."""
    tx_ids: list[str] = []

    async def write(store: TransactionStore) -> None:
        tx_ids.extend([await _submit(store), await _submit(store)])
        await store.persist_step(ProtocolStep(counter=5, local_seq=0))  # voids both
        first, second = tx_ids
        await store.persist_step(
            ProtocolStep(counter=7, local_seq=2, incoming=[TxMeta(6, first, "dc1")])
        )
        assert store.get(first).meta == TxMeta(6, first, "dc1")
        assert list(store.state.pending_local) == [second]
        third = await _submit(store)
        assert store.get(third).meta == TxMeta(8, third, "dc1")
        tx_ids.append(third)

    async def check(store: TransactionStore) -> None:
        first, second, third = tx_ids
        assert store.get(first).meta == TxMeta(6, first, "dc1")
        assert store.get(second).meta is None
        assert store.state.unsettled == {third: (8, 3)} and store.state.local_seq == 3

    _run(tmp_path, write, check)


def test_a_submit_whose_client_hung_up_is_still_handed_over_once_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's call cancelled while its submit's write is on disk: the submit is
    written all the same, so the coordinator must still hear of it, and only once it is
    durable."""

    async def scenario(store: TransactionStore) -> None:
        gate = hold_writes(monkeypatch)
        watch = store.watch_local_submits()
        handing = asyncio.ensure_future(anext(watch))
        submitting = asyncio.create_task(store.submit(_body()))
        async with asyncio.timeout(WAIT_S):
            while not store.state.unsettled:
                await asyncio.sleep(0)  # staged, its write held
        submitting.cancel()
        await asyncio.sleep(0.05)
        assert not handing.done()
        gate.set()
        (handed,) = await asyncio.wait_for(handing, WAIT_S)
        assert handed.tx_id in store.state.unsettled and handed.ts == 1
        await watch.aclose()

    _run(tmp_path, scenario)


def test_a_new_epoch_keeps_only_the_stamps_the_last_core_had_room_for(tmp_path: Path) -> None:
    """The last coordinator's core held at most 2 own metas (its epoch says so), and one
    settled own meta is still incoming: of the open stamps, it can have posted only the
    first. The others are void, handed over to be stamped anew, before and after a
    restart and a rotation (whose snapshot keeps the bound for the epoch after)."""
    tx_ids: list[str] = []

    async def write(store: TransactionStore) -> None:
        await store.load_protocol_state(2)
        tx_ids.append(await _submit(store))
        await store.persist_step(ProtocolStep(counter=1, local_seq=1))  # settles it
        tx_ids.extend([await _submit(store) for _ in range(3)])
        assert list(store.state.unsettled) == tx_ids[1:]
        await store.load_protocol_state(2)
        await check(store)

    async def check(store: TransactionStore) -> None:
        settled, kept, *void = tx_ids
        assert not store.state.unsettled
        assert store.get(settled).meta == TxMeta(1, settled, "dc1")
        assert store.get(kept).meta == TxMeta(2, kept, "dc1")
        assert list(store.state.incoming) == [settled, kept]
        assert list(store.state.pending_local) == void
        assert all(store.get(tx_id).meta is None for tx_id in void)

    async def rotate(store: TransactionStore) -> None:
        await check(store)
        await store.truncate()
        assert store.state.epoch_local_admit == 2
        await store.persist_step(ProtocolStep(counter=9, incoming=[TxMeta(9, tx_ids[2], "dc1")]))

    async def after_rotation(store: TransactionStore) -> None:
        assert store.state.epoch_local_admit == 2
        fourth = await _submit(store)
        await store.load_protocol_state(3)  # the last core held 2 at most, 3 are settled
        assert store.get(fourth).meta is None and fourth in store.state.pending_local
        assert store.state.epoch_local_admit == 3

    _run(tmp_path, write, check, rotate, after_rotation)
