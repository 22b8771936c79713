"""The wire codec round-trips core values, and its decoders refuse garbage cleanly."""

from __future__ import annotations

import contextlib
import uuid

import pytest
from google.protobuf.message import DecodeError
from hypothesis import example, given, settings
from hypothesis import strategies as st

from txsync.protocol import (
    GENESIS_TX_ID,
    Ballot,
    Configuration,
    Limits,
    MergeBase,
    Post,
    SyncedEntries,
    TxMeta,
    View,
    ViewAccept,
    ViewAccepted,
    ViewInstall,
    ViewMessage,
    ViewPrepare,
    ViewPromise,
    ViewProposal,
    ViewQuery,
    ViewRefused,
)
from txsync.sync_coordinator.wire import (
    WireError,
    decode_entries,
    decode_post,
    entries_to_proto,
    post_to_proto,
    view_message_from_proto,
    view_message_to_proto,
)
from txsync.v1 import common_pb2, peer_pb2

LIMITS = Limits(post_txs_max=16, catchup_entries_max=8, synced_window_max=8)

node_ids = st.text(alphabet="abcdefghij0123456789-_.", min_size=1, max_size=12)
tx_ids = st.uuids(version=4).map(str)
counters = st.integers(0, 2**40)


@st.composite
def posts(draw: st.DrawFn) -> Post:
    ids = draw(st.lists(tx_ids, unique=True, max_size=LIMITS.post_txs_max))
    metas = sorted(TxMeta(draw(st.integers(1, 1000)), tx_id, draw(node_ids)) for tx_id in ids)
    counter = max([m.ts for m in metas], default=0) + draw(st.integers(0, 5))
    length = draw(st.integers(0, 10**6))
    last = draw(tx_ids) if length else GENESIS_TX_ID
    return Post(
        view_no=draw(counters),
        sender=draw(node_ids),
        epoch=draw(counters),
        seq=draw(counters),
        base=MergeBase(length, last),
        counter=counter,
        queue=tuple(metas),
    )


@given(posts())
def test_post_round_trips(post: Post) -> None:
    assert decode_post(post_to_proto(post).SerializeToString(), LIMITS) == post


@given(
    start=st.integers(0, 10**6),
    ids=st.lists(tx_ids, unique=True, min_size=1, max_size=LIMITS.catchup_entries_max),
)
def test_synced_entries_round_trip(start: int, ids: list[str]) -> None:
    base = MergeBase(start, str(uuid.uuid4())) if start else MergeBase.genesis()
    entries = SyncedEntries(
        3, "dc1", base, tuple(TxMeta(i + 1, t, "dc2") for i, t in enumerate(ids))
    )
    assert decode_entries(entries_to_proto(entries).SerializeToString(), LIMITS) == entries


@settings(max_examples=400)
@given(st.binary(max_size=512))
@example(b"\x0a\xff\xff\xff\xff\x0f")  # a length prefix far past the end
@example(b"\x3a\x00" * 40)  # many empty queue entries
def test_decoders_refuse_random_bytes_without_crashing(data: bytes) -> None:
    for decode in (decode_post, decode_entries):
        with contextlib.suppress(WireError):  # refusing is fine; any other exception is not
            decode(data, LIMITS)


@settings(max_examples=300)
@given(posts(), st.data())
def test_decoders_refuse_mutated_posts_without_crashing(post: Post, data: st.DataObject) -> None:
    raw = bytearray(post_to_proto(post).SerializeToString())
    if raw:
        for _ in range(data.draw(st.integers(1, 4))):
            index = data.draw(st.integers(0, len(raw) - 1))
            raw[index] = data.draw(st.integers(0, 255))
    try:
        decoded = decode_post(bytes(raw), LIMITS)
    except WireError:
        return
    # Whatever survives decoding satisfies the contract the core relies on.
    assert len(decoded.queue) <= LIMITS.post_txs_max
    assert list(decoded.queue) == sorted(set(decoded.queue))
    assert all(meta.ts <= decoded.counter for meta in decoded.queue)


