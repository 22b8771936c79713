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


@dataclass(frozen=True, slots=True, order=True)
class Ballot:
    """A view-change proposal's number (PROTOCOL.md §3), ordered as a tuple.

    ``view_no`` is the view it would install, so ballots of one view change (one Paxos
    instance) compare by ``attempt``, then by proposer to break ties.
    """

    view_no: int
    attempt: int
    proposer: NodeId


@dataclass(frozen=True, slots=True)
class View:
    """The members that take part in rounds: always a weight majority of the configuration."""

    view_no: int
    members: tuple[NodeId, ...]
    """Sorted and unique."""


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """One membership change, ordered as an entry of the synced queue (PROTOCOL.md §3):
    set ``node``'s vote weight; 0 removes it, and a node not configured yet is added."""

    node: NodeId
    weight: int
    address: str = ""
    """Where the node answers (opaque to the core; kept if empty)."""
    after_position: int | None = None
    """The position of the membership entry the configuration reflected where the change
    was asked (its ``applied_position`` there). The change applies only if that entry is
    still the last one before it in the synced order; otherwise it is void, for it was
    checked against a configuration that is no longer the one it changes (two DCs asked
    at once: the one ordered first wins). None: a change of an earlier release, applied
    regardless."""


@dataclass(frozen=True, slots=True)
class Configuration:
    """The configured nodes and their vote weights, and the synced position of the last
    membership entry it reflects (0: none)."""

    weights: tuple[tuple[NodeId, int], ...]
    """Sorted by node id; every weight positive."""
    applied_position: int = 0
    addresses: tuple[tuple[NodeId, str], ...] = ()
    """Where each node answers, for the services (the core only carries it along)."""

    @staticmethod
    def of(
        weights: dict[NodeId, int],
        applied_position: int = 0,
        addresses: dict[NodeId, str] | None = None,
    ) -> Configuration:
        known = sorted((n, a) for n, a in (addresses or {}).items() if n in weights and a)
        return Configuration(tuple(sorted(weights.items())), applied_position, tuple(known))

    def as_dict(self) -> dict[NodeId, int]:
        return dict(self.weights)

    def is_void_after(self, change: ConfigChange) -> bool:
        """``change``, applied next, was asked against an earlier configuration: another
        change was ordered between. (Seed 1530 of the simulator: dc6 was added at dc1
        while dc3 removed dc1, ordered first; dc1 alone held the start of the history
        dc6 had to replay, and dc6 waited for ever.)"""
        return change.after_position is not None and change.after_position != (
            self.applied_position
        )

    def with_change(self, change: ConfigChange, position: int) -> Configuration:
        """The configuration after the membership entry at ``position``. One that would
        leave no node, or that was asked against another configuration (``after_position``,
        ``is_void_after``), changes nothing but still counts as applied."""
        weights, addresses = self.as_dict(), dict(self.addresses)
        if self.is_void_after(change):
            return Configuration.of(weights, position, addresses)
        if change.weight > 0:
            weights[change.node] = change.weight
            if change.address:
                addresses[change.node] = change.address
        else:
            weights.pop(change.node, None)
        if not weights:
            weights = self.as_dict()
        return Configuration.of(weights, position, addresses)


@dataclass(frozen=True, slots=True)
class ViewProposal:
    """What a view change decides: the new view, its configuration, and the seal, the old
    view's final synced queue, given as ``seal_start`` (a base every promiser had reached)
    plus ``seal``."""

    view: View
    seal_start: MergeBase
    seal: tuple[TxMeta, ...]
    configuration: Configuration

    @property
    def seal_end(self) -> MergeBase:
        if not self.seal:
            return self.seal_start
        return MergeBase(self.seal_start.synced_len + len(self.seal), self.seal[-1].tx_id)

    @staticmethod
    def initial(
        weights: dict[NodeId, int], addresses: dict[NodeId, str] | None = None
    ) -> ViewProposal:
        """View 0: every configured node, starting from the empty synced queue."""
        view = View(0, tuple(sorted(weights)))
        configuration = Configuration.of(weights, 0, addresses)
        return ViewProposal(view, MergeBase.genesis(), (), configuration)


@dataclass(frozen=True, slots=True)
class ViewPrepare:
    """Phase 1a: "promise not to post in your view nor accept lower ballots"."""

    sender: NodeId
    ballot: Ballot


@dataclass(frozen=True, slots=True)
class ViewPromise:
    """Phase 1b: the promiser's state at the moment it froze, for the seal rule."""

    sender: NodeId
    ballot: Ballot
    base: MergeBase
    counter: int
    queue: tuple[TxMeta, ...]
    """The postable incoming queue (acquired bodies only, cut like a post)."""
    accepted_ballot: Ballot | None
    accepted: ViewProposal | None
    """A proposal this node accepted for the same view change (Paxos: re-propose it)."""


@dataclass(frozen=True, slots=True)
class ViewAccept:
    """Phase 2a: "accept this proposal unless you promised a higher ballot"."""

    sender: NodeId
    ballot: Ballot
    proposal: ViewProposal


@dataclass(frozen=True, slots=True)
class ViewAccepted:
    """Phase 2b."""

    sender: NodeId
    ballot: Ballot


@dataclass(frozen=True, slots=True)
class ViewInstall:
    """A decided view (chosen by a weight majority): install it. Also the answer to any
    node found in an older view."""

    sender: NodeId
    proposal: ViewProposal
    history_len: int = 0
    """The sender's history starts after this synced length (``HistoryTruncated``; 0
    from a sender of 0.3 or earlier): a receiver behind it takes none of the seal, whose
    bodies may be gone everywhere, and is served catch-up, or sent to a copy."""


@dataclass(frozen=True, slots=True)
class ViewRefused:
    """The answer to a prepare or accept this node will not take, with its reason as
    state: its current view and the highest ballot it promised."""

    sender: NodeId
    ballot: Ballot
    view_no: int
    promised: Ballot | None


@dataclass(frozen=True, slots=True)
class ViewQuery:
    """ "I am in view ``view_no``": sent to a node seen in a newer view, which answers with
    its ``ViewInstall``."""

    sender: NodeId
    view_no: int


ViewMessage = (
    ViewPrepare | ViewPromise | ViewAccept | ViewAccepted | ViewInstall | ViewRefused | ViewQuery
)

Message = Post | SyncedEntries | ViewMessage


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


IMPLIED_STATES = frozenset({TxState.INCOMING, TxState.ACCEPTED, TxState.ENQUEUED})
"""States a node reaches by a fact it records anyway (the meta, the synced append, the
body): its transaction-store makes these transitions itself, with no entry of their own
(``transaction_store/state.py``), so the coordinator does not send them."""


def is_allowed_transition(current: TxState | None, new: TxState) -> bool:
    return new in ALLOWED_TRANSITIONS[current]
