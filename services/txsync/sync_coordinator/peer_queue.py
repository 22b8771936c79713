"""What one peer DC is sent, and in what order (``PeerQueue``): the sending side of a
``PeerLink`` as a pure machine (issue 53). The link's task asks it for the next message
to write on the ``Exchange`` stream and hands it the stream's answers and ends; the
machine holds no stream, task or clock, so that tests and the simulator's network
(``sim/links.py``) run it message by message. The receiving side's answers follow
``StreamAnswers``, pure too."""

from __future__ import annotations

from collections import OrderedDict, deque

from txsync.protocol import Post
from txsync.sync_coordinator.outcomes import OUTCOMES_PER_POST
from txsync.sync_coordinator.wire import set_post_queue
from txsync.transaction_store.validation import BODIES_PER_CALL_MAX
from txsync.v1 import peer_pb2

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
STREAM_POSTS_UNANSWERED_MAX = 256
"""Posts on a peer's stream not answered yet that we remember (for their acknowledgement);
the oldest is forgotten beyond it (its answer then changes nothing)."""
PUSH_BATCH_BYTES_MAX = 3 * 1024 * 1024
"""Bodies in one PushBodies message, together: under gRPC's 4 MiB message limit."""
POSTS_PER_ACK = 16
"""Posts of a stream taken per answer: an answer acknowledges its post and every one
before it. The sender encodes each post against the one before it on the stream, so it
needs an answer only to open a new stream from a post the peer surely holds (which the
peer keeps among its last ``POSTS_KEPT_PER_PEER``); one answer per post was 3.75 of the
21 gRPC messages per transaction (16 single-submit clients per DC)."""


OtherMessage = (
    peer_pb2.SendSyncedEntriesRequest
    | peer_pb2.SendViewMessageRequest
    | peer_pb2.SnapshotNeededRequest
)


class PeerQueue:
    """What waits for one peer, and the posts on the stream it has not answered.

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

    Newer posts replace older ones at the same base while the stream is held back, and
    the other queues are bounded."""

    def __init__(self) -> None:
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
        self._other: deque[tuple[OtherMessage, bytes]] = deque()
        """Catch-up entries and view messages to send, in order, each with its bytes."""
        self._other_queued: set[bytes] = set()
        """The bytes of those: a message identical to one still waiting is not queued
        again (the core resends view messages and catch-up on timers; behind a slow
        stream, copies of one prepare filled the queue, and what the peer then read was
        stale: the simulator, window of 2 messages, seed 58 of
        delay,drop,partition,flap,crash never converged)."""
        self._bodies: deque[tuple[peer_pb2.PushBodyRequest | peer_pb2.PushBodiesRequest, int]] = (
            deque()
        )
        """Pushes to send, each with its bodies' bytes; the last PushBodies grows until
        it holds PUSH_BATCH_BYTES_MAX."""
        self._bodies_bytes = 0

    @property
    def acknowledged(self) -> Post | None:
        return self._acknowledged

    @property
    def unanswered(self) -> list[tuple[int, int]]:
        """(epoch, seq) of the posts sent on this stream and not answered, in order."""
        return list(self._unanswered)

    # --- what the coordinator hands over ---------------------------------------------------

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

    def send(self, message: OtherMessage) -> None:
        """Queue ``message`` unless an identical one waits already; beyond
        PEER_QUEUE_MAX, the oldest is dropped."""
        key = type(message).__name__.encode() + message.SerializeToString(deterministic=True)
        if key in self._other_queued:
            return
        if len(self._other) >= PEER_QUEUE_MAX:
            _, dropped = self._other.popleft()
            self._other_queued.discard(dropped)
        self._other.append((message, key))
        self._other_queued.add(key)

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

    # --- the stream ------------------------------------------------------------------------

    def pending(self) -> bool:
        return bool(self._bodies or self._posts or self._other)

    def stream_opened(self) -> None:
        """A new stream: what was sent on an earlier one may never have arrived, so the
        first post is encoded against one the peer acknowledged."""
        self._reference = self._acknowledged

    def stream_ended(self) -> None:
        """The stream failed: what was on its way is lost, as a lost call was (the core
        re-posts, and fetches a body it misses)."""
        self._unanswered.clear()

    def next_message(self) -> peer_pb2.ExchangeRequest:
        """The next message to write (``pending()`` must be true)."""
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
        other, key = self._other.popleft()
        self._other_queued.discard(key)
        if isinstance(other, peer_pb2.SendSyncedEntriesRequest):
            return peer_pb2.ExchangeRequest(synced_entries=other)
        if isinstance(other, peer_pb2.SnapshotNeededRequest):
            return peer_pb2.ExchangeRequest(snapshot_needed=other)
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

    def answered(self, answer: peer_pb2.ExchangeResponse) -> None:
        """The peer answered a post: that one and every one sent before it (the peer
        answers posts together, ``StreamAnswers``). An answer to a post
        forgotten (or from an earlier stream) changes nothing."""
        key = (answer.epoch, answer.seq)
        if key not in self._unanswered:
            return
        while (sent := self._unanswered.popitem(last=False))[0] != key:
            pass
        message, post = sent[1]
        if answer.whole_needed:
            # The peer forgot the post ours named (or restarted): the next post goes
            # whole (unless one went whole since this one, and those after it name it),
            # and this post goes again unless a newer one at its base is waiting already.
            self._acknowledged = None
            if (post.epoch, post.seq) >= self._whole_since:
                self._reference = None
            self._posts.setdefault((message.base.synced_len, message.base.last_tx_id),
                                   (message, post))  # fmt: skip
            return
        known = self._acknowledged
        if known is None or (post.epoch, post.seq) > (known.epoch, known.seq):
            self._acknowledged = post


class StreamAnswers:
    """Which posts of one ``Exchange`` stream the receiver answers: the first (so that a
    new stream soon has a reference), then one in ``POSTS_PER_ACK`` (an answer
    acknowledges every post before it too), and at once any post it could not rebuild
    (``whole_needed``: the sender posts the whole queue again)."""

    def __init__(self) -> None:
        self._unacknowledged = POSTS_PER_ACK  # the stream's first post is answered

    def took(
        self, post: peer_pb2.PostRequest, whole_needed: bool
    ) -> peer_pb2.ExchangeResponse | None:
        self._unacknowledged += 1
        if not whole_needed and self._unacknowledged < POSTS_PER_ACK:
            return None
        self._unacknowledged = 0
        return peer_pb2.ExchangeResponse(epoch=post.epoch, seq=post.seq, whole_needed=whole_needed)
