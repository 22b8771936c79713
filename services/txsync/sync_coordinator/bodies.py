"""Bodies from peers: checking what arrives, and fetching what the core lacks, many per call.

The core asks for each body it lacks (``FetchBody``) and retries with backoff until it is
acquired. A DC back from a partition lacks thousands at once. Fetched one ``GetBody`` at a
time, at most 64 in flight and the rest dropped until the core's next retry (up to 5 s
later), it caught up at ~30 bodies/s: 3,000 bodies in 95 s, measured, while its workers,
and every DC's rounds that needed it, waited. Here each ask joins a queue per holder, once,
and each holder's queue is drained by ``GetBodies`` calls of up to 256 ids and 3 MiB,
FETCH_CALLS_PER_PEER at a time. What arrives goes to the loop as pushed bodies do
(``take``), whose byte budget is the backpressure.

A holder that fails a call loses its whole queue: the core's retries go round the other
holders it named. An id the holder does not have is dropped the same way. Held ids left
out for the 3 MiB go back in the queue. A peer of an older release (no ``GetBodies``) is
asked one body per call, as before.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence

import grpc

from txsync.refusals import Refusal
from txsync.sync_coordinator.effects import ArrivedBody
from txsync.transaction_store.validation import (
    BODIES_PER_CALL_MAX,
    check_peer_body,
    check_traceparent,
)
from txsync.v1 import peer_pb2, peer_pb2_grpc

log = logging.getLogger(__name__)

FETCH_QUEUE_MAX = 65_536
"""Bodies queued or being fetched, over all holders; the core retries an ask past it.
Ids only (about 100 bytes each): the bodies' own bytes are bounded where they land."""
FETCH_CALLS_PER_PEER = 2
"""GetBodies calls in flight to one holder: the next is asked while one is answered."""


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
        self._queues: dict[str, dict[str, None]] = {}
        """Per holder, the ids to fetch from it, oldest ask first."""
        self._asked: set[str] = set()
        """Queued or in a call (an ask for one of them is a retry: dropped)."""
        self._callers: dict[str, int] = {}
        """Per holder, the tasks draining its queue (at most FETCH_CALLS_PER_PEER)."""
        self.fetched = 0
        """Bodies fetched and handed to the loop."""
        self.calls = 0

    def ask(self, tx_id: str, source: str) -> bool:
        """Queue a fetch of ``tx_id`` from ``source``; True if a task must start
        ``drain(source)`` (the caller owns the tasks, so stopping it stops them)."""
        asked = self._asked
        if tx_id in asked or len(asked) >= FETCH_QUEUE_MAX:
            return False  # the core's retry asks again, perhaps another holder
        asked.add(tx_id)
        self._queues.setdefault(source, {})[tx_id] = None
        callers = self._callers.get(source, 0)
        if callers >= FETCH_CALLS_PER_PEER:
            return False
        self._callers[source] = callers + 1
        return True

    @property
    def queued(self) -> int:
        return len(self._asked)

    async def drain(self, source: str) -> None:
        """Fetch from ``source`` until its queue is empty. The emptiness check and the
        caller count's decrement have no await between them, so an ask never finds a
        queue that no task will drain."""
        try:
            queue = self._queues[source]
            while queue:
                batch = list(itertools.islice(queue, BODIES_PER_CALL_MAX))
                for tx_id in batch:
                    del queue[tx_id]
                wanted = [tx_id for tx_id in batch if self._wanted(tx_id)]
                try:
                    if wanted:
                        await self._fetch(source, wanted)
                finally:
                    self._asked.difference_update(tx_id for tx_id in batch if tx_id not in queue)
        finally:
            self._callers[source] -= 1
            if not self._callers[source]:
                del self._callers[source]
                if not self._queues.get(source):
                    self._queues.pop(source, None)

    async def _fetch(self, source: str, tx_ids: list[str]) -> None:
        stub = self._stub_of(source)
        if stub is None:
            self._drop_queue(source)
            return
        self.calls += 1
        try:
            got = await stub.GetBodies(
                peer_pb2.GetBodiesRequest(sender=self._node_id, tx_ids=tx_ids),
                timeout=self._timeout_s,
            )
        except grpc.aio.AioRpcError as error:
            if error.code() is grpc.StatusCode.UNIMPLEMENTED:
                await self._fetch_one_by_one(stub, source, tx_ids)
                return
            log.debug("fetching %d bodies from %s: %s", len(tx_ids), source, error.code().name)
            self._drop_queue(source)
            return
        asked = set(tx_ids)
        arrived = [
            body
            for held in got.bodies
            if held.tx_id in asked and (body := self._checked(held, source)) is not None
        ]
        queue = self._queues.setdefault(source, {})
        for tx_id in got.unread:
            if tx_id in asked:
                queue[tx_id] = None
        if arrived:
            self.fetched += len(arrived)
            await self._take(arrived)

    async def _fetch_one_by_one(
        self, stub: peer_pb2_grpc.PeerServiceAsyncStub, source: str, tx_ids: list[str]
    ) -> None:
        for tx_id in tx_ids:
            try:
                got = await stub.GetBody(
                    peer_pb2.GetBodyRequest(sender=self._node_id, tx_id=tx_id),
                    timeout=self._timeout_s,
                )
            except grpc.aio.AioRpcError as error:
                if error.code() is not grpc.StatusCode.NOT_FOUND:
                    self._drop_queue(source)
                    return
                continue
            held = peer_pb2.PushBodyRequest(
                tx_id=tx_id, body=got.body, digest=got.digest, traceparent=got.traceparent
            )
            if (body := self._checked(held, source)) is not None:
                self.fetched += 1
                await self._take([body])

    @staticmethod
    def _checked(held: peer_pb2.PushBodyRequest, source: str) -> ArrivedBody | None:
        try:
            return checked_body(held.tx_id, held.body, held.digest, held.traceparent)
        except Refusal as error:
            log.warning("body %s fetched from %s refused: %s", held.tx_id, source, error.message)
            return None

    def _drop_queue(self, source: str) -> None:
        queue = self._queues.get(source)
        if queue:
            self._asked.difference_update(queue)
            queue.clear()
