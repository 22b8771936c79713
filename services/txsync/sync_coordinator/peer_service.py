"""``PeerService``: what other DCs' coordinators call on this one.

Posts, catch-up and view messages are decoded and checked (``wire``) and queued for the
protocol loop; pushed bodies are checked (limits and the origin's digest) and queued
too, and the loop writes each to the transaction-store with the step in which its core
hears it is acquired; bodies are served from the store.

Coordinators send all of it but GetBody on one ``Exchange`` stream per peer, taken here
message by message in the order sent; the unary calls take the same messages the same
way (tools, and a peer of an older version).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from txsync.protocol import (
    PostReceived,
    SyncedEntriesReceived,
    ViewMessageReceived,
    ViewQuery,
)
from txsync.refusals import Refusal
from txsync.rpc import REFUSALS, ServiceError, abort, answers_errors, check_request
from txsync.sync_coordinator.bodies import checked_body
from txsync.sync_coordinator.coordinator import Coordinator
from txsync.sync_coordinator.dc_copies import CopyPace, pass_on
from txsync.sync_coordinator.effects import ArrivedBody
from txsync.sync_coordinator.outcomes import OUTCOMES_PER_POST, Finished
from txsync.sync_coordinator.peer_queue import PUSH_BATCH_BYTES_MAX, StreamAnswers
from txsync.sync_coordinator.wire import (
    UnknownReference,
    WireError,
    check_node_id,
    entries_from_proto,
    post_from_proto,
    view_message_from_proto,
)
from txsync.transaction_store.validation import BODIES_PER_CALL_MAX
from txsync.v1 import common_pb2, peer_pb2, peer_pb2_grpc, store_pb2, worker_pb2

log = logging.getLogger(__name__)


def _certificate_identity(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """The subject CN of the caller's verified client certificate."""
    names = list(context.auth_context().get("x509_common_name") or [])
    return names[0].decode() if names else None


def _invalid(error: WireError) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, str(error))


DIGEST_BYTES_MAX = 64


def _outcomes_from_proto(outcomes: Any) -> list[Finished]:
    """A post's outcomes, all checked before any is taken (ServiceError otherwise)."""
    if len(outcomes) > OUTCOMES_PER_POST:
        raise _invalid(WireError(f"outcomes: more than {OUTCOMES_PER_POST}"))
    finished: list[Finished] = []
    for index, outcome in enumerate(outcomes):
        where = f"outcomes[{index}]"
        if outcome.position < 1:
            raise _invalid(WireError(f"{where}.position: must be at least 1"))
        if outcome.state not in (common_pb2.TX_STATE_OK, common_pb2.TX_STATE_FAILED):
            raise _invalid(WireError(f"{where}.state: must be OK or FAILED"))
        if len(outcome.state_digest) > DIGEST_BYTES_MAX:
            raise _invalid(WireError(f"{where}.state_digest: more than {DIGEST_BYTES_MAX} bytes"))
        if len(outcome.tx_id) > 64:
            raise _invalid(WireError(f"{where}.tx_id: longer than 64"))
        finished.append(
            Finished(
                outcome.position,
                outcome.tx_id,
                outcome.state == common_pb2.TX_STATE_OK,
                outcome.state_digest,
            )
        )
    return finished


