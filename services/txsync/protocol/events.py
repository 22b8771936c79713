"""Inputs to the core (events) and its outputs (effects, gathered in one ``Ready`` batch).

The caller's loop is: feed one event to ``ProtocolNode.step`` and apply the returned
``Ready`` in this order, which is what makes crashes safe:

1. ``persist``: make every effect durable (fsync) before anything else leaves the node.
   A counter that was posted must never be forgotten, or a restarted node could stamp a
   new transaction below a cut its peers already used.
2. ``state_changes``: record each transaction's new state (clients may now be told).
3. ``messages`` and ``bodies``: send posts and catch-up entries, push and fetch bodies.
   Each may be lost, duplicated or reordered; the protocol tolerates all three.
4. Arrange a ``Tick`` at ``next_tick_ms`` (or earlier; an early tick is harmless).

``rounds`` reports rounds starting and ending, for tracing and metrics only: nothing the
protocol needs depends on what the caller does with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from txsync.protocol.model import (
    Ballot,
    ConfigChange,
    MergeBase,
    NodeId,
    Post,
    SyncedEntries,
    TxId,
    TxMeta,
    TxState,
    ViewMessage,
    ViewProposal,
)

# --- events ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LocalTx:
    """A client's transaction whose body the caller has already stored durably.

    ``stamp``: the timestamp the store gave it as it wrote the submit, durable with it
    (0: none; the core stamps it). ``local_seq``: the submit's number among this node's
    local submits, counting up; the caller writes the highest one stepped with every
    write (``ProtocolNode.local_seq_stepped``), which is how a restart tells a stamp the
    core took from one it may have posted a counter past (docs/protocol.md, "The
    submit's counter, stamped by the store")."""

    tx_id: TxId
    stamp: int = 0
    local_seq: int = 0


@dataclass(frozen=True, slots=True)
class PostReceived:
    post: Post


@dataclass(frozen=True, slots=True)
class SyncedEntriesReceived:
    entries: SyncedEntries


@dataclass(frozen=True, slots=True)
class BodyAcquired:
    """The caller holds the body durably and its digest matched."""

    tx_id: TxId


@dataclass(frozen=True, slots=True)
class ViewMessageReceived:
    message: ViewMessage


@dataclass(frozen=True, slots=True)
class ViewChangeRequested:
    """An operator asks for a view change now (the new view keeps every member that
    answers and takes back every caught-up node that was excluded)."""


@dataclass(frozen=True, slots=True)
class ConfigChangeSynced:
    """A membership entry is in our synced queue at ``position`` (1-based) and its body
    is held. The caller feeds these in synced order, without gaps, from the installed
    configuration's ``applied_position`` on (also after a restart)."""

    position: int
    change: ConfigChange


@dataclass(frozen=True, slots=True)
class HistoryTruncated:
    """The store truncated the synced history up to ``synced_len`` (its records and
    bodies are gone there). A lagger behind it is no longer served from the entries in
    memory, whose bodies no DC may hold any more, but asked to start from a copy (the
    store refuses the read, docs/dc-snapshots.md). Stepped when the store stages the
    truncation: a DC truncates nothing past a configured peer's base, so a peer served
    later is never sent what it truncates meanwhile."""

    synced_len: int


@dataclass(frozen=True, slots=True)
class Tick:
    now_ms: int


Event = (
    LocalTx
    | PostReceived
    | SyncedEntriesReceived
    | BodyAcquired
    | ViewMessageReceived
    | ViewChangeRequested
    | ConfigChangeSynced
    | HistoryTruncated
    | Tick
)

# --- effects --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PersistCounter:
    counter: int


@dataclass(frozen=True, slots=True)
class PersistIncoming:
    """New metas in the incoming queue (the caller keeps them across restarts)."""

    metas: tuple[TxMeta, ...]


@dataclass(frozen=True, slots=True)
class PersistSynced:
    """Append ``metas`` to the synced queue at ``start`` and drop them from incoming."""

    start: MergeBase
    metas: tuple[TxMeta, ...]


@dataclass(frozen=True, slots=True)
class PersistDropIncoming:
    """Forget these incoming metas: their origin left the view and their body is not
    held here (the origin keeps them and posts them again when it rejoins)."""

    tx_ids: tuple[TxId, ...]


@dataclass(frozen=True, slots=True)
class PersistViewVote:
    """The acceptor's Paxos state for the next view change, durable before any answer."""

    promised: Ballot
    accepted_ballot: Ballot | None
    accepted: ViewProposal | None


@dataclass(frozen=True, slots=True)
class PersistView:
    """A view is installed (its seal is already appended): it replaces the current view
    and clears the vote."""

    installed: ViewProposal


PersistEffect = (
    PersistCounter
    | PersistIncoming
    | PersistSynced
    | PersistDropIncoming
    | PersistViewVote
    | PersistView
)


@dataclass(frozen=True, slots=True)
class StateChanged:
    tx_id: TxId
    state: TxState


@dataclass(frozen=True, slots=True)
class SendPost:
    to: NodeId
    post: Post


@dataclass(frozen=True, slots=True)
class SendSyncedEntries:
    to: NodeId
    entries: SyncedEntries


@dataclass(frozen=True, slots=True)
class ServeCatchUpFromLog:
    """A lagger is behind the synced entries held in memory: the caller reads
    ``[from_len, from_len + count_max)`` of its txlog and sends them as ``SyncedEntries``."""

    to: NodeId
    from_len: int
    count_max: int


@dataclass(frozen=True, slots=True)
class SendViewMessage:
    to: NodeId
    message: ViewMessage


MessageEffect = SendPost | SendSyncedEntries | ServeCatchUpFromLog | SendViewMessage


@dataclass(frozen=True, slots=True)
class PushBody:
    """Origin side: send this new body to the listed members (PROTOCOL.md §5)."""

    tx_id: TxId
    to: tuple[NodeId, ...]


@dataclass(frozen=True, slots=True)
class FetchBody:
    """Ask ``source`` for a body. If the caller already holds it, it answers at once with
    ``BodyAcquired`` instead."""

    tx_id: TxId
    source: NodeId


BodyEffect = PushBody | FetchBody


class RoundOutcome(Enum):
    ADVANCED = "advanced"
    """ADD moved the merge base (or a catch-up or view install did)."""
    COMPLETE = "complete"
    """Every peer posted and nothing could be added (usually an idle round)."""
    DEADLINE = "deadline"
    """The round timed out waiting for a member: an empty round."""
    ABANDONED = "abandoned"
    """A view change stopped it (this node promised, or a view was installed)."""


@dataclass(frozen=True, slots=True)
class RoundStarted:
    round_no: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class RoundEnded:
    round_no: int
    started_ms: int
    ended_ms: int
    outcome: RoundOutcome
    idle: bool
    """The node went idle after it (every queue empty): rounds slow down."""
    posts_sent: int
    """Posts sent to peers in this round (re-posts included, one per peer)."""
    posts_received: int
    """Posts of peers that were new to this node during the round."""
    added: int
    """Metas this round's ADD appended to the synced queue."""


RoundEffect = RoundStarted | RoundEnded


@dataclass(frozen=True, slots=True)
class Rejected:
    """A local transaction or an incoming message the core refused, and why."""

    what: str
    reason: str


@dataclass(frozen=True, slots=True)
class Ready:
    """One step's effects, applied by the caller in field order (see module docstring)."""

    persist: tuple[PersistEffect, ...] = ()
    state_changes: tuple[StateChanged, ...] = ()
    messages: tuple[MessageEffect, ...] = ()
    bodies: tuple[BodyEffect, ...] = ()
    rejections: tuple[Rejected, ...] = ()
    rounds: tuple[RoundEffect, ...] = ()
    next_tick_ms: int | None = None

    def is_empty(self) -> bool:
        return not (
            self.persist or self.state_changes or self.messages or self.bodies or self.rejections
        )
