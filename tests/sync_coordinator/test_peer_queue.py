"""What ``PeerQueue`` sends one peer: body pushes merged into as few messages as the
peer takes, in order, bounded in bytes; posts encoded as changes to the post sent before
them; answers acknowledging posts; a resend not queued twice; and the receiver's
answers (``StreamAnswers``). Pure machines: no stream, task or peer needed (one test
reads answers through a ``PeerLink`` that is never started)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from txsync.protocol import MergeBase, Post, TxMeta
from txsync.sync_coordinator import peer_queue
from txsync.sync_coordinator.peer_link import PeerLink
from txsync.sync_coordinator.peer_queue import (
    PEER_QUEUE_MAX,
    POSTS_PER_ACK,
    PUSH_BATCH_BYTES_MAX,
    PeerQueue,
    StreamAnswers,
)
from txsync.sync_coordinator.wire import post_to_proto
from txsync.transaction_store.validation import BODIES_PER_CALL_MAX
from txsync.v1 import peer_pb2


def _push(n: int, size: int = 100) -> peer_pb2.PushBodyRequest:
    return peer_pb2.PushBodyRequest(tx_id=f"tx-{n}", body=bytes(size))


def _drain(queue: PeerQueue) -> list[peer_pb2.ExchangeRequest]:
    sent = []
    while queue.pending():
        sent.append(queue.next_message())
    return sent


def test_pushes_are_merged_into_as_few_messages_as_the_peer_takes() -> None:
    queue = PeerQueue()
    for n in range(1_000):  # one small push per step, as under batched load
        queue.push("dc1", _push(n))
    messages = _drain(queue)
    batches = [m.bodies for m in messages]
    assert all(m.WhichOneof("message") == "bodies" for m in messages)
    assert [len(b.bodies) for b in batches] == [256, 256, 256, 232]
    assert [p.tx_id for b in batches for p in b.bodies] == [f"tx-{n}" for n in range(1_000)]
    assert all(b.sender == "dc1" for b in batches)
    assert BODIES_PER_CALL_MAX == 256


def test_a_body_too_large_to_share_a_message_goes_alone() -> None:
    queue = PeerQueue()
    queue.push("dc1", _push(1))
    queue.push("dc1", _push(2, PUSH_BATCH_BYTES_MAX + 1))
    queue.push("dc1", _push(3))
    messages = _drain(queue)
    kinds = [m.WhichOneof("message") for m in messages]
    assert kinds == ["bodies", "body", "bodies"]
    assert messages[1].body.sender == "dc1" and messages[1].body.tx_id == "tx-2"


def test_the_last_pushes_before_a_post_travel_in_its_message() -> None:
    """A step's pushes and post share one message; earlier full pushes go alone, ahead."""

    queue = PeerQueue()
    for n in range(300):  # one full PushBodies (256) and 44 more
        queue.push("dc1", _push(n))
    post = _post(1, 0, 300)
    queue.post(post_to_proto(post, with_queue=False), post)
    queue.push("dc1", _push(300))  # alone, no post behind it
    first, second = _drain(queue)
    assert first.WhichOneof("message") == "bodies" and not first.HasField("bodies_ahead")
    assert len(first.bodies.bodies) == 256
    assert second.WhichOneof("message") == "post" and second.post.seq == 1
    assert [p.tx_id for p in second.bodies_ahead.bodies] == [f"tx-{n}" for n in range(256, 301)]
    assert second.bodies_ahead.sender == "dc1"
    queue = PeerQueue()
    queue.push("dc1", _push(1))
    (alone,) = _drain(queue)
    assert alone.WhichOneof("message") == "bodies"


def test_pushes_waiting_past_the_byte_bound_drop_the_oldest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(peer_queue, "PEER_BODY_BYTES_MAX", 16 * 1024 * 1024)
    queue = PeerQueue()
    for n in range(40):  # 40 MiB against a bound of 16 MiB
        queue.push("dc1", _push(n, 1024 * 1024))
    kept = [p.tx_id for m in _drain(queue) for p in m.bodies.bodies]
    assert kept == [f"tx-{n}" for n in range(24, 40)]


def _post(seq: int, first: int, last: int) -> Post:
    queue = tuple(TxMeta(n, f"00000000-0000-4000-8000-{n:012d}", "dc1") for n in range(first, last))
    return Post(1, "dc1", 7, seq, MergeBase.genesis(), last, queue)


def _send(queue: PeerQueue, post: Post) -> peer_pb2.PostRequest:
    queue.post(post_to_proto(post, with_queue=False), post)
    (message,) = _drain(queue)
    return message.post