class PeerServicer(peer_pb2_grpc.PeerServiceServicer):
    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator
        self._limits = coordinator.config.limits

    def _check_peer(
        self, sender: str, context: grpc.aio.ServicerContext[Any, Any], *, anyone: bool = False
    ) -> None:
        """Only configured peers, and (with mutual TLS) only as the node their
        certificate names: a peer cannot speak for another. ``anyone``: any node with a
        valid certificate for its name (a joining node asking which view is current)."""
        if silence := self._coordinator.silence:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, silence)
        config = self._coordinator.config
        known = anyone or self._coordinator.is_known_peer(sender)
        if sender == config.node_id or not known:
            kind, reason = "unconfigured", f"{sender!r} is not a configured peer"
        elif config.tls is not None and (identity := _certificate_identity(context)) != sender:
            kind = "identity"
            reason = f"certificate names {identity!r}, but the call claims to be {sender!r}"
        else:
            return
        self._coordinator.caller_refused(kind)
        log.warning("refused a call from %s (%s): %s", context.peer(), kind, reason)
        raise ServiceError(grpc.StatusCode.PERMISSION_DENIED, reason)

    async def Exchange(
        self,
        requests: AsyncIterator[peer_pb2.ExchangeRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[peer_pb2.ExchangeResponse]:
        """A peer's stream: each message taken in the order sent (so a body pushed ahead
        of a post is held when the post is taken; ``bodies_ahead`` are taken before their
        message's own kind). A post this node cannot rebuild is answered
        ``whole_needed`` at once; the others are acknowledged together
        (``StreamAnswers``). A refused message ends the stream with its status."""
        answers = StreamAnswers()
        try:
            async for request in requests:
                check_request(request)
                if request.HasField("bodies_ahead"):
                    await self._take_bodies(request.bodies_ahead, context)
                kind = request.WhichOneof("message")
                if kind == "post":
                    post = request.post
                    whole_needed = await self._take_post(post, context)
                    if (answer := answers.took(post, whole_needed)) is not None:
                        yield answer
                elif kind == "bodies":
                    await self._take_bodies(request.bodies, context)
                elif kind == "synced_entries":
                    await self._take_synced_entries(request.synced_entries, context)
                elif kind == "view":
                    await self._take_view_message(request.view, context)
                elif kind == "body":
                    await self._take_body(request.body, context)
                elif kind == "snapshot_needed":
                    self._take_snapshot_needed(request.snapshot_needed, context)
                else:
                    raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, "an empty message")
        except REFUSALS as error:
            await abort(context, error)

    async def _take_post(
        self, request: peer_pb2.PostRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bool:
        """Take a post; True if it named a post this node no longer holds (nothing of it
        was taken: the sender posts the whole queue again)."""
        known, interner = self._coordinator.known_posts, self._coordinator.metas
        try:
            post = post_from_proto(request, self._limits, known, interner)
        except UnknownReference:
            self._check_peer(request.sender, context)
            return True
        except WireError as error:
            raise _invalid(error) from None
        self._check_peer(post.sender, context)
        finished = _outcomes_from_proto(request.outcomes)
        # Accepted whole: only now does it change what this node knows (a refused post
        # must leave no trace).
        self._coordinator.post_accepted(
            post, finished, request.round_traceparent, request.bodies_held_len
        )
        await self._coordinator.events.put(PostReceived(post))
        return False

    async def _take_synced_entries(
        self,
        request: peer_pb2.SendSyncedEntriesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        try:
            entries = entries_from_proto(request, self._limits, self._coordinator.metas)
        except WireError as error:
            raise _invalid(error) from None
        self._check_peer(entries.sender, context)
        await self._coordinator.events.put(SyncedEntriesReceived(entries))

    async def _take_body(
        self, request: peer_pb2.PushBodyRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        try:
            check_node_id(request.sender, "sender")
        except WireError as error:
            raise _invalid(error) from None
        self._check_peer(request.sender, context)
        arrived = checked_body(request.tx_id, request.body, request.digest, request.traceparent)
        await self._coordinator.take_bodies([arrived])

    async def _take_bodies(
        self, request: peer_pb2.PushBodiesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """Each body checked on its own: a bad one is logged and left out (the post
        that names it finds it unacquired, and it is fetched by GetBody), the others
        taken."""
        try:
            check_node_id(request.sender, "sender")
            if len(request.bodies) > BODIES_PER_CALL_MAX:
                raise WireError(f"bodies: {len(request.bodies)} is over {BODIES_PER_CALL_MAX}")
        except WireError as error:
            raise _invalid(error) from None
        self._check_peer(request.sender, context)
        arrived: list[ArrivedBody] = []
        for body in request.bodies:
            try:
                arrived.append(checked_body(body.tx_id, body.body, body.digest, body.traceparent))
            except Refusal as error:
                log.warning("body %s from %s refused: %s", body.tx_id, request.sender, error)
        await self._coordinator.take_bodies(arrived)

    def _take_snapshot_needed(
        self,
        request: peer_pb2.SnapshotNeededRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        try:
            check_node_id(request.sender, "sender")
        except WireError as error:
            raise _invalid(error) from None
        self._check_peer(request.sender, context)
        self._coordinator.snapshot_needed(request.sender, request.history_from)

    async def ExportDcSnapshot(
        self,
        request: peer_pb2.ExportDcSnapshotRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[peer_pb2.ExportDcSnapshotResponse]:
        """This DC's dispatch's copy of its testing worker, passed through as it comes
        (the dispatch exports one at a time, and its store describes it)."""
        try:
            check_request(request)
            try:
                check_node_id(request.adopter, "adopter")
            except WireError as error:
                raise _invalid(error) from None
            self._check_peer(request.adopter, context)
            dispatch = self._coordinator.dispatch
            if dispatch is None:
                raise ServiceError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{self._coordinator.config.node_id} exports no copies: its store names "
                    "no worker-dispatch (--dispatch)",
                )
        except REFUSALS as error:
            await abort(context, error)
            return
        log.warning(
            "DC COPY: %s (at position %d) copies this DC's testing worker",
            request.adopter, request.adopter_len,
        )  # fmt: skip
        export = dispatch.ExportDcCopy(
            worker_pb2.ExportDcCopyRequest(adopter=request.adopter, adopter_len=request.adopter_len)
        )
        pace = CopyPace(self._coordinator.config.dc_copy_bytes_per_s, time.monotonic())
        try:
            async for chunk in export:
                yield pass_on(chunk, peer_pb2.ExportDcSnapshotResponse())
                # Not reading the dispatch's stream meanwhile holds it back too (gRPC's
                # flow control), so the worker's export goes at this pace as well.
                await asyncio.sleep(pace.wait_s(len(chunk.chunk.data), time.monotonic()))
        except grpc.aio.AioRpcError as error:
            await abort(context, ServiceError(error.code(), error.details() or "dispatch refused"))
            return
        finally:
            export.cancel()
        log.warning(
            "DC COPY: sent %s %d bytes in %.2f s (at most %d bytes/s; 0: not paced)",
            request.adopter, pace.sent, time.monotonic() - pace.started_s, pace.bytes_per_s,
        )  # fmt: skip

    @answers_errors
    async def GetBody(
        self, request: peer_pb2.GetBodyRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> peer_pb2.GetBodyResponse:
        self._check_peer(request.sender, context)
        try:
            body = await self._coordinator.store.ReadBody(
                store_pb2.ReadBodyRequest(tx_id=request.tx_id)
            )
        except grpc.aio.AioRpcError as error:
            raise ServiceError(error.code(), error.details() or "store refused") from None
        return peer_pb2.GetBodyResponse(
            body=body.body, digest=body.digest, traceparent=body.traceparent
        )

    @answers_errors
    async def GetBodies(
        self, request: peer_pb2.GetBodiesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> peer_pb2.GetBodiesResponse:
        self._check_peer(request.sender, context)
        if not 1 <= len(request.tx_ids) <= BODIES_PER_CALL_MAX:
            raise _invalid(
                WireError(f"tx_ids: {len(request.tx_ids)} is outside 1..{BODIES_PER_CALL_MAX}")
            )
        try:
            held = await self._coordinator.store.ReadBodies(
                store_pb2.ReadBodiesRequest(tx_ids=request.tx_ids, bytes_max=PUSH_BATCH_BYTES_MAX)
            )
        except grpc.aio.AioRpcError as error:
            raise ServiceError(error.code(), error.details() or "store refused") from None
        return peer_pb2.GetBodiesResponse(
            bodies=[
                peer_pb2.PushBodyRequest(
                    tx_id=body.tx_id, body=body.body, digest=body.digest,
                    traceparent=body.traceparent,
                )
                for body in held.bodies
            ],
            unread=held.unread,
        )  # fmt: skip

    async def _take_view_message(
        self,
        request: peer_pb2.SendViewMessageRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        try:
            message = view_message_from_proto(request, self._limits)
        except WireError as error:
            raise _invalid(error) from None
        self._check_peer(message.sender, context, anyone=isinstance(message, ViewQuery))
        await self._coordinator.events.put(ViewMessageReceived(message))
