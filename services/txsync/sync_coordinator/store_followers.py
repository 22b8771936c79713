"""What the coordinator follows in its store: local submits (LocalTx events with the
store's stamps, their bodies kept for the push), membership entries (for the core, in
synced order) and finished transactions (for the peers to compare). Each is a stream the
store answers, restarted when it ends. Part of ``Coordinator`` (``coordinator.py``)."""

from __future__ import annotations

import asyncio

import grpc

from txsync.codec import config_change_from_proto
from txsync.protocol import ConfigChangeSynced, LocalTx
from txsync.sync_coordinator.coordinator_core import CoordinatorCore, log
from txsync.sync_coordinator.outcomes import OUTCOMES_PER_POST, Finished
from txsync.v1 import common_pb2, peer_pb2, store_pb2

LOCAL_BODIES_MAX = 65_536
"""Local submits' bodies held until the core asks for their push; the oldest is dropped
beyond it (then read back from the store)."""
OUTCOMES_GATHER_MS = 100
"""The outcome follower's pause between the store's messages: outcomes only ride posts
and only delay divergence detection by it, while one message (and one wakeup of this
process) per finished transaction were 6% of the gRPC messages at low load (docs/
benchmarks.md, Tuning 15)."""


class StoreFollowers(CoordinatorCore):
    async def _follow_membership(self) -> None:
        """Feed the core each membership entry of the synced queue, in order, from the
        installed configuration's position on (the store streams them once every earlier
        position is ENQUEUED, so none is skipped)."""
        node = self.node
        assert node is not None
        fed = node.installed_view.configuration.applied_position
        while True:
            # Truncation keeps every position not finished at this DC, and a membership
            # entry is applied (its view installed) as soon as it is ENQUEUED: positions
            # skipped as truncated hold none that the core has not had.
            request = store_pb2.FollowEnqueuedRequest(
                from_position=fed + 1, membership_only=True, skip_truncated=True
            )
            try:
                async for ready in self.store.FollowEnqueued(request):
                    for tx in ready.txs:
                        change = common_pb2.TxBody.FromString(tx.body).membership
                        fed = tx.position
                        synced = ConfigChangeSynced(tx.position, config_change_from_proto(change))
                        await self.events.put(synced)
            except grpc.aio.AioRpcError as error:
                log.warning("membership follower ended (%s); retrying", error.code().name)
            await asyncio.sleep(0.5)

    async def _follow_outcomes(self) -> None:
        """This DC's finished transactions, for the other DCs to compare (``outcomes``),
        gathered for ``OUTCOMES_GATHER_MS`` between messages."""
        node = self.node
        assert node is not None
        followed = max(0, node.merge_base.synced_len - OUTCOMES_PER_POST)
        while True:
            # Outcomes truncated before they were sent are not compared: the exchange
            # is a check (OUTCOMES_PER_POST), not a record every position must reach.
            request = store_pb2.FollowEnqueuedRequest(
                from_position=followed + 1,
                finished_only=True,
                gather_ms=OUTCOMES_GATHER_MS,
                skip_truncated=True,
            )
            try:
                async for ready in self.store.FollowEnqueued(request):
                    for tx in ready.txs:
                        followed = tx.position
                        self.outcomes.add_own(
                            Finished(
                                tx.position,
                                tx.meta.tx_id,
                                tx.state == common_pb2.TX_STATE_OK,
                                tx.outcome.state_digest,
                            )
                        )
            except grpc.aio.AioRpcError as error:
                log.warning("outcome follower ended (%s); retrying", error.code().name)
            await asyncio.sleep(0.5)

    async def _watch_local_submits(self) -> None:
        """Local submits become LocalTx events with the store's stamps, their bodies kept
        for the push the core asks for next; the watch restarts if the store restarts.
        A message holds every submit the store made durable since the last one, in order,
        and its events go to the loop together, for one step."""
        local_bodies = self._local_bodies
        while True:
            try:
                async for handed in self.store.WatchLocalSubmits(
                    store_pb2.WatchLocalSubmitsRequest()
                ):
                    for submit in handed.submits:
                        if submit.body:
                            local_bodies[submit.tx_id] = peer_pb2.PushBodyRequest(
                                tx_id=submit.tx_id,
                                body=submit.body,
                                digest=submit.digest,
                                traceparent=submit.traceparent,
                            )
                            if len(local_bodies) > LOCAL_BODIES_MAX:
                                del local_bodies[next(iter(local_bodies))]
                        await self._wait_room_for_local()
                        await self.events.put(LocalTx(submit.tx_id, submit.ts, submit.local_seq))
                        # Counted once put (no await in between, so the loop cannot have
                        # stepped it yet), so a cancelled put leaves no count behind.
                        self._locals_queued += 1
            except grpc.aio.AioRpcError as error:
                log.warning("local submit watch ended (%s); retrying", error.code().name)
            await asyncio.sleep(0.5)

    async def _wait_room_for_local(self) -> None:
        """Until the core has room for one more local meta. A stamped submit is durable
        and acknowledged, so the core cannot refuse it as it refuses an unstamped one
        when full; it waits here instead, and the rest wait in the store (bounded by its
        --incoming-max and, per watch, by bytes), not in the core's incoming queue, which
        a view change may have to forget whole (INCOMING_TXS_MOST)."""
        node = self.node
        assert node is not None, "started"
        while not node.has_room_for_local(self._locals_queued):
            self._room_for_locals.clear()
            await self._room_for_locals.wait()