def test_each_post_is_sent_as_a_change_to_the_one_sent_before_it() -> None:
    """Under load many posts are on the stream unanswered; naming the newest answered one
    sent most of each queue again (ADD had consumed that post's queue)."""

    queue = PeerQueue()
    first = _send(queue, _post(1, 0, 100))
    assert first.delta_from_seq == 0 and len(first.queue) == 100  # nothing to name yet
    for seq in range(2, 12):  # none answered: each names the one before
        sent = _send(queue, _post(seq, 10 * (seq - 1), 100 + 10 * (seq - 1)))
        assert sent.delta_from_seq == seq - 1
        assert (sent.delta_skip, sent.delta_keep, len(sent.queue)) == (10, 90, 10)


def test_after_whole_needed_one_post_goes_whole_and_the_next_ones_name_it() -> None:
    queue = PeerQueue()
    posts = [_post(seq, seq, seq + 50) for seq in range(1, 8)]
    for post in posts[:4]:
        _send(queue, post)
    # The peer had forgotten post 1: it refuses 2 (which named 1).
    queue.answered(peer_pb2.ExchangeResponse(epoch=7, seq=2, whole_needed=True))
    assert _drain(queue)[0].post.delta_from_seq == 0  # 2 again, whole
    after = _send(queue, posts[4])
    assert after.delta_from_seq == 2
    # The answers for 3 and 4 (which named 2 and 3, sent before 2 went whole) come
    # later: they do not make 5's successors go whole again.
    queue.answered(peer_pb2.ExchangeResponse(epoch=7, seq=3, whole_needed=True))
    queue.answered(peer_pb2.ExchangeResponse(epoch=7, seq=4, whole_needed=True))
    _drain(queue)  # 3 again (one post waits per base: all of these share one)
    assert _send(queue, posts[5]).delta_from_seq == 3


def test_an_answer_acknowledges_every_post_sent_before_it() -> None:
    async def scenario() -> None:
        link = PeerLink("dc2", "127.0.0.1:9", None)
        posts = [_post(seq, seq, seq + 50) for seq in range(1, 6)]
        for post in posts:
            _send(link.queue, post)

        async def answers() -> AsyncIterator[peer_pb2.ExchangeResponse]:
            yield peer_pb2.ExchangeResponse(epoch=7, seq=4)

        await link._read_answers(answers())  # type: ignore[arg-type]
        assert link.queue.acknowledged == posts[3]
        assert link.queue.unanswered == [(7, 5)]
        await link.close()

    asyncio.run(scenario())


def _prepare(view_no: int) -> peer_pb2.SendViewMessageRequest:
    request = peer_pb2.SendViewMessageRequest(sender="dc1")
    request.prepare.view_no = view_no
    return request


def test_a_message_identical_to_one_waiting_is_not_queued_again() -> None:
    """The core resends view messages on a timer: behind a slow stream the copies filled
    the queue and the peer read stale ones (the simulator's seed 58)."""
    queue = PeerQueue()
    for _ in range(50):
        queue.send(_prepare(3))
    queue.send(_prepare(4))
    queue.send(_prepare(3))  # still waiting: not again
    sent = [m.view.prepare.view_no for m in _drain(queue)]
    assert sent == [3, 4]
    queue.send(_prepare(3))  # sent already: a resend goes again
    assert [m.view.prepare.view_no for m in _drain(queue)] == [3]


def test_beyond_the_bound_the_oldest_message_is_dropped() -> None:
    queue = PeerQueue()
    for view_no in range(PEER_QUEUE_MAX + 5):
        queue.send(_prepare(view_no))
    sent = [m.view.prepare.view_no for m in _drain(queue)]
    assert sent == list(range(5, PEER_QUEUE_MAX + 5))
    queue.send(_prepare(0))  # the dropped one is not held as waiting
    assert [m.view.prepare.view_no for m in _drain(queue)] == [0]


def test_a_receiver_answers_a_streams_first_post_every_nth_and_each_whole_needed() -> None:
    answers = StreamAnswers()
    posts = [post_to_proto(_post(seq, seq, seq + 50)) for seq in range(1, 2 * POSTS_PER_ACK + 6)]
    answered = [
        (answer.seq, answer.whole_needed)
        for index, post in enumerate(posts)
        if (answer := answers.took(post, whole_needed=index == 3)) is not None
    ]
    assert answered == [
        (1, False),
        (4, True),
        (4 + POSTS_PER_ACK, False),
        (4 + 2 * POSTS_PER_ACK, False),
    ]
