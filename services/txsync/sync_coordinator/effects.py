"""Merging the ``Ready`` batches of several steps into one store write.

The coordinator steps the core once per event but persists once per batch of events:
everything durable the batch produced goes to the transaction-store in one
step on ``PersistSteps`` (one fsync), and only then is anything sent. Merging keeps the core's
order: counters take the highest, metas and state changes keep their order, and synced
appends (always contiguous) become one append from the first start.

Bodies that peers pushed ride in the write of the step that acquired them
(``ArrivedBody``): one fsync for the body and what the step learned with it, and no
store call of their own.

Views add three effects. The store writes a step's forgotten metas before its new metas
and its installed view before its vote, so the merge keeps only what the core's order
means: a vote made before an install in the same batch is void, and a meta forgotten
then learned again in one batch is simply kept (never both forgotten and re-learned).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from txsync.protocol import (
    MergeBase,
    PersistCounter,
    PersistDropIncoming,
    PersistIncoming,
    PersistSynced,
    PersistView,
    PersistViewVote,
    Ready,
    StateChanged,
    TxId,
    TxMeta,
    ViewProposal,
)

META_BYTES_MOST = 128
"""A ``TxMeta`` in a write, encoded, at most: the longest origin (63 characters), a tx id,
a counter up to 2**63 and their tags and lengths come to 117 bytes."""
TX_ID_BYTES_MOST = 40
"""A forgotten tx id in a write, encoded (38 bytes)."""
BODY_ENTRY_BYTES_MOST = 192
"""A pushed body in a write besides its bytes: tx id, digest, traceparent, tags."""
PROPOSAL_BYTES_MOST = 4_096 * META_BYTES_MOST + 32 * 1024
"""A view proposal in a write: its seal (at most 4,096 metas, ``codec.SEAL_ENTRIES_MAX``)
and its members, weights and addresses (at most 16, ``protocol.MEMBERS_MAX``)."""


@dataclass(frozen=True, slots=True)
class ArrivedBody:
    """A body a peer sent, checked (parsed, within the limits, matching the origin's
    digest) and not stored yet. The shell steps ``BodyAcquired`` for it and writes it
    with that step's effects, so the core learns of it no earlier than it is durable
    for anything the core sends."""

    tx_id: TxId
    body: bytes
    digest: bytes
    traceparent: str = ""


@dataclass(slots=True)
class MergedPersist:
    counter: int = 0
    incoming: list[TxMeta] = field(default_factory=list)
    synced_start: MergeBase | None = None
    synced: list[TxMeta] = field(default_factory=list)
    changes: list[StateChanged] = field(default_factory=list)
    forgotten: dict[TxId, None] = field(default_factory=dict)
    installed: ViewProposal | None = None
    vote: PersistViewVote | None = None
    bodies: list[ArrivedBody] = field(default_factory=list)
    body_bytes: int = 0
    local_seq: int = 0
    """The highest local submit the core had stepped when the write was sealed (no
    entry of its own: it rides the write to tell a restart which stamps it may keep)."""

    def add_body(self, arrived: ArrivedBody) -> None:
        self.bodies.append(arrived)
        self.body_bytes += len(arrived.body)

    def add(self, ready: Ready) -> None:
        for effect in ready.persist:
            match effect:
                case PersistCounter(counter):
                    self.counter = max(self.counter, counter)
                case PersistIncoming(metas):
                    self.incoming.extend(metas)
                case PersistSynced(start, metas):
                    if self.synced_start is None:
                        self.synced_start = start
                    else:
                        end = self.synced_start.synced_len + len(self.synced)
                        assert start.synced_len == end, "synced appends are contiguous"
                    self.synced.extend(metas)
                case PersistDropIncoming(tx_ids):
                    self._forget(tx_ids)
                case PersistView(installed):
                    self.installed = installed
                    self.vote = None
                case PersistViewVote():
                    self.vote = effect
        self.changes.extend(ready.state_changes)
        for change in ready.state_changes:
            self.forgotten.pop(change.tx_id, None)  # learned again after being forgotten

    def _forget(self, tx_ids: tuple[TxId, ...]) -> None:
        gone = set(tx_ids)
        learned_in_batch = {meta.tx_id for meta in self.incoming} & gone
        if learned_in_batch:
            # Learned and forgotten within this batch: the store never needs to hear of it.
            self.incoming = [m for m in self.incoming if m.tx_id not in learned_in_batch]
            self.changes = [c for c in self.changes if c.tx_id not in learned_in_batch]
        self.forgotten.update(dict.fromkeys(t for t in tx_ids if t not in learned_in_batch))

    def bytes_bound(self) -> int:
        """At least the size of this write as the store's request, reckoned from counts
        alone (cheap enough for every step): what the shell seals a write on, so that
        every write fits one gRPC message."""
        proposals = (self.installed is not None) + (self.vote is not None)
        return (
            self.body_bytes
            + BODY_ENTRY_BYTES_MOST * len(self.bodies)
            + META_BYTES_MOST * (len(self.incoming) + len(self.synced))
            + TX_ID_BYTES_MOST * len(self.forgotten)
            + PROPOSAL_BYTES_MOST * proposals
            + 64  # the counter, the synced start and the service's name
        )

    def is_empty(self) -> bool:
        return not (
            self.counter
            or self.incoming
            or self.synced
            or self.changes
            or self.forgotten
            or self.installed
            or self.vote
            or self.bodies
        )
