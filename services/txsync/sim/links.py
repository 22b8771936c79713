"""The simulated peer links: what each node sends its peers goes through the
coordinator's own ``PeerQueue`` (bodies ahead of posts, the newest post per base, posts
as deltas against the last one sent, bounded queues, acknowledgements) and is written on
a simulated ``Exchange`` stream, as ``PeerLink`` writes it; the receiver rebuilds each
post with the production decoder (``post_from_proto`` over its ``KnownPosts``) and
answers as ``PeerServicer.Exchange`` does (``StreamAnswers``).

A stream is what TCP and HTTP/2 give: its messages arrive once and in order, and at
most a window of them is unread (flow control: meanwhile the queue takes newer posts and
drops the oldest of the rest). Faults end a stream instead of touching one message: a
message lost on the way (``drop``), a link cut (``partition``, ``flap``: a message needs
its direction open, an answer the other) or either end crashing. What was on its way is
lost with it; the sender opens a new stream after a backoff, as ``PeerLink._run`` does,
and the core re-posts. A crashed sender's queues are gone with its coordinator, and so
are the posts a crashed receiver had kept to rebuild deltas against. (A simplification:
what a crashed sender had written is lost with it, where TCP may still deliver what left
before the reset; the one-by-one network, below, delivers such messages.)

Mixes with ``duplicate`` or ``reorder`` hold the core to a worse network than streams
give, and deliver the core's messages one by one (``Simulation``): this module runs in
every other mix.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from txsync.protocol import Limits, NodeId, Post, SyncedEntries, TxId
from txsync.protocol.model import Message, ViewMessage
from txsync.sim.invariants import InvariantViolation
from txsync.sync_coordinator.peer_queue import PeerQueue, StreamAnswers
from txsync.sync_coordinator.post_deltas import KnownPosts
from txsync.sync_coordinator.wire import (
    UnknownReference,
    WireError,
    entries_from_proto,
    entries_to_proto,
    post_from_proto,
    post_to_proto,
    view_message_from_proto,
    view_message_to_proto,
)
from txsync.v1 import peer_pb2

QueueFactory = Callable[[], PeerQueue]

STREAM_WINDOWS = (2, 16, 128)
"""Messages of one stream written and not read yet (drawn per seed): 2 holds the queue
back at nearly every message, so that newer posts replace older ones and pushes merge
(with 1, the core's timed resends outran links of 5-80 ms, which HTTP/2's window of
64 KiB never does)."""
STREAM_RETRY_MS = (5, 200)
"""Backoff before a stream is opened again after one that never answered ended:
doubling from the least to the most (``PeerLink``'s 50 ms to 2 s, at the simulator's
shorter timings)."""


@dataclass(frozen=True, slots=True)
class StreamMessage:
    """A message written on the stream ``stream`` of (sender, to) arrives."""

    sender: NodeId
    to: NodeId
    stream: int
    message: peer_pb2.ExchangeRequest


@dataclass(frozen=True, slots=True)
class StreamAnswer:
    """The receiver's answer on the stream ``stream`` of (sender, to) arrives back."""

    sender: NodeId
    to: NodeId
    stream: int
    answer: peer_pb2.ExchangeResponse


@dataclass(frozen=True, slots=True)
class StreamReopen:
    """The backoff after a stream of (sender, to) ended is over."""

    sender: NodeId
    to: NodeId
    stream: int


StreamEvent = StreamMessage | StreamAnswer | StreamReopen


@dataclass(slots=True)
class _Link:
    """One direction: the sender's queue for its peer and the stream it writes on."""

    queue: PeerQueue
    stream: int = 0
    """The stream's number: anything on its way carries it, and a newer one voids it."""
    open: bool = False
    reopen_due: bool = False
    """Ended, and waiting out its backoff."""
    unread: int = 0
    answered: bool = False
    """The open stream answered at least once (it worked: the next retry is prompt)."""
    backoff_ms: int = STREAM_RETRY_MS[0]
    answers: StreamAnswers = field(default_factory=StreamAnswers)
    """The receiver's side of the open stream."""


