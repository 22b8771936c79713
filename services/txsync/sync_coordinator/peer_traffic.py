"""What goes to and comes from the peers, beside the loop: the released sends, each
on its peer's link (``peer_link.PeerLink``: a slow or dead peer never blocks the loop);
body pushes (from memory, else read from the store in batches), fetches and pushed
bodies taken; catch-up served from the txlog; links that follow the configuration; and
what a peer's accepted post tells. Part of ``Coordinator`` (``coordinator.py``)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

import grpc

from txsync.protocol import (
    FetchBody,
    Post,
    PushBody,
    Ready,
    SendPost,
    SendSyncedEntries,
    SendViewMessage,
    ServeCatchUpFromLog,
    SyncedEntries,
)
from txsync.sync_coordinator.coordinator_core import CoordinatorCore, log, now_ms
from txsync.sync_coordinator.effects import ArrivedBody
from txsync.sync_coordinator.outcomes import Finished
from txsync.sync_coordinator.peer_link import PeerLink
from txsync.sync_coordinator.wire import (
    base_from_proto,
    entries_to_proto,
    meta_from_proto,
    post_to_proto,
    view_message_to_proto,
)
from txsync.telemetry.logs import event as log_event
from txsync.transaction_store.validation import BODIES_PER_CALL_MAX, READ_SYNCED_MAX
from txsync.v1 import common_pb2, peer_pb2, peer_pb2_grpc, store_pb2

ARRIVED_BODY_BYTES_MAX = 64 * 1024 * 1024
"""Pushed bodies taken and not yet durable (queued for the loop, or in a write); a
peer's stream waits beyond it. Each is held in memory until its write is durable."""


