"""Protocol messages on the wire: ``txsync.protocol`` values <-> ``txsync.v1`` protobufs.

Decoding never trusts the peer: anything malformed raises ``WireError`` with a reason
that names the field, and the caller answers INVALID_ARGUMENT. Semantic checks (sorted
queues, counters, sizes) stay with the core's ``validation`` module, which the decoder
runs too so that a refused message is refused before it reaches the core.
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.message import DecodeError

from txsync.ids import is_genesis, tx_id_problem
from txsync.protocol import GENESIS_TX_ID, Limits, MergeBase, Post, SyncedEntries, TxMeta
from txsync.protocol.validation import post_problem, synced_entries_problem
from txsync.v1 import common_pb2, peer_pb2

NODE_ID_CHARS_MAX = 63
COUNTER_MAX = 2**63 - 1
"""Counters, timestamps and lengths travel as uint64 but stay within int64 everywhere."""


class WireError(ValueError):
    """A message from a peer that cannot be decoded or breaks the contract."""


def _check_tx_id(tx_id: str, field: str) -> str:
    problem = None if is_genesis(tx_id) else tx_id_problem(tx_id, field)
    if problem is not None:
        raise WireError(problem)
    return tx_id


def check_node_id(node_id: str, field: str) -> str:
    if not node_id or len(node_id) > NODE_ID_CHARS_MAX:
        raise WireError(f"{field}: a node id has 1 to {NODE_ID_CHARS_MAX} characters")
    if not all(ch.isascii() and (ch.isalnum() or ch in "-_.") for ch in node_id):
        raise WireError(f"{field}: {node_id!r} may hold only letters, digits, '-', '_' and '.'")
    return node_id


def _check_number(value: int, field: str) -> int:
    if value > COUNTER_MAX:
        raise WireError(f"{field}: {value} is above {COUNTER_MAX}")
    return value


def meta_to_proto(meta: TxMeta) -> common_pb2.TxMeta:
    return common_pb2.TxMeta(ts=meta.ts, tx_id=meta.tx_id, origin=meta.origin)


def meta_from_proto(message: common_pb2.TxMeta, field: str = "meta") -> TxMeta:
    return TxMeta(
        ts=_check_number(message.ts, f"{field}.ts"),
        tx_id=_check_tx_id(message.tx_id, f"{field}.tx_id"),
        origin=check_node_id(message.origin, f"{field}.origin"),
    )


def _metas_from_proto(messages: Iterable[common_pb2.TxMeta], field: str) -> tuple[TxMeta, ...]:
    return tuple(meta_from_proto(m, f"{field}[{i}]") for i, m in enumerate(messages))


def base_to_proto(base: MergeBase) -> common_pb2.MergeBase:
    return common_pb2.MergeBase(synced_len=base.synced_len, last_tx_id=base.last_tx_id)


def base_from_proto(message: common_pb2.MergeBase, field: str = "base") -> MergeBase:
    length = _check_number(message.synced_len, f"{field}.synced_len")
    last = _check_tx_id(message.last_tx_id or GENESIS_TX_ID, f"{field}.last_tx_id")
    if (length == 0) != (last == GENESIS_TX_ID):
        raise WireError(f"{field}: only an empty synced queue ends at the genesis id")
    return MergeBase(length, last)


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
        view_no=_check_number(message.view_no, "view_no"),
        sender=check_node_id(message.sender, "sender"),
        epoch=_check_number(message.epoch, "epoch"),
        seq=_check_number(message.seq, "seq"),
        base=base_from_proto(message.base),
        counter=_check_number(message.counter, "counter"),
        queue=_metas_from_proto(message.queue, "queue"),
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
        view_no=_check_number(message.view_no, "view_no"),
        sender=check_node_id(message.sender, "sender"),
        start=base_from_proto(message.start, "start"),
        entries=_metas_from_proto(message.entries, "entries"),
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