class SimLinks:
    """Every node's links to every other, driven by the simulation's clock and random
    source. ``deliver`` steps a receiver's core with a peer's message, ``body`` hands it
    a pushed body; ``arrival`` draws when something sent on (sender, to) arrives (the
    simulation's delays, in order on each link); ``queue_factory`` builds each link's
    queue (tests/sim: a broken one)."""

    def __init__(
        self,
        ids: tuple[NodeId, ...],
        limits: Limits,
        *,
        rng: random.Random,
        now: Callable[[], int],
        at: Callable[[int, StreamEvent], None],
        arrival: Callable[[NodeId, NodeId], int],
        up: Callable[[NodeId], bool],
        linked: Callable[[NodeId, NodeId], bool],
        deliver: Callable[[NodeId, NodeId, Message], None],
        body: Callable[[NodeId, NodeId, TxId], None],
        drop_p: float,
        queue_factory: QueueFactory = PeerQueue,
    ) -> None:
        self._limits = limits
        self._rng = rng
        self._now = now
        self._at = at
        self._arrival = arrival
        self._up = up
        self._linked = linked
        self._deliver = deliver
        self._body = body
        self._drop_p = drop_p
        self._window = rng.choice(STREAM_WINDOWS)
        self._queue_factory = queue_factory
        self._links = {(a, b): _Link(queue_factory()) for a in ids for b in ids if a != b}
        self._known = {node: KnownPosts() for node in ids}
        self.faults_on = True
        self.messages = 0
        """Messages written on streams."""
        self.lost = 0
        """Of those, lost with the stream they were on."""
        self.ended = 0
        """Streams that ended."""
        self.whole_needed = 0
        """Posts a receiver could not rebuild (the sender posted them whole again)."""

    # --- what a node's coordinator hands its links ----------------------------------------

    def post(self, sender: NodeId, to: NodeId, post: Post) -> None:
        self._links[sender, to].queue.post(post_to_proto(post, with_queue=False), post)
        self._pump(sender, to)

    def send(self, sender: NodeId, to: NodeId, message: SyncedEntries | ViewMessage) -> None:
        link = self._links[sender, to]
        if isinstance(message, SyncedEntries):
            link.queue.send(entries_to_proto(message))
        else:
            link.queue.send(view_message_to_proto(message))
        self._pump(sender, to)

    def push(self, sender: NodeId, peers: tuple[NodeId, ...], tx_id: TxId) -> None:
        for to in peers:
            self._links[sender, to].queue.push(sender, peer_pb2.PushBodyRequest(tx_id=tx_id))
            self._pump(sender, to)

    def crashed(self, node: NodeId) -> None:
        """Its coordinator's queues and the posts it kept are gone; every stream to or
        from it ends (the connection resets)."""
        self._known[node] = KnownPosts()
        for (sender, to), link in self._links.items():
            if sender == node:
                self._links[sender, to] = _Link(self._queue_factory(), stream=link.stream + 1)
            elif to == node:
                self._end(sender, to)

    # --- the streams -----------------------------------------------------------------------

    def handle(self, event: StreamEvent) -> None:
        link = self._links[event.sender, event.to]
        if event.stream != link.stream:
            return  # on a stream that has ended
        match event:
            case StreamReopen(sender, to):
                link.reopen_due = False
                self._pump(sender, to)
            case StreamMessage(sender, to, _, message):
                lost = self.faults_on and self._drop_p and self._rng.random() < self._drop_p
                if not self._up(to) or not self._linked(sender, to) or lost:
                    self._end(sender, to)
                    return
                link.unread -= 1
                answer = self._take(sender, to, link, message)
                if answer is not None:
                    self._at(
                        self._arrival(to, sender), StreamAnswer(sender, to, link.stream, answer)
                    )
                if link.stream == event.stream:
                    self._pump(sender, to)
            case StreamAnswer(sender, to, _, answer):
                if not self._linked(to, sender):
                    self._end(sender, to)
                    return
                link.answered = True
                link.queue.answered(answer)
                self._pump(sender, to)

    def _pump(self, sender: NodeId, to: NodeId) -> None:
        """Write what the queue has next while the window allows (a stream is opened
        when there is something to send, and not during a backoff)."""
        link = self._links[sender, to]
        if not self._up(sender) or link.reopen_due:
            return
        while link.queue.pending() and link.unread < self._window:
            if not link.open:
                link.open, link.answered, link.answers = True, False, StreamAnswers()
                link.queue.stream_opened()
            message = link.queue.next_message()
            link.unread += 1
            self.messages += 1
            self._at(self._arrival(sender, to), StreamMessage(sender, to, link.stream, message))

    def _end(self, sender: NodeId, to: NodeId) -> None:
        """The stream failed: what was on it is lost, and a new one is opened after a
        backoff, the shortest if this one answered (``PeerLink`` then retries at once)."""
        link = self._links[sender, to]
        if not link.open:
            return
        self.ended += 1
        self.lost += link.unread
        link.queue.stream_ended()
        link.stream += 1
        link.open, link.unread, link.reopen_due = False, 0, True
        if link.answered:
            link.backoff_ms = STREAM_RETRY_MS[0]
        self._at(self._now() + link.backoff_ms, StreamReopen(sender, to, link.stream))
        if not link.answered:
            link.backoff_ms = min(2 * link.backoff_ms, STREAM_RETRY_MS[1])

    def _take(
        self, sender: NodeId, to: NodeId, link: _Link, message: peer_pb2.ExchangeRequest
    ) -> peer_pb2.ExchangeResponse | None:
        """What ``PeerServicer.Exchange`` does with one message: bodies ahead first, then
        the message's own kind; a post it cannot rebuild is answered ``whole_needed``."""
        if message.HasField("bodies_ahead"):
            for pushed in message.bodies_ahead.bodies:
                self._body(to, sender, pushed.tx_id)
        try:
            match message.WhichOneof("message"):
                case "post":
                    try:
                        post = post_from_proto(message.post, self._limits, self._known[to])
                    except UnknownReference:
                        self.whole_needed += 1
                        return link.answers.took(message.post, True)
                    self._known[to].remember(post.sender, post.epoch, post.seq, post.queue)
                    self._deliver(to, sender, post)
                    return link.answers.took(message.post, False)
                case "bodies":
                    for pushed in message.bodies.bodies:
                        self._body(to, sender, pushed.tx_id)
                case "body":
                    self._body(to, sender, message.body.tx_id)
                case "synced_entries":
                    entries = entries_from_proto(message.synced_entries, self._limits)
                    self._deliver(to, sender, entries)
                case "view":
                    self._deliver(to, sender, view_message_from_proto(message.view, self._limits))
        except WireError as error:
            raise InvariantViolation(0, f"{to} refused a message from {sender}: {error}") from error
        return None
