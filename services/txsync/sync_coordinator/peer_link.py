"""Sending to one peer DC (``PeerLink``): the coordinator's loop hands it posts, body
pushes and other messages, and its own task writes them on one long-lived ``Exchange``
stream, in order, so that the loop never waits on a peer. The queues are bounded (the
newest post per merge base; other messages and body bytes drop their oldest), and the
stream's answers acknowledge posts, against which later posts are sent as deltas. Also
the mutual TLS files the links and the peer server use (``TlsFiles``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict, deque
from dataclasses import dataclass

import grpc
from opentelemetry import context as otel_context

from txsync.protocol import Post
from txsync.rpc import new_channel
from txsync.sync_coordinator.outcomes import OUTCOMES_PER_POST
from txsync.sync_coordinator.wire import set_post_queue
from txsync.telemetry import attached
from txsync.transaction_store.validation import BODIES_PER_CALL_MAX
from txsync.v1 import (
    peer_pb2,
    peer_pb2_grpc,
)

log = logging.getLogger(__name__)

PEER_QUEUE_MAX = 1_024
"""Messages other than posts waiting for one peer; the oldest is dropped beyond it."""
PEER_BODY_BYTES_MAX = 64 * 1024 * 1024
"""Bodies waiting to be pushed to one peer; the oldest push is dropped beyond it (the
peer fetches what it misses). Bytes, not messages: queued pushes are merged into
messages of up to PUSH_BATCH_BYTES_MAX, and a bound of 256 messages, which many small
batches filled under load (16 clients per DC submitting 50 at a time), dropped pushes
that each cost a fetch: 7 GetBody per transaction, measured, and a fetch storm that
held the cluster at 65 tx/s."""
PENDING_POST_BASES_MAX = 8
"""Merge bases with an unsent post to one peer; the oldest base is dropped beyond it."""
PEER_CHANNEL_OPTIONS = [
    # gRPC's default reconnect backoff grows to 120 s: after a long partition a healed
    # peer could stay unreached for minutes. Rounds need it back within a few seconds.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]
STREAM_POSTS_UNANSWERED_MAX = 256
"""Posts on a peer's stream not answered yet that we remember (for their acknowledgement);
the oldest is forgotten beyond it (its answer then changes nothing)."""
STREAM_RETRY_MIN_S = 0.05
STREAM_RETRY_MAX_S = 2.0
"""Backoff before a peer's stream is opened again after one that never answered failed:
doubling from the least to the most (as the channel's reconnect backoff)."""

PUSH_BATCH_BYTES_MAX = 3 * 1024 * 1024
"""Bodies in one PushBodies message, together: under gRPC's 4 MiB message limit."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM bytes for mutual TLS between DCs: our CA, this node's certificate and key."""

    ca: bytes
    cert: bytes
    key: bytes

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True
        )


_OtherMessage = peer_pb2.SendSyncedEntriesRequest | peer_pb2.SendViewMessageRequest


