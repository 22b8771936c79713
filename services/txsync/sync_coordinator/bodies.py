"""Bodies from peers: checking what arrives, and fetching what the core lacks, many per call.

The core asks for each body it lacks (``FetchBody``) and retries with backoff until it is
acquired. A DC back from a partition lacks thousands at once. Fetched one ``GetBody`` at a
time, at most 64 in flight and the rest dropped until the core's next retry (up to 5 s
later), it caught up at ~30 bodies/s: 3,000 bodies in 95 s, measured, while its workers,
and every DC's rounds that needed it, waited. Now which ids go to which holder, in which
batch, is decided by ``fetch_queue.FetchQueue`` (pure, run by the simulator too), and
``BodyFetches`` makes the calls: ``GetBodies`` of up to 256 ids and 3 MiB,
``FETCH_CALLS_PER_PEER`` at a time per holder. What arrives goes to the loop as pushed
bodies do (``take``), whose byte budget is the backpressure. A peer of an older release
(no ``GetBodies``) is asked one body per call, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import grpc

from txsync.refusals import Refusal
from txsync.sync_coordinator.effects import ArrivedBody
from txsync.sync_coordinator.fetch_queue import FetchQueue
from txsync.transaction_store.validation import check_peer_body, check_traceparent
from txsync.v1 import peer_pb2, peer_pb2_grpc

log = logging.getLogger(__name__)


def checked_body(tx_id: str, encoded: bytes, digest: bytes, traceparent: str) -> ArrivedBody:
    """A body from a peer, checked as the store checks it (``Refusal`` if it fails):
    the store fails a whole step that carries a body it refuses."""
    check_peer_body(tx_id, encoded, digest)
    return ArrivedBody(tx_id, encoded, digest, check_traceparent(traceparent))


class BodyFetches:
    """The fetches the core asked for, queued by holder and fetched in batches."""

    def __init__(
        self,
        node_id: str,
        *,
        stub_of: Callable[[str], peer_pb2_grpc.PeerServiceAsyncStub | None],
        wanted: Callable[[str], bool],
        take: Callable[[Sequence[ArrivedBody]], Awaitable[None]],
        timeout_s: float,
    ) -> None:
        """``stub_of``: the peer service of a holder (None: not configured);
        ``wanted``: whether the core still lacks a body (one that arrived meanwhile by a
        push is not fetched); ``take``: hands checked bodies to the loop."""
        self._node_id = node_id
        self._stub_of = stub_of
        self._wanted = wanted
        self._take = take
        self._timeout_s = timeout_s
        self.queue = FetchQueue()
        self.fetched = 0
        """Bodies fetched and handed to the loop."""
        self.calls = 0

    def ask(self, tx_id: str, source: str) -> bool:
        """Queue a fetch of ``tx_id`` from ``source``; True if a task must start
        ``drain(source)`` (the caller owns the tasks, so stopping it stops them)."""
        return self.queue.ask(tx_id, source)

    @property
    def queued(self) -> int:
        return self.queue.queued

    async def drain(self, source: str) -> None:
        """Fetch from ``source`` until its queue is empty. Between ``next_batch``
        answering nothing and the caller's end there is no await, so an ask never finds
        a queue that no caller will drain."""
        queue = self.queue
        while batch := queue.next_batch(source):
            wanted = [tx_id for tx_id in batch if self._wanted(tx_id)]
            try:
                unread = await self._fetch(source, wanted) if wanted else ()
            except BaseException:
                queue.abandoned(source, batch)  # stopped with the coordinator
                raise
            if unread is None:
                queue.failed(source, batch)
            else:
                queue.answered(source, batch, unread)

    async def _fetch(self, source: str, tx_ids: list[str]) -> Sequence[str] | None:
        """Fetch ``tx_ids`` and hand what arrives to the loop; the ids the holder left
        for a later call, or None if the call failed."""
        stub = self._stub_of(source)
        if stub is None:
            return None
        self.calls += 1
        try:
            got = await stub.GetBodies(
                peer_pb2.GetBodiesRequest(sender=self._node_id, tx_ids=tx_ids),
                timeout=self._timeout_s,
            )
        except grpc.aio.AioRpcError as error:
            if error.code() is grpc.StatusCode.UNIMPLEMENTED:
                return await self._fetch_one_by_one(stub, source, tx_ids)
            log.debug("fetching %d bodies from %s: %s", len(tx_ids), source, error.code().name)
            return None
        asked = set(tx_ids)
        arrived = [
            body
            for held in got.bodies
            if held.tx_id in asked and (body := self._checked(held, source)) is not None
        ]
        if arrived:
            self.fetched += len(arrived)
            await self._take(arrived)
        return got.unread

    async def _fetch_one_by_one(
        self, stub: peer_pb2_grpc.PeerServiceAsyncStub, source: str, tx_ids: list[str]
    ) -> Sequence[str] | None:
        for tx_id in tx_ids:
            try:
                got = await stub.GetBody(
                    peer_pb2.GetBodyRequest(sender=self._node_id, tx_id=tx_id),
                    timeout=self._timeout_s,
                )
            except grpc.aio.AioRpcError as error:
                if error.code() is not grpc.StatusCode.NOT_FOUND:
                    return None
                continue
            held = peer_pb2.PushBodyRequest(
                tx_id=tx_id, body=got.body, digest=got.digest, traceparent=got.traceparent
            )
            if (body := self._checked(held, source)) is not None:
                self.fetched += 1
                await self._take([body])
        return ()

    @staticmethod
    def _checked(held: peer_pb2.PushBodyRequest, source: str) -> ArrivedBody | None:
        try:
            return checked_body(held.tx_id, held.body, held.digest, held.traceparent)
        except Refusal as error:
            log.warning("body %s fetched from %s refused: %s", held.tx_id, source, error.message)
            return None
