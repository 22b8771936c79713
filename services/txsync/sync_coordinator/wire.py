"""Protocol messages on the wire: posts and catch-up <-> ``txsync.v1`` peer messages
(the shared types come from ``txsync.codec``).

Decoding never trusts the peer: anything malformed raises ``WireError`` with a reason
that names the field, and the caller answers INVALID_ARGUMENT. Semantic checks (sorted
queues, counters, sizes) stay with the core's ``validation`` module, which the decoder
runs too so that a refused message is refused before it reaches the core.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from txsync.codec import (
    WireError,
    base_from_proto,
    base_to_proto,
    check_node_id,
    check_number,
    meta_from_proto,
    meta_to_proto,
    metas_from_proto,
)
from txsync.protocol import Limits, Post, SyncedEntries
from txsync.protocol.validation import post_problem, synced_entries_problem
from txsync.v1 import peer_pb2

__all__ = [  # the shared codec's names stay importable from here
    "WireError",
    "base_from_proto",
    "base_to_proto",
    "check_node_id",
    "decode_entries",
    "decode_post",
    "entries_from_proto",
    "entries_to_proto",
    "meta_from_proto",
    "meta_to_proto",
    "post_from_proto",
    "post_to_proto",
]


def post_to_proto(post: Post) -> peer_pb2.PostRequest:
    return peer_pb2.PostRequest(
        view_no=post.view_no,
        sender=post.sender,
        epoch=post.epoch,
        seq=post.seq,
        base=base_to_proto(post.base),
        counter=post.counter,
        queue=[meta_to_proto(meta) for meta in post.queue],
    )


def post_from_proto(message: peer_pb2.PostRequest, limits: Limits) -> Post:
    if len(message.queue) > limits.post_txs_max:
        raise WireError(f"queue: {len(message.queue)} metas exceed {limits.post_txs_max}")
    post = Post(
        view_no=check_number(message.view_no, "view_no"),
        sender=check_node_id(message.sender, "sender"),
        epoch=check_number(message.epoch, "epoch"),
        seq=check_number(message.seq, "seq"),
        base=base_from_proto(message.base),
        counter=check_number(message.counter, "counter"),
        queue=metas_from_proto(message.queue, "queue"),
    )
    problem = post_problem(post, limits)
    if problem is not None:
        raise WireError(problem)
    return post


def entries_to_proto(entries: SyncedEntries) -> peer_pb2.SendSyncedEntriesRequest:
    return peer_pb2.SendSyncedEntriesRequest(
        view_no=entries.view_no,
        sender=entries.sender,
        start=base_to_proto(entries.start),
        entries=[meta_to_proto(meta) for meta in entries.entries],
    )


def entries_from_proto(message: peer_pb2.SendSyncedEntriesRequest, limits: Limits) -> SyncedEntries:
    if len(message.entries) > limits.catchup_entries_max:
        raise WireError(f"entries: {len(message.entries)} exceed {limits.catchup_entries_max}")
    entries = SyncedEntries(
        view_no=check_number(message.view_no, "view_no"),
        sender=check_node_id(message.sender, "sender"),
        start=base_from_proto(message.start, "start"),
        entries=metas_from_proto(message.entries, "entries"),
    )
    problem = synced_entries_problem(entries, limits)
    if problem is not None:
        raise WireError(problem)
    return entries


def decode_post(data: bytes, limits: Limits) -> Post:
    """Parse and check a serialized ``PostRequest`` (used where raw bytes arrive)."""
    message = peer_pb2.PostRequest()
    try:
        message.ParseFromString(data)
    except DecodeError as error:
        raise WireError(f"not a PostRequest: {error}") from None
    return post_from_proto(message, limits)


def decode_entries(data: bytes, limits: Limits) -> SyncedEntries:
    """Parse and check a serialized ``SendSyncedEntriesRequest``."""
    message = peer_pb2.SendSyncedEntriesRequest()
    try:
        message.ParseFromString(data)
    except DecodeError as error:
        raise WireError(f"not a SendSyncedEntriesRequest: {error}") from None
    return entries_from_proto(message, limits)