def _post_message(**changes: object) -> peer_pb2.PostRequest:
    message = post_to_proto(
        Post(0, "dc2", 1, 1, MergeBase.genesis(), 5, (TxMeta(2, str(uuid.uuid4()), "dc2"),))
    )
    for field, value in changes.items():
        setattr(message, field, value)
    return message


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (_post_message(sender=""), "sender: a node id has 1 to 63 characters"),
        (_post_message(sender="dc 2"), "may hold only letters"),
        (_post_message(counter=1), "above the sender's counter"),
        (_post_message(counter=2**64 - 1), "counter: 18446744073709551615 is above"),
    ],
)
def test_bad_posts_are_named(message: peer_pb2.PostRequest, reason: str) -> None:
    with pytest.raises(WireError, match=reason):
        decode_post(message.SerializeToString(), LIMITS)


def test_bad_tx_ids_and_bases_are_named() -> None:
    message = _post_message()
    message.queue[0].tx_id = "not-a-uuid"
    with pytest.raises(WireError, match=r"queue\[0\]\.tx_id: 'not-a-uuid' is not a UUID"):
        decode_post(message.SerializeToString(), LIMITS)
    message = _post_message()
    message.queue[0].tx_id = str(uuid.uuid4()).upper()
    with pytest.raises(WireError, match="not a canonical lower-case UUID"):
        decode_post(message.SerializeToString(), LIMITS)
    message = _post_message()
    message.base.CopyFrom(common_pb2.MergeBase(synced_len=3, last_tx_id=GENESIS_TX_ID))
    with pytest.raises(WireError, match="only an empty synced queue ends at the genesis id"):
        decode_post(message.SerializeToString(), LIMITS)
    too_many = _post_message()
    too_many.queue.extend(too_many.queue[0] for _ in range(LIMITS.post_txs_max))
    with pytest.raises(WireError, match="exceed 16"):
        decode_post(too_many.SerializeToString(), LIMITS)


ballots = st.builds(Ballot, st.integers(1, 2**40), st.integers(0, 2**40), node_ids)


@st.composite
def proposals(draw: st.DrawFn) -> ViewProposal:
    members = tuple(sorted(draw(st.sets(node_ids, min_size=1, max_size=5))))
    ids = draw(st.lists(tx_ids, unique=True, max_size=LIMITS.post_txs_max))
    seal = tuple(sorted(TxMeta(draw(st.integers(1, 1000)), tx_id, members[0]) for tx_id in ids))
    length = draw(st.integers(0, 10**6))
    start = MergeBase(length, draw(tx_ids)) if length else MergeBase.genesis()
    weights = {member: draw(st.integers(1, 1000)) for member in members}
    configuration = Configuration.of(weights, draw(st.integers(0, 10**6)))
    return ViewProposal(View(draw(st.integers(1, 2**40)), members), start, seal, configuration)


@st.composite
def view_messages(draw: st.DrawFn) -> ViewMessage:
    sender = draw(node_ids)
    kind = draw(st.sampled_from(["prepare", "promise", "accept", "accepted", "install",
                                 "refused", "query"]))  # fmt: skip
    ballot = draw(ballots)
    if kind == "prepare":
        return ViewPrepare(sender, ballot)
    if kind == "promise":
        post = draw(posts())
        accepted = draw(st.none() | proposals())
        return ViewPromise(
            sender, ballot, post.base, post.counter, post.queue,
            draw(ballots) if accepted is not None else None, accepted,
        )  # fmt: skip
    if kind == "accept":
        return ViewAccept(sender, ballot, draw(proposals()))
    if kind == "accepted":
        return ViewAccepted(sender, ballot)
    if kind == "install":
        return ViewInstall(sender, draw(proposals()))
    if kind == "refused":
        return ViewRefused(sender, ballot, draw(counters), draw(st.none() | ballots))
    return ViewQuery(sender, draw(counters))


@given(view_messages())
def test_view_messages_round_trip(message: ViewMessage) -> None:
    raw = view_message_to_proto(message).SerializeToString()
    assert view_message_from_proto(peer_pb2.SendViewMessageRequest.FromString(raw), LIMITS) == (
        message
    )


@settings(max_examples=300)
@given(view_messages(), st.data())
def test_view_decoder_refuses_mutations_without_crashing(
    message: ViewMessage, data: st.DataObject
) -> None:
    raw = bytearray(view_message_to_proto(message).SerializeToString())
    for _ in range(data.draw(st.integers(1, 4))):
        index = data.draw(st.integers(0, len(raw) - 1))
        raw[index] = data.draw(st.integers(0, 255))
    with contextlib.suppress(WireError, DecodeError):
        view_message_from_proto(peer_pb2.SendViewMessageRequest.FromString(bytes(raw)), LIMITS)
