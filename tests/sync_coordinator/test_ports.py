"""The coordinator's ports, in one process: its store port (``PersistSteps`` and the
local-submit watch) against a real transaction-store served over gRPC on loopback, and
its peer port (``PeerLink`` and ``PeerServicer``) between two such DCs. The shell behind
them is pure (test_shell.py); these show the adapters carry its writes, answers and
sends, and that a store that goes away ends the coordinator's incarnation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from tests.support.in_process import (
    WAIT_S,
    InProcessDc,
    reached,
    run_dcs,
    submit_inserts,
    until,
)
from txsync.protocol import TxState
from txsync.rpc import add_service, new_server
from txsync.sync_coordinator.peer_service import PeerServicer
from txsync.sync_coordinator.server import PEER_SERVICE
from txsync.telemetry import work
from txsync.transaction_store.rotation import TRUNCATION_STEP


def test_the_store_port_carries_writes_and_their_answers(tmp_path: Path) -> None:
    async def scenario(dcs: dict[str, InProcessDc]) -> None:
        dc = dcs["dc1"]  # a cluster of one: it orders alone
        submitted = await submit_inserts(dc, range(20))
        await until(reached(dc, submitted), "every submit ENQUEUED")
        shell = dc.coordinator.shell
        assert shell is not None
        await until(lambda: not shell.writes_in_flight, "every write answered")
        assert dc.store.state.merge_base.synced_len == 20
        assert shell.pending_synced() == []
        assert not dc.coordinator.failed.done()

    run_dcs(tmp_path, ["dc1"], scenario)


def test_a_store_that_goes_away_ends_the_incarnation(tmp_path: Path) -> None:
    """Memory may have run ahead of the disk: the coordinator must stop (and be restarted
    from durable state), not linger holding sends."""

    async def scenario(dcs: dict[str, InProcessDc]) -> None:
        dc = dcs["dc1"]
        await dc.store_server.stop(0)
        reason = await asyncio.wait_for(dc.coordinator.failed, WAIT_S)
        assert "ended" in reason, reason

    run_dcs(tmp_path, ["dc1"], scenario)


def _serves(dc: InProcessDc, length: int) -> Callable[[], bool]:
    """A condition: ``dc``'s store serves ``length`` synced entries to a catch-up read."""
    return lambda: len(dc.store.read_synced(0, 100)[1]) == length


def test_the_peer_port_carries_posts_and_bodies(tmp_path: Path) -> None:
    async def scenario(dcs: dict[str, InProcessDc]) -> None:
        first = await submit_inserts(dcs["dc1"], range(10))
        second = await submit_inserts(dcs["dc2"], range(100, 110))
        for name, dc in dcs.items():
            await until(reached(dc, [*first, *second]), f"every submit ENQUEUED at {name}")
            # ENQUEUED is in the store's staged state at once; catch-up reads serve only
            # synced appends already on disk (persist before send), a moment later.
            await until(_serves(dc, 20), f"every synced append durable at {name}")
        orders = [dc.store.read_synced(0, 100)[1] for dc in dcs.values()]
        assert orders[0] == orders[1] and len(orders[0]) == 20
        for dc in dcs.values():  # every body arrived, pushed or fetched through the peer port
            for tx_id in [*first, *second]:
                assert await dc.store.read_body(tx_id) is not None, tx_id
        assert all(link.sent > 0 for dc in dcs.values() for link in dc.coordinator.links.values())
        # A step's pushes went in its post's message, and the receiver took them from it.
        assert work.received_bytes["Exchange.bodies_ahead"] > 0
        # What admin reads: a copy, naming the peer and how far its last post was.
        snapshot = dcs["dc1"].coordinator.snapshot()
        assert snapshot is not None and [p.node_id for p in snapshot.peers] == ["dc2"]
        last_post = snapshot.peers[0].last_post
        assert last_post is not None and last_post[1].synced_len <= 20
        assert snapshot.merge_base.synced_len == 20 and snapshot.lag == 0

    run_dcs(tmp_path, ["dc1", "dc2"], scenario)


def test_a_peer_stream_broken_by_the_peer_going_away_is_opened_again(tmp_path: Path) -> None:
    """Peers talk on one Exchange stream per direction. dc2's peer port goes away and
    comes back on the same address: dc1's stream to it fails, and dc1 opens a new one."""

    async def scenario(dcs: dict[str, InProcessDc]) -> None:
        dc1, dc2 = dcs["dc1"], dcs["dc2"]
        first = await submit_inserts(dc1, range(5))
        await until(reached(dc2, first), "the first submits ENQUEUED at dc2")
        link = dc1.coordinator.links["dc2"]
        assert link.failed == 0
        await dc2.peer_server.stop(0)
        await until(lambda: link.failed > 0, "dc1's stream to dc2 failed")
        server = new_server()
        assert server.add_insecure_port(dc2.peer_address) > 0
        add_service(server, PeerServicer(dc2.coordinator), PEER_SERVICE)
        await server.start()
        try:
            second = await submit_inserts(dc1, range(5, 10))
            for name, dc in dcs.items():
                await until(reached(dc, [*first, *second]), f"every submit ENQUEUED at {name}")
        finally:
            await server.stop(0)

    run_dcs(tmp_path, ["dc1", "dc2"], scenario)


def enqueued_or_truncated(dc: InProcessDc, tx_ids: list[str]) -> Callable[[], bool]:
    """A condition: every one of ``tx_ids`` ENQUEUED or later at ``dc``'s store, or gone
    from it by a truncation. A witness that keeps no history truncates what its peer
    passed within a progress report or two: on a loaded machine it dropped some before
    the test looked, and waiting for them to be ENQUEUED timed out (CI, 2026-12-03)."""

    def check() -> bool:
        state = dc.store.state
        records = [state.tx(tx_id) for tx_id in tx_ids]
        return all(
            state.synced_offset > 0
            if record is None
            else record.state is not None and record.state >= TxState.ENQUEUED
            for record in records
        )

    return check


def test_the_core_hears_where_its_stores_history_starts(tmp_path: Path) -> None:
    """After each progress report the coordinator tells its core how far the store may
    truncate (``HistoryTruncated``), and the store truncates no further than the core
    heard (``core_history_len``, in the next report): a lagger behind it is sent to the
    log, and from the log's refusal to a copy of a peer DC's database, never served from
    memory metas whose bodies no DC may hold any more (docs/protocol.md, "Starting from
    another DC's copy")."""

    async def scenario(dcs: dict[str, InProcessDc]) -> None:
        submitted = await submit_inserts(dcs["dc2"], range(TRUNCATION_STEP + 20))
        for name, dc in dcs.items():
            await until(enqueued_or_truncated(dc, submitted), f"every submit ENQUEUED at {name}")
        store, core = dcs["dc1"].store, dcs["dc1"].coordinator.node
        assert core is not None

        def truncated_no_further_than_heard() -> bool:
            offset = store.state.synced_offset
            assert offset <= core.history_len, f"truncated to {offset}, the core heard of less"
            return offset > 0

        await until(truncated_no_further_than_heard, "dc1 truncated in place")

    # A witness has no workers to hold its truncation back; this one keeps no history
    # beyond what its peer passed.
    truncating = {"witness": True, "history_kept": 0, "history_kept_ms": 0}
    run_dcs(tmp_path, ["dc1", "dc2"], scenario, {"dc1": truncating})
