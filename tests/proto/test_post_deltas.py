"""Posts sent as changes to an acknowledged post (``post_deltas``) rebuild exactly the
queue the sender posted, whatever the two queues hold; a receiver that lacks the named
post takes nothing; a change that does not fit its reference is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txsync.codec import MetaInterner
from txsync.protocol import Limits, MergeBase, Post, TxMeta
from txsync.sync_coordinator.post_deltas import KnownPosts, delta_of
from txsync.sync_coordinator.wire import (
    UnknownReference,
    WireError,
    post_from_proto,
    post_to_proto,
    set_post_queue,
)
from txsync.v1 import peer_pb2

LIMITS = Limits(post_txs_max=64)
SENDER = "dc2"


def _meta(n: int) -> TxMeta:
    return TxMeta(1 + n // 3, f"00000000-0000-4000-8000-{n:012d}", "dc1")


@st.composite
def two_queues(draw: st.DrawFn) -> tuple[tuple[TxMeta, ...], tuple[TxMeta, ...]]:
    """An earlier queue and a later one as the core makes them: some head dropped (ADD),
    metas merged anywhere, new ones at the end; or anything at all."""
    pool = sorted(_meta(n) for n in range(80))
    earlier = sorted(draw(st.sets(st.sampled_from(pool), max_size=40)))
    if draw(st.booleans()):
        dropped = draw(st.integers(0, len(earlier)))
        merged = draw(st.sets(st.sampled_from(pool), max_size=20))
        later = sorted(set(earlier[dropped:]) | merged)[: LIMITS.post_txs_max]
    else:
        later = sorted(draw(st.sets(st.sampled_from(pool), max_size=40)))
    return tuple(earlier), tuple(later)


def _post(seq: int, queue: tuple[TxMeta, ...]) -> Post:
    counter = max([meta.ts for meta in queue], default=0)
    return Post(1, SENDER, 7, seq, MergeBase.genesis(), counter, queue)


@given(two_queues())
def test_a_change_rebuilds_exactly_the_posted_queue(
    queues: tuple[tuple[TxMeta, ...], tuple[TxMeta, ...]],
) -> None:
    earlier, later = queues
    acknowledged, post = _post(3, earlier), _post(9, later)
    message = post_to_proto(post, with_queue=False)
    set_post_queue(message, post, acknowledged)
    known = KnownPosts()
    known.remember(SENDER, acknowledged.epoch, acknowledged.seq, earlier)
    assert post_from_proto(message, LIMITS, known) == post
    delta = delta_of(earlier, later)
    if delta is None:
        assert message.delta_from_seq == 0 and len(message.queue) == len(later)
    else:
        skip, keep = delta
        assert later[:keep] == earlier[skip : skip + keep] and keep > 0
        assert len(message.queue) == len(later) - keep  # only the rest travels
        # The most it could keep: one more would not match.
        assert (
            keep == len(later)
            or skip + keep == len(earlier)
            or (later[keep] != earlier[skip + keep])
        )


def test_a_long_queue_travels_as_its_new_end() -> None:
    earlier = tuple(_meta(n) for n in range(60))
    later = (*earlier[10:], *(_meta(n) for n in range(60, 64)))  # 10 added, 4 new
    post = _post(2, later)
    message = post_to_proto(post, with_queue=False)
    set_post_queue(message, post, _post(1, earlier))
    assert (message.delta_from_seq, message.delta_skip, message.delta_keep) == (1, 10, 50)
    assert len(message.queue) == 4 and message.queue_len == 54


def test_a_receiver_without_the_named_post_takes_nothing() -> None:
    earlier = tuple(_meta(n) for n in range(5))
    post = _post(2, (*earlier, _meta(5)))
    message = post_to_proto(post, with_queue=False)
    set_post_queue(message, post, _post(1, earlier))
    with pytest.raises(UnknownReference):
        post_from_proto(message, LIMITS, KnownPosts())  # restarted: knows nothing
    other_epoch = KnownPosts()
    other_epoch.remember(SENDER, 6, 1, earlier)  # the same seq of an earlier incarnation
    with pytest.raises(UnknownReference):
        post_from_proto(message, LIMITS, other_epoch)


def test_a_change_that_does_not_fit_its_reference_is_refused() -> None:
    earlier = tuple(_meta(n) for n in range(5))
    post = _post(2, (*earlier, _meta(5)))
    known = KnownPosts()
    known.remember(SENDER, 7, 1, earlier)
    message = post_to_proto(post, with_queue=False)
    set_post_queue(message, post, _post(1, earlier))
    beyond = peer_pb2.PostRequest()
    beyond.CopyFrom(message)
    beyond.delta_keep = 6  # more entries than the reference holds
    with pytest.raises(WireError, match="delta"):
        post_from_proto(beyond, LIMITS, known)
    miscounted = peer_pb2.PostRequest()
    miscounted.CopyFrom(message)
    miscounted.queue_len = 7
    with pytest.raises(WireError, match="queue_len"):
        post_from_proto(miscounted, LIMITS, known)
    # What is rebuilt is checked whole, as any post: a tail that breaks the order fails.
    unsorted = peer_pb2.PostRequest()
    unsorted.CopyFrom(message)
    del unsorted.queue[:]
    unsorted.queue.add(ts=_meta(2).ts, tx_id=_meta(2).tx_id, origin="dc1")
    with pytest.raises(WireError, match="not strictly sorted"):
        post_from_proto(unsorted, LIMITS, known)


def test_known_posts_keep_the_latest_per_peer() -> None:
    known = KnownPosts(kept_per_peer=3)
    for seq in range(1, 6):
        known.remember(SENDER, 1, seq, (_meta(seq),))
    assert known.queue_of(SENDER, 1, 2) is None
    assert known.queue_of(SENDER, 1, 5) == (_meta(5),)
    assert known.queue_of("dc3", 1, 5) is None


def test_a_meta_decoded_from_two_posts_is_one_object() -> None:
    """Each DC posts the others' metas too: decoded through the coordinator's interner,
    a meta held by many posts costs one object, not one per post (issue 47)."""
    queue = tuple(_meta(n) for n in range(10))
    interner = MetaInterner()
    first = post_from_proto(post_to_proto(_post(1, queue)), LIMITS, None, interner)
    from_another = post_to_proto(Post(1, "dc3", 4, 1, MergeBase.genesis(), 4, queue[5:]))
    second = post_from_proto(from_another, LIMITS, None, interner)
    assert first.queue == queue and second.queue == queue[5:]
    assert all(a is b for a, b in zip(first.queue[5:], second.queue, strict=True))
    assert len({id(meta.origin) for meta in first.queue}) == 1  # the node id interned
    without = post_from_proto(from_another, LIMITS)
    assert without.queue == second.queue and without.queue[0] is not second.queue[0]


def test_the_interner_is_bounded_and_never_answers_another_meta() -> None:
    interner = MetaInterner(kept=8)
    metas = [interner.meta(m.ts, m.tx_id, m.origin) for m in map(_meta, range(100))]
    assert len(interner) <= 8
    again = _meta(99)
    assert interner.meta(again.ts, again.tx_id, again.origin) is metas[99]  # recent: held
    old = _meta(0)
    assert interner.meta(old.ts, old.tx_id, old.origin) is not metas[0]  # evicted: anew
    # The same id with another stamp (a stamp voided and made anew) is its own meta.
    restamped = interner.meta(again.ts + 1, again.tx_id, again.origin)
    assert restamped == TxMeta(again.ts + 1, again.tx_id, again.origin)
    assert interner.meta(again.ts + 1, again.tx_id, again.origin) is restamped