class PeerTraffic(CoordinatorCore):
    def _push_local_bodies(self, readies: tuple[Ready, ...]) -> None:
        """The batch's pushes of bodies we hold in memory, as few calls per peer as fit,
        queued before the batch's posts (``PeerLink``); the rest are read from the store
        by ``_push_bodies``."""
        held: list[tuple[peer_pb2.PushBodyRequest, tuple[str, ...]]] = []
        for ready in readies:
            for body in ready.bodies:
                if not isinstance(body, PushBody):
                    continue
                push = self._local_bodies.pop(body.tx_id, None)
                if push is None:
                    self._pushes[body.tx_id] = body.to
                    self._pushes_waiting.set()
                else:
                    held.append((push, body.to))
        self._send_pushes(held)

    def _send_pushes(self, pushes: list[tuple[peer_pb2.PushBodyRequest, tuple[str, ...]]]) -> None:
        """Each (body, peers) to its peers: each peer's link merges them into as few
        PushBodies messages as fit (``PeerLink.push``)."""
        sender = self.config.node_id
        for push, peers in pushes:
            for peer in peers:
                if link := self._link(peer):
                    link.push(sender, push)

    def _sync_links(self) -> None:
        """Links follow the configuration: a node added by a membership entry is dialled
        at the address the entry gave; a removed one is hung up on (after this batch's
        sends: it is told of the view that removes it)."""
        node = self.node
        assert node is not None
        configuration = node.installed_view.configuration
        addresses = dict(configuration.addresses)
        wanted = {n for n, _ in configuration.weights if n != self.config.node_id}
        for peer in sorted(wanted - set(self.links)):
            address = addresses.get(peer)
            if address is None:
                log.error("no address for %s, added to the configuration: cannot reach it", peer)
                continue
            link = PeerLink(peer, address, self.config.tls)
            link.start()
            self.links[peer] = link
            self.weights[peer] = dict(configuration.weights)[peer]
            log.warning(
                "MEMBERSHIP: %s added at %s", peer, address,
                extra=log_event("membership.added", peer=peer, address=address),
            )  # fmt: skip
        for peer in sorted(set(self.links) - wanted):
            log.warning(
                "MEMBERSHIP: %s removed", peer, extra=log_event("membership.removed", peer=peer)
            )
            self._retired_links.append(self.links.pop(peer))
        self.weights.update(configuration.weights)

    def post_accepted(
        self, post: Post, finished: list[Finished], round_traceparent: str, bodies_held_len: int
    ) -> None:
        """A peer's post passed every check (``PeerServicer.Exchange``): only now does it
        change what this coordinator knows of that peer. The core hears of it through
        the event queue."""
        self.known_posts.remember(post.sender, post.epoch, post.seq, post.queue)
        self.rounds.peer_round(post.sender, round_traceparent)
        self.peer_posts[post.sender] = (post.counter, post.base)
        self.lag_clock.reached(post.base.synced_len, time.monotonic())
        self.peer_bodies_held[post.sender] = bodies_held_len
        for outcome in finished:
            self.outcomes.add_theirs(post.sender, outcome)

    def caller_refused(self, kind: str) -> None:
        self.refused_peers[kind] = self.refused_peers.get(kind, 0) + 1

    def is_known_peer(self, node_id: str) -> bool:
        """A node we may take calls from: a peer of the configuration, or one we still
        tell about a newer view (it may just have been added or removed)."""
        return node_id in self.links or (
            self.node is not None and node_id in self.node.configuration
        )

    def _link(self, to: str) -> PeerLink | None:
        link = self.links.get(to) or next(
            (retired for retired in self._retired_links if retired.node_id == to), None
        )
        if link is None:
            log.debug("no link to %s (not configured)", to)
        return link

    def _send(self, ready: Ready) -> None:
        self.rounds.on_reports(ready.rounds)
        if self.silent:
            return
        sent_ms = now_ms()  # one clock read per step: its messages leave together
        for message in ready.messages:
            match message:
                case SendPost(to, post):
                    if link := self._link(to):
                        outgoing = post_to_proto(post, with_queue=False)
                        outgoing.round_traceparent = self.rounds.traceparent
                        outgoing.bodies_held_len = self.bodies_held_len
                        for finished in self.outcomes.since(link.outcomes_sent):
                            outgoing.outcomes.add(
                                position=finished.position,
                                tx_id=finished.tx_id,
                                state=common_pb2.TX_STATE_OK
                                if finished.ok
                                else common_pb2.TX_STATE_FAILED,
                                state_digest=finished.state_digest,
                            )
                            link.outcomes_sent = finished.position
                        link.post(outgoing, post)
                        self.served.served(to, sent_ms)
                case SendSyncedEntries(to, entries):
                    if link := self._link(to):
                        link.send(entries_to_proto(entries))
                        self.served.served(to, sent_ms)
                case ServeCatchUpFromLog(to, from_len, count_max):
                    self._in_background(self._serve_from_log(to, from_len, count_max))
                case SendViewMessage(to, view_message):
                    if link := self._link(to):
                        link.send(view_message_to_proto(view_message))
                        self.served.served(to, sent_ms)  # an install carries a seal
        for body in ready.bodies:
            # pushes went out first (_push_local_bodies); a fetch of a body being stored
            # now would fetch it twice
            if (
                isinstance(body, FetchBody)
                and body.tx_id not in self.bodies_arriving
                and self.fetches.ask(body.tx_id, body.source)
            ):
                self._in_background(self.fetches.drain(body.source))

    def _serves_from(self) -> int:
        """The first synced position this DC serves a lagger: where its store's history
        starts, or what the store may drop next if the core was told of it. The store
        drops that once the core has heard, without waiting for answers on their way: a
        lagger served below it (one let go past ``--peer-hold-max``; no other is behind
        it) could be left with synced entries whose bodies no DC holds, as the simulator
        never allows (it truncates as it decides)."""
        return max(self.history_from, self.history_told + 1)

    async def _serve_from_log(self, to: str, from_len: int, count_max: int) -> None:
        if from_len + 1 < self._serves_from():
            self._tell_snapshot_needed(to, from_len)
            return
        try:
            answer = await self.store.ReadSynced(
                store_pb2.ReadSyncedRequest(
                    from_len=from_len, count_max=min(count_max, READ_SYNCED_MAX)
                )
            )
        except grpc.aio.AioRpcError as error:
            if from_len + 1 < self._serves_from():  # truncated since the check above
                self._tell_snapshot_needed(to, from_len)
                return
            log.warning("cannot serve %s from the txlog at %d: %s", to, from_len, error.details())
            return
        link = self._link(to)
        if answer.entries and link is not None:
            self.served.served(to, now_ms())
            entries = SyncedEntries(
                self.node.view_no if self.node is not None else 0,
                self.config.node_id,
                base_from_proto(answer.start),
                tuple(meta_from_proto(m) for m in answer.entries),
            )
            link.send(entries_to_proto(entries))

    def _tell_snapshot_needed(self, to: str, from_len: int) -> None:
        """``to`` asks for positions this DC truncated: it can only go on from a copy
        of a DC's database (docs/dc-snapshots.md; ``dc_copies`` at its end)."""
        link = self._link(to)
        if link is None:
            return
        serves_from = self._serves_from()
        if self.copy_told.get(to) != serves_from:  # said once per lagger and start
            self.copy_told[to] = serves_from
            log.info(
                "%s asks for catch-up from position %d; this DC serves positions from %d "
                "on: it needs a copy of a DC",
                to, from_len + 1, serves_from,
            )  # fmt: skip
        link.send(
            peer_pb2.SnapshotNeededRequest(sender=self.config.node_id, history_from=serves_from)
        )

    async def _push_bodies(self) -> None:
        """Push new bodies to the peers, many per call: every body that became durable
        while the previous batch was read goes in the next (one ReadBodies from the store,
        one PushBodies per peer), so calls per transaction fall as load rises. A body the
        store cannot read is left to the peers, which fetch it when they see its meta."""
        while True:
            await self._pushes_waiting.wait()
            self._pushes_waiting.clear()
            while self._pushes:
                batch = dict(itertools.islice(self._pushes.items(), BODIES_PER_CALL_MAX))
                for tx_id in batch:
                    del self._pushes[tx_id]
                try:
                    held = await self.store.ReadBodies(
                        store_pb2.ReadBodiesRequest(tx_ids=list(batch))
                    )
                except grpc.aio.AioRpcError as error:
                    log.warning("cannot push %d bodies: %s", len(batch), error.details())
                    continue
                for tx_id in held.unread:  # past the answer's 3 MiB: the next batch
                    self._pushes[tx_id] = batch[tx_id]
                self._send_pushes([
                    (peer_pb2.PushBodyRequest(tx_id=body.tx_id, body=body.body,
                                              digest=body.digest, traceparent=body.traceparent),
                     batch[body.tx_id])
                    for body in held.bodies
                ])  # fmt: skip

    def _peer_stub(self, node_id: str) -> peer_pb2_grpc.PeerServiceAsyncStub | None:
        link = self._link(node_id)
        return None if link is None else link.stub

    def _body_wanted(self, tx_id: str) -> bool:
        return self.node is not None and self.node.wants_body(tx_id)

    async def take_bodies(self, bodies: Sequence[ArrivedBody]) -> None:
        """Bodies from peers, checked (``checked_body``): the loop writes each with the
        step that tells the core it is acquired (one store call and fsync for both). The
        caller waits while ARRIVED_BODY_BYTES_MAX of them are not durable yet."""
        size = sum(len(body.body) for body in bodies)
        async with self._arrived_room:
            await self._arrived_room.wait_for(
                lambda: (
                    not self._arrived_bytes or self._arrived_bytes + size <= ARRIVED_BODY_BYTES_MAX
                )
            )
            self._arrived_bytes += size
        self.bodies_arriving.update(body.tx_id for body in bodies)
        for body in bodies:
            await self.events.put(body)
