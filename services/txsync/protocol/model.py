"""The protocol's nouns: transaction metas, merge bases, posts and transaction states.

Everything here is an immutable value. Messages between nodes are built from these
values; the wire encoding (protobuf) lives in the services, not here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

GENESIS_TX_ID = "00000000-0000-0000-0000-000000000000"
"""Merge base id of an empty synced queue (no real transaction id is all zeros)."""

NodeId = str
TxId = str


@dataclass(frozen=True, slots=True, order=True)
class TxMeta:
    """What the protocol knows of a transaction: ``(ts, tx_id, origin)``.

    Field order is the sort order of incoming queues: by timestamp, then by id. Ids are
    globally unique, so ``origin`` never decides a comparison.
    """

    ts: int
    tx_id: TxId
    origin: NodeId


@dataclass(frozen=True, slots=True)
class MergeBase:
    """The end of a synced queue: its length and the id of its last entry."""

    synced_len: int
    last_tx_id: TxId

    @staticmethod
    def genesis() -> MergeBase:
        return MergeBase(0, GENESIS_TX_ID)

    def __str__(self) -> str:
        return f"{self.synced_len}/{self.last_tx_id}"


@dataclass(frozen=True, slots=True)
class Post:
    """A round's POST: one snapshot of the sender's counter and postable incoming queue.

    ``(epoch, seq)`` orders one sender's posts: ``epoch`` is the sender's durable
    incarnation number (raised at every start), ``seq`` counts posts within it. A receiver
    keeps only the newest post of each sender.
    """

    view_no: int
    sender: NodeId
    epoch: int
    seq: int
    base: MergeBase
    counter: int
    queue: tuple[TxMeta, ...]

    def is_newer_than(self, other: Post) -> bool:
        return (self.epoch, self.seq) > (other.epoch, other.seq)


@dataclass(frozen=True, slots=True)
class SyncedEntries:
    """Catch-up from a forerunner: synced entries that extend ``start`` (the lagger's base)."""

    view_no: int
    sender: NodeId
    start: MergeBase
    entries: tuple[TxMeta, ...]


Message = Post | SyncedEntries


class TxState(enum.IntEnum):
    """A transaction's lifecycle at one node. Values only ever increase (PROTOCOL.md §4.6).

    INCOMING: the node knows the meta; the body is being distributed.
    ACCEPTED: the order is agreed: the tx is in this node's synced queue.
    ENQUEUED: accepted and the body is held locally: ready for this DC's workers.
    TESTING:  the DC's testing worker is running it.
    OK / FAILED: the outcome.
    """

    INCOMING = 1
    ACCEPTED = 2
    ENQUEUED = 3
    TESTING = 4
    OK = 5
    FAILED = 6


ALLOWED_TRANSITIONS: dict[TxState | None, frozenset[TxState]] = {
    None: frozenset({TxState.INCOMING}),
    TxState.INCOMING: frozenset({TxState.ACCEPTED}),
    TxState.ACCEPTED: frozenset({TxState.ENQUEUED}),
    TxState.ENQUEUED: frozenset({TxState.TESTING}),
    TxState.TESTING: frozenset({TxState.OK, TxState.FAILED}),
    TxState.OK: frozenset(),
    TxState.FAILED: frozenset(),
}
"""The lifecycle as data: the states each state may move to next (``None``: unknown tx)."""


def is_allowed_transition(current: TxState | None, new: TxState) -> bool:
    return new in ALLOWED_TRANSITIONS[current]
