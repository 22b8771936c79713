"""Posts on the wire as changes to an earlier post (transport only: the core sees whole posts).

Every post carries the sender's whole postable queue (PROTOCOL.md §2), and a node re-posts
whenever it learns something, so a long queue crossed the WAN again and again: bytes per
round grew with the queue (254 KB per round at a queue of 367, measured), and so did the
CPU of encoding and decoding every meta of every post.

Between two posts of one sender the queue changes little: ADD drops a prefix, MERGE and
local submits add metas, mostly at the end. So a post may name an earlier post of the same
sender and epoch that the receiver holds, and carry only ``(skip, keep, tail)``: the queue
is ``reference[skip : skip + keep] + tail``. The sender names the post it sent just before
on the same ordered stream (the receiver decoded and remembered that one first), or, first
on a new stream, one the receiver acknowledged. If the receiver does not hold the named
post (evicted, refused, or it restarted) it answers ``whole_needed`` and the sender posts
whole again. (epoch, seq) names one post of one sender, so lost, duplicated or reordered
messages can cost a whole post but never make a receiver rebuild a queue the sender never
posted.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict

from txsync.protocol import MEMBERS_MAX, NodeId, TxMeta

POSTS_KEPT_PER_PEER = 64
"""Decoded posts a receiver keeps per sender as references: enough that the newest one it
acknowledged is still here when a new stream names it."""


def delta_of(reference: tuple[TxMeta, ...], queue: tuple[TxMeta, ...]) -> tuple[int, int] | None:
    """``(skip, keep)`` with ``queue[:keep] == reference[skip : skip + keep]``, keeping as
    much as possible, or None if ``queue`` starts with nothing of ``reference`` (then the
    post goes whole). Both queues are strictly sorted."""
    if not queue or not reference:
        return None
    skip = bisect_left(reference, queue[0])
    overlap = min(len(reference) - skip, len(queue))
    if overlap == 0 or reference[skip] != queue[0]:
        return None
    # Slices compare in C, element by element, identical objects first (the core hands
    # out the same TxMeta objects post after post).
    if reference[skip : skip + overlap] == queue[:overlap]:
        return skip, overlap
    low, high = 1, overlap - 1  # the first one matches, all of them do not
    while low < high:
        middle = (low + high + 1) // 2
        if reference[skip : skip + middle] == queue[:middle]:
            low = middle
        else:
            high = middle - 1
    return skip, low


class KnownPosts:
    """The queues of the latest posts received from each peer, by (epoch, seq)."""

    def __init__(self, kept_per_peer: int = POSTS_KEPT_PER_PEER) -> None:
        assert kept_per_peer > 0
        self._kept_per_peer = kept_per_peer
        self._by_peer: dict[NodeId, OrderedDict[tuple[int, int], tuple[TxMeta, ...]]] = {}

    def remember(self, sender: NodeId, epoch: int, seq: int, queue: tuple[TxMeta, ...]) -> None:
        posts = self._by_peer.get(sender)
        if posts is None:
            if len(self._by_peer) >= 4 * MEMBERS_MAX:  # configured peers only, in practice
                self._by_peer.pop(next(iter(self._by_peer)))
            posts = self._by_peer[sender] = OrderedDict()
        posts[(epoch, seq)] = queue
        posts.move_to_end((epoch, seq))
        while len(posts) > self._kept_per_peer:
            posts.popitem(last=False)

    def queue_of(self, sender: NodeId, epoch: int, seq: int) -> tuple[TxMeta, ...] | None:
        posts = self._by_peer.get(sender)
        return None if posts is None else posts.get((epoch, seq))
