"""What the coordinator tells of itself and its peers: the admin API's snapshot, the
lag behind the most advanced peer, and the peers' progress reported to the store, which
truncates what every peer passed. Part of ``Coordinator`` (``coordinator.py``)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

import grpc

from txsync.protocol import HistoryTruncated, MergeBase, Mode, QuorumState
from txsync.settings import PROGRESS_REPORT_S
from txsync.sync_coordinator.coordinator_core import (
    PERSIST_TIMEOUT_S,
    CoordinatorCore,
    DcCopyProgress,
    log,
    now_ms,
)
from txsync.v1 import store_pb2

CORE_HEARS_S = 1.0
"""How long a progress report waits for the core to step what the store may truncate
before it reports again (else the next periodic report carries it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerSnapshot:
    node_id: str
    address: str
    weight: int
    heard_ms: int
    """When the core last heard from it (the core's clock)."""
    last_post: tuple[int, MergeBase] | None
    """Counter and merge base of its latest accepted post."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CoordinatorSnapshot:
    """This DC's part in the protocol at one moment, for the admin API: a copy, so that
    readers never hold the core or the coordinator's mutable state."""

    node_id: str
    view_no: int
    members: tuple[str, ...]
    mode: Mode
    quorum: QuorumState
    merge_base: MergeBase
    counter: int
    incoming_len: int
    lag: int
    now_ms: int
    paused: bool
    peers: tuple[PeerSnapshot, ...]
    divergence_alarms: tuple[str, ...]
    divergence_alarm_count: int
    dc_copy: DcCopyProgress | None
    """A copy of another DC on its way here, as it stood (``dc_copies``)."""


class CoordinatorStatus(CoordinatorCore):
    def snapshot(self) -> CoordinatorSnapshot | None:
        """What the admin API shows, copied at one moment (None while loading)."""
        node = self.node
        if node is None:
            return None
        heard = node.last_heard_ms()
        peers = tuple(
            PeerSnapshot(
                node_id=peer,
                address=self.config.peers.get(peer, ""),
                weight=self.weights.get(peer, 0),
                heard_ms=heard[peer],
                last_post=self.peer_posts.get(peer),
            )
            for peer in sorted(heard)
            if peer != node.node_id
        )
        return CoordinatorSnapshot(
            node_id=node.node_id,
            view_no=node.view_no,
            members=node.members,
            mode=node.mode,
            quorum=node.quorum_state(),
            merge_base=node.merge_base,
            counter=node.counter,
            incoming_len=node.incoming_len,
            lag=self.lag(),
            now_ms=node.now_ms,
            paused=self.paused,
            peers=peers,
            divergence_alarms=tuple(self.outcomes.alarms),
            divergence_alarm_count=self.outcomes.alarm_count,
            dc_copy=replace(self.dc_copy) if self.dc_copy else None,
        )

    def peers_progress(self) -> dict[str, int]:
        """Every peer of the configuration with how far its latest post says it has come:
        its synced length, or less where it still lacks bodies, which it fetches from the
        others (a peer of an earlier release says 0). 0 for one not heard from since this
        coordinator started, which may need any of the history: each holds truncation
        back until it has all of it."""
        assert self.node is not None
        me = self.node.node_id
        return {
            peer: min(post[1].synced_len, self.peer_bodies_held.get(peer, 0))
            if (post := self.peer_posts.get(peer))
            else 0
            for peer in self.node.configuration
            if peer != me
        }

    def peers_posted(self) -> dict[str, int]:
        """How far each peer of the configuration heard from since this coordinator
        started says its order came (its latest post's synced length): the store records
        it, for a coordinator that restarts and does not hear from that peer."""
        assert self.node is not None
        configured = self.node.configuration
        return {
            peer: base.synced_len
            for peer, (_, base) in self.peer_posts.items()
            if peer in configured
        }

    def peers_ordered(self, posted: dict[str, int]) -> dict[str, int]:
        """How far each peer's order came (``posted``, else as the store recorded it), for
        the peers the store may let go of past ``--peer-hold-max``
        (``let_go.ServedPeers.orders``)."""
        assert self.node is not None
        peers = [peer for peer in self.node.configuration if peer != self.node.node_id]
        return self.served.orders(posted, peers, now_ms(), self.peers_recorded)

    async def _report_progress(self) -> None:
        """Tell the store how far every peer DC has come, so that it truncates the
        history all of them (and this DC's workers) passed. A failed report is tried
        again at the next one: until then the store truncates less, never more."""
        node = self.node
        assert node is not None
        while True:
            posted = self.peers_posted()
            request = store_pb2.ReportProgressRequest(
                peer_synced_len=self.peers_progress(),
                peers_reported=True,
                core_history_len=node.history_len,
                peer_ordered_len=self.peers_ordered(posted),
                peer_posted_len=posted,
            )
            told, may_go = False, 0
            try:
                answer = await self.store.ReportProgress(request, timeout=PERSIST_TIMEOUT_S)
                self.bodies_held_len = answer.bodies_held_len
                self.peers_recorded = dict(answer.peers_ordered)
                self.history_from = max(self.history_from, answer.history_from)
                # The core serves no lagger from memory below what the store may drop
                # (their bodies may be gone everywhere then): the store reads them from
                # its txlog, or sends the lagger to a copy. The store truncates no
                # further than the core has heard (``core_history_len``).
                may_go = answer.truncatable_below - 1
                if may_go > self.history_told:
                    self.history_told = may_go
                    await self.events.put(HistoryTruncated(may_go))
                    told = True
            except grpc.aio.AioRpcError as error:
                log.info("progress report to the store failed: %s", error.code().name)
            if told and await self._core_hears(may_go):
                # Reported again at once: waiting for the next report held a second more
                # of history at every store (about 1,000 transactions under a batched load).
                request.core_history_len = node.history_len
                try:
                    await self.store.ReportProgress(request, timeout=PERSIST_TIMEOUT_S)
                except grpc.aio.AioRpcError as error:
                    log.info("progress report to the store failed: %s", error.code().name)
            await asyncio.sleep(PROGRESS_REPORT_S)

    async def _core_hears(self, synced_len: int) -> bool:
        """Whether the core stepped ``HistoryTruncated(synced_len)`` within
        ``CORE_HEARS_S`` (its loop takes the event queue in order)."""
        node = self.node
        assert node is not None
        deadline = time.monotonic() + CORE_HEARS_S
        while node.history_len < synced_len:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    def lag(self) -> int:
        """Synced entries behind the most advanced peer whose post we have (0 if none
        is ahead)."""
        assert self.node is not None
        ours = self.node.merge_base.synced_len
        return max([0, *(base.synced_len - ours for _, base in self.peer_posts.values())])

    def lag_seconds(self) -> float:
        """How long ago a peer first had a synced position this DC still lacks."""
        assert self.node is not None
        ours = self.node.merge_base.synced_len
        self.lag_clock.forget_up_to(ours)
        return self.lag_clock.seconds_behind(ours, time.monotonic())