class PeerLink:
    """Sends to one peer from its own task, so that the loop never waits on a peer, on one
    long-lived ``Exchange`` stream, in order.

    Body pushes go first, then posts, then the rest. A post's metas are of no use to the
    peer until it holds their bodies (it posts nothing past the first body it lacks), and
    the peer takes the stream's messages in order, so a body pushed ahead of a post is
    held when the post is taken (with a push behind the post, the peer waited for it or,
    past ``body_fetch_delay_ms``, fetched the body itself: 1.7 fetches per transaction
    measured under batched load while pushes queued behind posts). The last pushes
    waiting when a post is due travel in the post's message (``bodies_ahead``): one
    message written and read instead of two, and the peer steps them together.

    A post's queue is encoded when it is sent, as a change to an earlier post where it
    can be (``post_deltas``): to the post sent just before it on the same stream, which
    the peer decoded and remembered before it reads this one (the stream is in order), or,
    first on a new stream, to the newest post the peer acknowledged. The stream's answers
    are those acknowledgements. Naming the newest acknowledged post instead cost twice
    the bytes: under load ten or more posts are in flight, so that post was one whose
    queue ADD had mostly consumed, and 27% of posts went whole (measured, 4 x 50 per DC).
    A peer that cannot rebuild a post answers ``whole_needed``; it never rebuilds a wrong
    queue, because (epoch, seq) names one post of one sender.

    The stream's own flow control holds the sender back when the peer reads slowly;
    meanwhile newer posts replace older ones at the same base, and the other queues are
    bounded. A stream that fails (the peer went away, refused a message) is
    opened again after a backoff; what was on its way is lost, as a lost call was (the
    core re-posts, and fetches a body it misses)."""

    def __init__(self, node_id: str, address: str, tls: TlsFiles | None) -> None:
        self.node_id = node_id
        if tls is None:
            self._channel = new_channel(address, options=PEER_CHANNEL_OPTIONS)
        else:
            # The peer's certificate must name its node id, whatever address we dial.
            self._channel = new_channel(
                address,
                tls.channel_credentials(),
                options=[*PEER_CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", node_id)],
            )
        self.stub = peer_pb2_grpc.PeerServiceStub(self._channel)
        self._posts: dict[tuple[int, str], tuple[peer_pb2.PostRequest, Post]] = {}
        """Unsent posts, the newest per merge base: a newer post at the same base replaces
        an older one, but a post from an older base still carries news (it can complete
        the peer's ADD at that base), so it is not dropped for one from a newer base.
        Each waits as its message without the queue, and the core's post."""
        self._acknowledged: Post | None = None
        """The newest of our posts this peer answered: the first reference on a stream."""
        self._reference: Post | None = None
        """The post the next one is encoded against: the last one sent on this stream."""
        self._whole_since: tuple[int, int] = (0, 0)
        """(epoch, seq) of the last post sent whole: the posts after it are encoded
        against it or its successors, whatever the peer answers about earlier ones."""
        self._unanswered: OrderedDict[tuple[int, int], tuple[peer_pb2.PostRequest, Post]] = (
            OrderedDict()
        )
        """Posts sent on the stream and not answered yet, by (epoch, seq), in the order
        sent."""
        self._other: deque[_OtherMessage] = deque(maxlen=PEER_QUEUE_MAX)
        self._bodies: deque[tuple[peer_pb2.PushBodyRequest | peer_pb2.PushBodiesRequest, int]] = (
            deque()
        )
        """Pushes to send, each with its bodies' bytes; the last PushBodies grows until
        it holds PUSH_BATCH_BYTES_MAX."""
        self._bodies_bytes = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.failed = 0
        """Streams that ended in an error."""
        self._answers = 0
        """Post answers received, over all streams (a stream that answered worked)."""
        self.outcomes_sent = 0
        """The last of our finished outcomes put on a post to this peer."""

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"to-{self.node_id}")

    def post(self, message: peer_pb2.PostRequest, post: Post) -> None:
        """Queue ``post`` (``message`` is it without its queue, with the outcomes)."""
        key = (message.base.synced_len, message.base.last_tx_id)
        replaced = self._posts.get(key)
        if replaced is not None and replaced[0].outcomes:
            # The outcomes it carried would be lost with it: the newer post takes them.
            outcomes = [*replaced[0].outcomes, *message.outcomes][-OUTCOMES_PER_POST:]
            del message.outcomes[:]
            message.outcomes.extend(outcomes)
        self._posts[key] = (message, post)
        if len(self._posts) > PENDING_POST_BASES_MAX:
            del self._posts[min(self._posts)]
        self._wakeup.set()

    def send(self, message: _OtherMessage) -> None:
        self._other.append(message)
        self._wakeup.set()

    def push(self, sender: str, push: peer_pb2.PushBodyRequest) -> None:
        """Queue a body push: into the last queued PushBodies while it holds fewer than
        BODIES_PER_CALL_MAX bodies and PUSH_BATCH_BYTES_MAX bytes, a larger body alone as
        a PushBody."""
        size = len(push.body)
        tail = self._bodies[-1] if self._bodies else None
        if (
            tail is not None
            and isinstance(tail[0], peer_pb2.PushBodiesRequest)
            and tail[1] + size <= PUSH_BATCH_BYTES_MAX
            and len(tail[0].bodies) < BODIES_PER_CALL_MAX  # what the peer takes at once
        ):
            tail[0].bodies.append(push)
            self._bodies[-1] = (tail[0], tail[1] + size)
        elif size > PUSH_BATCH_BYTES_MAX:
            push.sender = sender
            self._bodies.append((push, size))
        else:
            self._bodies.append((peer_pb2.PushBodiesRequest(sender=sender, bodies=[push]), size))
        self._bodies_bytes += size
        while self._bodies_bytes > PEER_BODY_BYTES_MAX and len(self._bodies) > 1:
            _, dropped = self._bodies.popleft()
            self._bodies_bytes -= dropped
        self._wakeup.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._channel.close()

    def _pending(self) -> bool:
        return bool(self._bodies or self._posts or self._other)

    def _next_message(self) -> peer_pb2.ExchangeRequest:
        if self._bodies:
            push, size = self._bodies.popleft()
            self._bodies_bytes -= size
            if not isinstance(push, peer_pb2.PushBodiesRequest):
                return peer_pb2.ExchangeRequest(body=push)
            if self._bodies or not self._posts:
                return peer_pb2.ExchangeRequest(bodies=push)
            # The last bodies go with the next post, which usually names them: they were
            # queued by the same step (``Coordinator._apply``).
            return peer_pb2.ExchangeRequest(post=self._next_post(), bodies_ahead=push)
        if self._posts:
            return peer_pb2.ExchangeRequest(post=self._next_post())
        other = self._other.popleft()
        if isinstance(other, peer_pb2.SendSyncedEntriesRequest):
            return peer_pb2.ExchangeRequest(synced_entries=other)
        assert isinstance(other, peer_pb2.SendViewMessageRequest)
        return peer_pb2.ExchangeRequest(view=other)

    def _next_post(self) -> peer_pb2.PostRequest:
        """The oldest base's post, its queue encoded against the last post sent."""
        message, post = self._posts.pop(min(self._posts))
        if not set_post_queue(message, post, self._reference):
            self._whole_since = (post.epoch, post.seq)
        self._reference = post
        self._unanswered[(post.epoch, post.seq)] = (message, post)
        if len(self._unanswered) > STREAM_POSTS_UNANSWERED_MAX:
            self._unanswered.popitem(last=False)
        return message

    async def _run(self) -> None:
        backoff_s = STREAM_RETRY_MIN_S
        while True:
            while not self._pending():  # a stream is opened when there is something to send
                self._wakeup.clear()
                await self._wakeup.wait()
            answered_before = self._answers
            try:
                await self._stream()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as error:
                self.failed += 1
                code = error.code().name if isinstance(error, grpc.aio.AioRpcError) else error
                log.debug("to %s: stream ended: %s", self.node_id, code)
            self._unanswered.clear()
            if self._answers != answered_before:
                backoff_s = STREAM_RETRY_MIN_S  # it worked for a while: try again at once
            else:
                # A backoff, not a poll: the peer is down or refuses us, and opening a
                # stream per message would spin.
                await asyncio.sleep(backoff_s)
                backoff_s = min(2 * backoff_s, STREAM_RETRY_MAX_S)

    async def _stream(self) -> None:
        """One stream, written until it fails: the reader's end wakes the writer."""
        # Opened outside any trace: the stream outlives whatever span was current, and
        # its messages carry their own trace context (a post its round's, a body its
        # transaction's).
        with attached(otel_context.Context()):
            call = self.stub.Exchange()
        # What was sent on an earlier stream may never have arrived.
        self._reference = self._acknowledged
        reader = asyncio.get_running_loop().create_task(self._read_answers(call))
        try:
            while not reader.done():
                if not self._pending():
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                await call.write(self._next_message())
                self.sent += 1
            await reader  # its error, if it failed
        finally:
            if reader.done() and not reader.cancelled():
                reader.exception()  # retrieved: the write's error is the one raised
            reader.cancel()
            call.cancel()

    async def _read_answers(self, call: _PeerStream) -> None:
        try:
            async for answer in call:
                self._answers += 1
                key = (answer.epoch, answer.seq)
                if key not in self._unanswered:
                    continue
                # An answer also acknowledges every post sent before its own (the peer
                # answers posts together, ``peer_service.POSTS_PER_ACK``).
                while (sent := self._unanswered.popitem(last=False))[0] != key:
                    pass
                self._posted(*sent[1], whole_needed=answer.whole_needed)
        finally:
            self._wakeup.set()  # the writer sees the stream is over

    def _posted(self, message: peer_pb2.PostRequest, post: Post, *, whole_needed: bool) -> None:
        if whole_needed:
            # The peer forgot the post ours named (or restarted): the next post goes
            # whole (unless one went whole since this one, and those after it name it),
            # and this post goes again unless a newer one at its base is waiting already.
            self._acknowledged = None
            if (post.epoch, post.seq) >= self._whole_since:
                self._reference = None
            self._posts.setdefault((message.base.synced_len, message.base.last_tx_id),
                                   (message, post))  # fmt: skip
            self._wakeup.set()
            return
        known = self._acknowledged
        if known is None or (post.epoch, post.seq) > (known.epoch, known.seq):
            self._acknowledged = post


_PeerStream = grpc.aio.StreamStreamCall[peer_pb2.ExchangeRequest, peer_pb2.ExchangeResponse]
