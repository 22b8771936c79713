"""The transaction-store's state in memory, rebuilt from the txlog at start-up.

``StoreState.apply(entry)`` is the only thing that changes it, both when an entry is
appended and when the log is replayed, so that what a restarted store knows is exactly
what it knew before. ``apply`` trusts its input: the store validates every request
before it builds entries (``store_core.py``).

**Implied transitions.** A state that follows from another durable fact is not written
as an entry of its own (issue 20: it was two thirds of the log's entries):

- a meta learned (``meta_known``) makes an unknown transaction INCOMING, as a submit does;
- a synced append makes each of its transactions ACCEPTED (INCOMING first if it was
  unknown), and ENQUEUED at once if its body is held;
- a body stored for an ACCEPTED transaction makes it ENQUEUED.

**Stamped submits.** A local submit carries the timestamp the store stamped it with, and
that stamp is its meta, so that the coordinator posts it without writing it first. A
later ``counter`` entry settles it: kept if the coordinator had stepped the submit when
it made that write (the entry's ``local_seq``), void if not and the counter reaches the
stamp (the coordinator may have posted that counter without it: the submit goes back to
``pending_local``, to be stamped anew); an ``epoch`` entry (a new coordinator, which
loads the stamps as they are) settles every stamp still open. docs/protocol.md, "The
submit's counter, stamped by the store", has the argument.

**Truncation.** History every peer and worker passed goes either at a rotation (the new
file's snapshot leaves it out) or in place, between rotations, by a ``truncated`` entry
(``HistoryTruncated``): both drop the same synced entries and records
(``truncation_cut``, ``_drop``), so memory follows what is unfinished and recent, not how
much the current file covers (issue 47).

These are exactly the protocol core's own rules (``ProtocolNode``: INCOMING on a new
meta, ACCEPTED on the synced append, ENQUEUED once synced and acquired), so the states
and their order are what they were; each implied step carries the entry's time and
``IMPLIED_BY`` as its service. Logs written before still hold those transitions as
``state`` entries: replayed after the implied ones, each is a state already reached,
and a state at or before the current one is a no-op. ``apply`` returns the transitions
it made, for the spans (``tx_tracing``), the waiters and the pipeline's rows.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from txsync.codec import (
    meta_from_proto,
    meta_to_proto,
    proposal_from_proto,
    proposal_to_proto,
    vote_from_proto,
    vote_to_proto,
)
from txsync.protocol import MergeBase, PersistViewVote, TxMeta, TxState, ViewProposal
from txsync.transaction_store.history import History, Step
from txsync.transaction_store.txlog.files import EncodedForms, SnapshotForm
from txsync.v1 import common_pb2, txlog_pb2

RepeatedAbsentSynced = RepeatedCompositeFieldContainer[txlog_pb2.AbsentSynced]
RepeatedAbsentLost = RepeatedCompositeFieldContainer[txlog_pb2.AbsentLost]

FINAL_STATES = frozenset({TxState.OK, TxState.FAILED})
IMPLIED_BY = "sync-coordinator"
"""The service named in the history for an implied transition: the coordinator wrote
the fact (meta, synced append, body) that implies it."""

ABSENT_SYNCED_MAX = 65_536
"""Entries of ``synced_for_the_absent`` kept per origin: an origin away holds at most its
own unfinished transactions as incoming (``--unfinished-max``, 8,192 by default), so more
is kept only for one that submitted far more before it left; past this, its copies are
refused until it reports passing what was left out (``absent_lost``)."""

NO_PROGRESS: Mapping[str, int] = MappingProxyType({})
"""No peer reported: every origin's dropped entries are listed (``snapshot``'s default)."""

ADOPTED_BY = "worker-dispatch"
"""The service named in the history of the transaction a DC adopted its base at: its
dispatch copied a worker database that had applied it (``BaseAdopted``)."""


class Outcome(NamedTuple):
    """A finished transaction's outcome as the store holds it: the fields of the
    ``Outcome`` message, converted at the txlog's and the API's edges. The message
    itself, taken from the log entry that carried it, kept that whole entry's memory
    (protobuf's arenas): 1.3 KB a record, against 0.2 KB for these fields, measured
    over 20,000 records (issue 47; issue 53: no protobuf in the store's state)."""

    state: int
    """``common_pb2.TxState``: OK or FAILED."""
    position: int
    rows_affected: tuple[int, ...]
    state_digest: bytes
    error: str
    duplicate_of: str
    touched_digest: bytes

    @classmethod
    def of(cls, message: common_pb2.Outcome) -> Outcome:
        return cls(
            message.state, message.position, tuple(message.rows_affected),
            message.state_digest, message.error, message.duplicate_of,
            message.touched_digest,
        )  # fmt: skip

    def into(self, message: common_pb2.Outcome) -> None:
        """Set ``message`` (empty, or a field of a message being built) to this."""
        message.state = common_pb2.TxState.ValueType(self.state)
        message.position = self.position
        message.rows_affected[:] = self.rows_affected
        message.state_digest = self.state_digest
        message.error = self.error
        message.duplicate_of = self.duplicate_of
        message.touched_digest = self.touched_digest

    def message(self) -> common_pb2.Outcome:
        built = common_pb2.Outcome()
        self.into(built)
        return built


@dataclass(slots=True)
class TxRecord:
    tx_id: str
    seq: int
    """Order in which this store learned of the transaction (List pages by it)."""
    local: bool = False
    meta: TxMeta | None = None
    idempotency_key: str = ""
    body_digest: bytes = b""
    body_bytes: int = 0
    body_held: bool = False
    traceparent: str = ""
    history: History = field(default_factory=History)
    outcome: Outcome | None = None
    position: int = 0
    """1-based position in the synced queue; 0 while not synced."""
    membership: bool = False
    """The body is a membership entry (known once the body is)."""
    version: int = 0
    """Bumped by every change (``touch``): a snapshot form built from an older version
    is stale (``prepare_snapshot``)."""

    def touch(self) -> None:
        self.version += 1

    @property
    def state(self) -> TxState | None:
        return self.history.last_state


@dataclass(frozen=True, slots=True)
class Moved:
    """A transition ``apply`` made: the record's history step at ``index``."""

    record: TxRecord
    index: int

    @property
    def step(self) -> Step:
        return self.record.history[self.index]


class PreparedForms(NamedTuple):
    """Snapshot forms built outside the store's lock (``prepare_snapshot``): the
    records, their versions before the forms were built, and the forms, in one buffer
    (``EncodedForms``). Kept by the rotation that built them only, not by the records:
    a form a record kept (about 400 bytes) outlived most of them under a batched load,
    where records come and go within seconds."""

    records: list[TxRecord]
    versions: list[int]
    forms: EncodedForms


def needs_no_body(record: TxRecord) -> bool:
    """Held here, or finished: a transaction every worker here applied or skipped needs
    no body (the one a DC adopted its base at has none: the copy applied it)."""
    return record.body_held or record.state in FINAL_STATES


def implied_by_sync(record: TxRecord) -> tuple[TxState, ...]:
    """The states a synced append moves ``record`` through (``record.state`` is its
    state before)."""
    state = record.state
    path: tuple[TxState, ...] = ()
    if state is None:
        path = (TxState.INCOMING, TxState.ACCEPTED)
    elif state is TxState.INCOMING:
        path = (TxState.ACCEPTED,)
    elif state is not TxState.ACCEPTED:
        return ()  # already past ACCEPTED: nothing is implied
    return (*path, TxState.ENQUEUED) if record.body_held else path


class StoreState:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.counter = 0
        self.epoch = 0
        self.synced_offset = 0
        """Synced entries below this index were truncated."""
        self.truncated_last_tx_id = ""
        """Id of the entry at ``synced_offset - 1`` (the base a catch-up there starts at)."""
        self.synced: list[TxMeta] = []
        self.txs: dict[str, TxRecord] = {}
        self._seq_order: list[TxRecord] = []
        """The records in seq order, and a few gone from ``txs`` (``_prune_seq_order``): a
        page after a seq is found by bisection, not by walking the dict from its start."""
        self.idempotency: dict[str, str] = {}
        self.pending_local: dict[str, None] = {}
        """Local submits the protocol has not stamped yet, in submit order."""
        self.unsettled: dict[str, tuple[int, int]] = {}
        """Stamped local submits no counter or epoch entry has settled: (stamp,
        local_seq), in local_seq order (so in stamp order too)."""
        self.local_seq = 0
        """The highest local_seq a submit was given."""
        self.coordinator_counter = 0
        """The highest counter the coordinator wrote (``counter`` counts stamps too)."""
        self.membership_entries: dict[str, None] = {}
        """Membership entries submitted here or known here by their bodies, until one is
        seen applied (``pending_membership``): one at a time (``change_membership``)."""
        self.epoch_local_admit = 0
        """The latest epoch's ``local_admit_txs_max`` (0: not known): the most own metas
        its core holds, which bounds the stamps the next epoch keeps."""
        self.incoming: dict[str, TxMeta] = {}
        self.incoming_state_txs = 0
        """Transactions in state INCOMING (backpressure)."""
        self.open_body_bytes = 0
        """Bytes of held bodies of transactions not yet OK or FAILED (backpressure)."""
        self.view: ViewProposal | None = None
        """The coordinator's installed view (None: view 0 of the whole configuration)."""
        self.vote: PersistViewVote | None = None
        """The coordinator's vote in the next view change (kept for it, not interpreted)."""
        self.synced_for_the_absent: dict[str, dict[str, int]] = {}
        """By origin, the transactions this DC synced and truncated (tx id: position)
        whose origin had not reported coming as far: it may still hold them as
        incoming, and a copy of this DC's database it starts from tells it they are
        synced (``export_base``). Kept past truncation, bounded per origin
        (``ABSENT_SYNCED_MAX``); an entry goes once its origin reports passing it."""
        self.absent_lost: dict[str, int] = {}
        """Origins whose list overflowed, and the highest position left out: no copy is
        given them until they report passing it."""
        self.peers_ordered: dict[str, int] = {}
        """How far each peer's order came, as the coordinator last reported it
        (``retention.peers_ordered``), written with each truncation: durable, so that a
        coordinator that restarts while a peer is away can still let it go past
        ``--peer-hold-max``: it names the peer at this length until it hears from it."""
        self.removed_order_end = 0
        """How far a node this DC's configuration left out may have ordered: the synced end
        when the view that removed it was installed here (the seal's end at least; a
        removed node takes nothing after it). Truncation either stays where it is or
        passes it (``retention.truncation_hold``): the node may be added again, and one
        whose order ends past the history's start catches up from the logs, where the
        bodies it lacks below that start are gone everywhere (the simulator: invariant
        5, seed 1446 of `membership`, five nodes)."""
        self._next_seq = 1
        self._bodies_held_len = 0
        """Where ``bodies_held_len`` stopped looking (bodies are never un-held)."""

    # --- reads ---------------------------------------------------------------------------

    def pending_membership(self) -> str:
        """A membership entry submitted here, or synced here, that the installed
        configuration has not applied yet ("" if none). Those seen applied, or gone,
        are let go; one of a peer not yet synced is no change (yet)."""
        applied = self.view.configuration.applied_position if self.view is not None else 0
        for tx_id in list(self.membership_entries):
            record = self.txs.get(tx_id)
            if record is None or 0 < record.position <= applied:
                del self.membership_entries[tx_id]
            elif record.local or record.position:
                return tx_id
        return ""

    def bodies_held_len(self) -> int:
        """Every synced position up to this one has its body here (truncated ones count
        as held). The coordinator posts it: a peer keeps the bodies past it, which this
        DC may still fetch from it, instead of truncating them with the rest of the
        history this DC synced (a DC rolled back in the middle of an upgrade once had
        527 bodies of synced transactions that every other DC had truncated, and its
        workers waited for ever). Looks only past where it stopped the last time."""
        held = max(self._bodies_held_len, self.synced_offset)
        synced, txs, offset, end = self.synced, self.txs, self.synced_offset, self.synced_len
        while held < end and needs_no_body(txs[synced[held - offset].tx_id]):
            held += 1
        self._bodies_held_len = held
        return held

    @property
    def synced_len(self) -> int:
        return self.synced_offset + len(self.synced)

    @property
    def history_len(self) -> int:
        """The synced length a lagging peer must have come to for this DC to serve it
        (its history starts at the next position): what was truncated, and in a DC that
        started from a copy, the copy's position too. It holds the entry there (its merge
        base), finished by the copy, but never held its body, which the others may have
        truncated since: a lagger it served that entry waited for the body for good (the
        simulator, invariant 4: seed 187 of `crash`, five nodes, a bound of 4)."""
        if self.synced:
            first = self.txs.get(self.synced[0].tx_id)
            if first is not None and not first.body_held and first.state in FINAL_STATES:
                return self.synced_offset + 1
        return self.synced_offset

    @property
    def view_no(self) -> int:
        return self.view.view.view_no if self.view is not None else 0

    @property
    def merge_base(self) -> MergeBase:
        if self.synced_len == 0:
            return MergeBase.genesis()
        assert self.synced, "truncation always keeps the last synced entry"
        return MergeBase(self.synced_len, self.synced[-1].tx_id)

    def base_at(self, length: int) -> MergeBase | None:
        """The merge base the synced queue had at ``length`` (None: truncated away)."""
        if length == 0:
            return MergeBase.genesis()
        if length == self.synced_offset and self.truncated_last_tx_id:
            return MergeBase(length, self.truncated_last_tx_id)
        meta = self.synced_at(length - 1)
        return None if meta is None else MergeBase(length, meta.tx_id)

    def synced_at(self, index: int) -> TxMeta | None:
        """The synced entry at 0-based ``index``, or None if truncated or beyond the end."""
        offset = index - self.synced_offset
        return self.synced[offset] if 0 <= offset < len(self.synced) else None

    def tx(self, tx_id: str) -> TxRecord | None:
        record = self.txs.get(tx_id)
        return record if record is not None and record.history else None

    def in_seq_order(self, after_seq: int = 0) -> Iterator[TxRecord]:
        """The records with a state, in the order this store learned of them, from the
        first after ``after_seq``."""
        order, txs = self._seq_order, self.txs
        start = bisect.bisect_right(order, after_seq, key=_seq_of)
        for index in range(start, len(order)):
            record = order[index]
            if record.history and txs.get(record.tx_id) is record:
                yield record

    # --- the one way to change it --------------------------------------------------------

    def apply(self, entry: txlog_pb2.LogEntry) -> list[Moved]:
        """Apply one entry; the transitions it made, in order."""
        kind = entry.WhichOneof("entry")
        at = entry.at_unix_ms
        moved: list[Moved] = []
        if kind == "submitted":
            self._apply_submitted(entry.submitted, at, moved)
        elif kind == "meta_known":
            record = self._apply_meta(meta_from_proto(entry.meta_known.meta))
            if record.state is None:
                self._apply_state(record, Step(TxState.INCOMING, at, IMPLIED_BY), moved)
        elif kind == "body_stored":
            stored = entry.body_stored
            record = self._record(stored.tx_id)
            record.touch()
            record.membership = stored.membership
            if stored.membership:
                self.membership_entries[stored.tx_id] = None
            record.traceparent = record.traceparent or stored.traceparent
            if not record.body_held:
                record.body_held = True
                record.body_digest = stored.body_digest
                record.body_bytes = stored.body_bytes
                if record.state not in FINAL_STATES:
                    self.open_body_bytes += stored.body_bytes
                if record.state is TxState.ACCEPTED:
                    self._apply_state(record, Step(TxState.ENQUEUED, at, IMPLIED_BY), moved)
        elif kind == "counter":
            raised = entry.counter
            self.counter = max(self.counter, raised.counter)
            self.coordinator_counter = max(self.coordinator_counter, raised.counter)
            if self.unsettled:
                self._settle_stamps(raised.counter, raised.local_seq)
        elif kind == "epoch":
            self.epoch = max(self.epoch, entry.epoch.epoch)
            self._settle_at_epoch()
            self.epoch_local_admit = entry.epoch.local_admit_txs_max
        elif kind == "synced":
            self._apply_synced([meta_from_proto(m) for m in entry.synced.metas], at, moved)
        elif kind == "state":
            change = entry.state
            record = self._record(change.tx_id)
            if change.testing_at_unix_ms:
                # TESTING written with its outcome, in the outcome's entry (a repeat
                # where memory has it already).
                testing = Step(TxState.TESTING, change.testing_at_unix_ms, change.service)
                self._apply_state(record, testing, moved)
            self._apply_state(
                record,
                Step(TxState(change.state), at, change.service),
                moved,
                Outcome.of(change.outcome) if change.HasField("outcome") else None,
            )
        elif kind == "snapshot":
            self._apply_snapshot(entry.snapshot)
        elif kind == "snapshot_more":
            self._apply_snapshot_more(entry.snapshot_more)
        elif kind == "view_voted":
            self.vote = vote_from_proto(entry.view_voted)
        elif kind == "view_installed":
            self._install(proposal_from_proto(entry.view_installed.installed))
        elif kind == "forgotten":
            for tx_id in entry.forgotten.tx_ids:
                self._forget(tx_id)
        elif kind == "truncated":
            self._apply_truncated(entry.truncated)
        elif kind == "base_adopted":
            self._apply_base_adopted(entry.base_adopted, at, moved)
        else:
            raise ValueError(f"log entry of unknown kind {kind!r}")
        return moved

    def _install(self, installed: ViewProposal) -> None:
        previous = self.view
        if installed.configuration.applied_position and (
            previous is None
            or {node for node, _ in previous.configuration.weights}
            - {node for node, _ in installed.configuration.weights}
        ):
            # Without the view before, whether a node left is not known: as if one did.
            ordered = max(self.synced_len, installed.seal_end.synced_len)
            self.removed_order_end = max(self.removed_order_end, ordered)
        self.view = installed
        self.vote = None

    def _record(self, tx_id: str) -> TxRecord:
        record = self.txs.get(tx_id)
        if record is None:
            record = TxRecord(tx_id=tx_id, seq=self._next_seq)
            self._next_seq += 1
            self.txs[tx_id] = record
            self._seq_order.append(record)
        return record

    def _apply_submitted(
        self, submitted: txlog_pb2.TxSubmitted, at: int, moved: list[Moved]
    ) -> None:
        record = self._record(submitted.tx_id)
        record.touch()
        record.local = True
        record.membership = submitted.membership
        if submitted.membership:
            self.membership_entries[submitted.tx_id] = None
        record.idempotency_key = submitted.idempotency_key
        record.traceparent = submitted.traceparent
        if submitted.idempotency_key:
            self.idempotency[submitted.idempotency_key] = submitted.tx_id
        if not record.body_held:
            record.body_held = True
            record.body_digest = submitted.body_digest
            record.body_bytes = submitted.body_bytes
            self.open_body_bytes += submitted.body_bytes
        self.local_seq = max(self.local_seq, submitted.local_seq)
        if submitted.ts:
            meta = TxMeta(submitted.ts, submitted.tx_id, self.node_id)
            record.meta = meta
            self.incoming[meta.tx_id] = meta
            self.counter = max(self.counter, meta.ts)
            self.unsettled[meta.tx_id] = (meta.ts, submitted.local_seq)
        else:
            self.pending_local[submitted.tx_id] = None
        self._apply_state(record, Step(TxState.INCOMING, at, submitted.service), moved)

    def _settle_stamps(self, counter: int, local_seq: int) -> None:
        """A counter the coordinator wrote having stepped the submits up to
        ``local_seq``: their stamps stay; those after them at or below ``counter`` are
        void. (Stamps rise with local_seq, so both are runs from the front.)"""
        unsettled = self.unsettled
        settled: list[str] = []
        void: list[str] = []
        for tx_id, (stamp, seq) in unsettled.items():
            if seq <= local_seq:
                settled.append(tx_id)
            elif stamp <= counter:
                void.append(tx_id)
            else:
                break
        for tx_id in settled:
            del unsettled[tx_id]
        for tx_id in void:
            del unsettled[tx_id]
        self._void_stamps(void)

    def _settle_at_epoch(self) -> None:
        """A new coordinator: the open stamps it may have posted are settled, the rest are
        void (stamped anew when handed over).

        The core that ended held at most ``epoch_local_admit`` own metas. Every own meta
        settled and incoming here was handed over before the open stamps (hand-over
        follows local_seq) and is not synced durably, so not synced in the core when it
        handed the open ones over either (its posts go out only after every earlier write
        is durable, the synced appends among them): so at most ``epoch_local_admit`` less
        those can have been handed over, and so posted, before the crash. Kept all, a
        restarted core held every stamp the store had taken (25 own metas where the core
        takes 8), and queues full of different metas stopped every ADD
        (docs/protocol.md, "Bounds"). 0: a log from before the bound was written, all kept."""
        unsettled = self.unsettled
        if not unsettled:
            return
        if not self.epoch_local_admit:
            unsettled.clear()
            return
        settled_own = sum(
            1
            for tx_id, meta in self.incoming.items()
            if meta.origin == self.node_id and tx_id not in unsettled
        )
        keep = max(0, self.epoch_local_admit - settled_own)
        void = list(unsettled)[keep:]
        unsettled.clear()
        self._void_stamps(void)

    def _void_stamps(self, tx_ids: Sequence[str]) -> None:
        """Stamps that can never have been posted: back to ``pending_local``."""
        for tx_id in tx_ids:
            record = self.txs[tx_id]
            record.touch()
            record.meta = None
            self.incoming.pop(tx_id, None)
            self.pending_local[tx_id] = None

    def _apply_meta(self, meta: TxMeta) -> TxRecord:
        record = self._record(meta.tx_id)
        record.touch()
        record.meta = meta
        self.pending_local.pop(meta.tx_id, None)
        self.unsettled.pop(meta.tx_id, None)  # stamped anew
        if record.position == 0:
            self.incoming[meta.tx_id] = meta
        self.counter = max(self.counter, meta.ts)
        return record

    def _forget(self, tx_id: str) -> None:
        """Forget an incoming foreign tx's meta (checked before logging). A body that
        arrived meanwhile stays, as a body whose meta is not known yet; without one the
        record goes."""
        self.incoming.pop(tx_id, None)
        record = self.txs.get(tx_id)
        if record is None:
            return
        if record.body_held:
            record.touch()
            record.meta = None
            return
        del self.txs[tx_id]
        if record.state is TxState.INCOMING:
            self.incoming_state_txs -= 1
        self._prune_seq_order()

    def _prune_seq_order(self) -> None:
        """Let go of the records ``_seq_order`` holds that left ``txs``. Each one held
        there is alive with its whole history and outcome: waiting until they were as
        many as the live ones kept twice the held transactions' memory at a batched
        load's peak, and that peak is what the allocator keeps (issue 47). Truncation
        drops the oldest, so the dead front goes at once (one memmove); records that
        left out of seq order go by a rebuild once they are an eighth (amortised O(1))."""
        order, txs = self._seq_order, self.txs
        dead_front = 0
        for record in order:
            if txs.get(record.tx_id) is record:
                break
            dead_front += 1
        if dead_front:
            del order[:dead_front]
        if len(order) > len(txs) + len(txs) // 8 + 64:
            self._seq_order = list(txs.values())  # dict order is seq order

    def _apply_synced(self, metas: list[TxMeta], at: int, moved: list[Moved]) -> None:
        for meta in metas:
            record = self._record(meta.tx_id)
            record.touch()
            if record.meta == meta:
                meta = record.meta  # one object (and one id string) per held transaction
            else:
                record.meta = meta
            self.synced.append(meta)
            record.position = self.synced_len
            self.incoming.pop(meta.tx_id, None)
            self.pending_local.pop(meta.tx_id, None)
            self.unsettled.pop(meta.tx_id, None)
            self.counter = max(self.counter, meta.ts)
            for state in implied_by_sync(record):
                self._apply_state(record, Step(state, at, IMPLIED_BY), moved)

    def _apply_state(
        self,
        record: TxRecord,
        step: Step,
        moved: list[Moved],
        outcome: Outcome | None = None,
    ) -> None:
        before, state = record.state, step.state
        if before is not None and state <= before:
            # A repeated transition (retries are safe), or one an earlier entry implied
            # (logs written before transitions were implied).
            return
        record.touch()
        record.history.append(step)
        moved.append(Moved(record, len(record.history) - 1))
        if outcome is not None:
            record.outcome = outcome
        if state is TxState.INCOMING:
            self.incoming_state_txs += 1
        if before is TxState.INCOMING:
            self.incoming_state_txs -= 1
        if state in FINAL_STATES and record.body_held:
            self.open_body_bytes -= record.body_bytes

    def _apply_snapshot(self, snapshot: txlog_pb2.Snapshot) -> None:
        fresh = StoreState(self.node_id)
        fresh.counter = snapshot.counter
        fresh.local_seq = snapshot.local_seq
        fresh.coordinator_counter = snapshot.coordinator_counter
        fresh.epoch = snapshot.epoch
        fresh.epoch_local_admit = snapshot.epoch_local_admit_txs_max
        fresh.synced_offset = (
            snapshot.synced_offset
            if snapshot.continued
            else snapshot.synced_len - len(snapshot.synced)  # logs from before the field
        )
        fresh.truncated_last_tx_id = snapshot.truncated_last_tx_id
        if snapshot.HasField("view"):
            fresh.view = proposal_from_proto(snapshot.view.installed)
        if snapshot.HasField("vote"):
            fresh.vote = vote_from_proto(snapshot.vote)
        fresh._restore_absent(snapshot.synced_for_the_absent, snapshot.absent_lost)
        fresh.peers_ordered = _orders_from(snapshot.peers_ordered)
        fresh.removed_order_end = snapshot.removed_order_end
        fresh._restore_txs(snapshot.txs)
        fresh._restore_synced(snapshot.synced)
        self.__dict__.update(fresh.__dict__)

    def _restore_unsettled(self, txs: Iterable[txlog_pb2.SnapshotTx]) -> None:
        stamped = [(saved.stamp_local_seq, saved.tx_id) for saved in txs if saved.stamp_local_seq]
        if not stamped:
            return
        stamped.extend((seq, tx_id) for tx_id, (_, seq) in self.unsettled.items())
        unsettled: dict[str, tuple[int, int]] = {}
        for seq, tx_id in sorted(stamped):
            meta = self.txs[tx_id].meta
            assert meta is not None, "a stamp is the meta"
            unsettled[tx_id] = (meta.ts, seq)
        self.unsettled = unsettled

    def _apply_snapshot_more(self, more: txlog_pb2.SnapshotMore) -> None:
        expected = self.synced_offset + len(self.synced)
        if more.synced_from != expected:
            raise ValueError(
                f"snapshot part at synced index {more.synced_from}, expected {expected}"
            )
        self._restore_txs(more.txs)
        self._restore_synced(more.synced)

    def _restore_txs(self, txs: Iterable[txlog_pb2.SnapshotTx]) -> None:
        """A snapshot's transactions, in the order they were learned (``seq``). Parts of
        a split snapshot come in that order too, all of them before its synced entries."""
        txs = list(txs)
        for saved in sorted(txs, key=lambda t: t.seq):
            record = self._record(saved.tx_id)
            record.seq = saved.seq
            self._next_seq = max(self._next_seq, saved.seq + 1)
            record.local = saved.local
            record.membership = saved.membership
            if saved.membership:
                self.membership_entries[saved.tx_id] = None
            record.meta = meta_from_proto(saved.meta) if saved.has_meta else None
            record.idempotency_key = saved.idempotency_key
            record.body_digest = saved.body_digest
            record.body_bytes = saved.body_bytes
            record.body_held = saved.body_held
            record.traceparent = saved.traceparent
            record.history = History(
                Step(TxState(t.state), t.at.ToMilliseconds(), t.service) for t in saved.history
            )
            record.outcome = Outcome.of(saved.outcome) if saved.HasField("outcome") else None
            if record.idempotency_key:
                self.idempotency[record.idempotency_key] = record.tx_id
            state = record.state
            if state is TxState.INCOMING:
                self.incoming_state_txs += 1
            if record.body_held and state not in FINAL_STATES:
                self.open_body_bytes += record.body_bytes
            if record.local and record.meta is None and state is not None:
                self.pending_local[record.tx_id] = None
            if record.meta is not None and record.position == 0:
                self.incoming[record.tx_id] = record.meta  # until a synced entry names it
        self._restore_unsettled(txs)

    def _restore_synced(self, synced: Iterable[common_pb2.TxMeta]) -> None:
        for meta in synced:
            self.synced.append(meta_from_proto(meta))
            record = self._record(meta.tx_id)
            record.position = self.synced_offset + len(self.synced)
            self.incoming.pop(meta.tx_id, None)

    # --- snapshots for rotation -----------------------------------------------------------

    def truncation_cut(self, truncate_below: int) -> list[str]:
        """The ids of the synced entries a truncation below position ``truncate_below``
        (1-based: entries at positions < it go) drops, oldest first. The merge base
        stays in memory whatever is allowed."""
        cut = max(0, min(truncate_below - 1, self.synced_len) - self.synced_offset)
        cut = min(cut, max(0, len(self.synced) - 1))
        return [meta.tx_id for meta in self.synced[:cut]]

    def truncated_entry(
        self,
        dropped: Sequence[str],
        peer_progress: Mapping[str, int],
        peers_ordered: Mapping[str, int],
    ) -> txlog_pb2.HistoryTruncated:
        """The log entry that truncates ``dropped`` (a ``truncation_cut``) in place, with
        the list of what was synced for the absent after it (``peer_progress``: the
        synced length each peer reported) and how far each peer's order came
        (``retention.peers_ordered``)."""
        entry = txlog_pb2.HistoryTruncated(
            synced_offset=self.synced_offset + len(dropped), last_tx_id=dropped[-1]
        )
        self._absent_after(dropped, peer_progress, entry.synced_for_the_absent, entry.absent_lost)
        entry.peers_ordered.extend(_orders_proto(peers_ordered))
        return entry

    def _absent_after(
        self,
        dropped: Sequence[str],
        peer_progress: Mapping[str, int],
        listed: RepeatedAbsentSynced,
        lost: RepeatedAbsentLost,
    ) -> None:
        """``synced_for_the_absent`` and ``absent_lost`` once ``dropped`` (the first
        synced entries held) are truncated: what an origin reported passing goes, and
        each dropped entry of an origin (not this DC) that did not report reaching it
        comes in."""
        kept: dict[str, dict[str, int]] = {}
        for origin, entries in self.synced_for_the_absent.items():
            passed = peer_progress.get(origin, -1)
            kept[origin] = {tx_id: at for tx_id, at in entries.items() if at > passed}
        lost_at = {
            origin: at
            for origin, at in self.absent_lost.items()
            if at > peer_progress.get(origin, -1)
        }
        for index, meta in enumerate(self.synced[: len(dropped)]):
            position = self.synced_offset + index + 1
            origin = meta.origin
            if origin == self.node_id or position <= peer_progress.get(origin, -1):
                continue
            entries = kept.setdefault(origin, {})
            if len(entries) < ABSENT_SYNCED_MAX:
                entries[meta.tx_id] = position
            else:
                lost_at[origin] = position
        for origin, entries in kept.items():
            for tx_id, at in entries.items():
                listed.add(origin=origin, position=at, tx_id=tx_id)
        for origin, at in lost_at.items():
            lost.add(origin=origin, position=at)

    def _restore_absent(
        self, listed: Iterable[txlog_pb2.AbsentSynced], lost: Iterable[txlog_pb2.AbsentLost]
    ) -> None:
        self.synced_for_the_absent = {}
        for entry in listed:
            self.synced_for_the_absent.setdefault(entry.origin, {})[entry.tx_id] = entry.position
        self.absent_lost = {entry.origin: entry.position for entry in lost}

    def _apply_truncated(self, truncated: txlog_pb2.HistoryTruncated) -> None:
        cut = truncated.synced_offset - self.synced_offset
        if cut <= 0:
            return  # a rotation's snapshot, written after it, went as far already
        if not 0 < cut < len(self.synced) or self.synced[cut - 1].tx_id != truncated.last_tx_id:
            raise ValueError(
                f"history truncated below {truncated.synced_offset} "
                f"({truncated.last_tx_id!r}), which the synced queue does not hold there"
            )
        self._drop([meta.tx_id for meta in self.synced[:cut]], truncated.last_tx_id)
        self._restore_absent(truncated.synced_for_the_absent, truncated.absent_lost)
        self.peers_ordered = _orders_from(truncated.peers_ordered)

    def _apply_base_adopted(
        self, adopted: txlog_pb2.BaseAdopted, at: int, moved: list[Moved]
    ) -> None:
        """Start past a copied worker database (``step_rules.plan_base_adopted`` checked
        it): the synced history is truncated up to the adopted entry, which stays as the
        only one (the merge base is always in memory), settled in the state the copy
        applied it in. Foreign incoming metas go, bodies and all (their origins post
        again what they have not synced), and so do the own ones the source says are
        synced already. What is left is the state a truncation in place would have
        left, so rotation snapshots need nothing new."""
        self._drop([meta.tx_id for meta in self.synced], adopted.last_tx_id)
        self.synced_offset = adopted.synced_offset
        synced_own = {entry.tx_id for entry in adopted.synced_own}
        for tx_id in [
            tx_id
            for tx_id, meta in self.incoming.items()
            if meta.origin != self.node_id or tx_id in synced_own
        ]:
            self._drop_incoming(tx_id)
        meta = meta_from_proto(adopted.meta)
        record = self._record(meta.tx_id)
        record.touch()
        record.meta = meta
        self.synced.append(meta)
        record.position = self.synced_len
        self.counter = max(self.counter, meta.ts, adopted.counter)
        self._apply_state(record, Step(TxState(adopted.final_state), at, ADOPTED_BY), moved)

    def _drop_incoming(self, tx_id: str) -> None:
        """An incoming transaction goes altogether (``_apply_base_adopted``)."""
        del self.incoming[tx_id]
        self.unsettled.pop(tx_id, None)
        record = self.txs.pop(tx_id)
        if record.state is TxState.INCOMING:
            self.incoming_state_txs -= 1
        self._let_go(record)

    def _let_go(self, record: TxRecord) -> None:
        """What a record dropped from ``txs`` held elsewhere: its idempotency key, and
        the bytes of an open body."""
        if record.idempotency_key and self.idempotency.get(record.idempotency_key) == record.tx_id:
            del self.idempotency[record.idempotency_key]
        if record.body_held and record.state not in FINAL_STATES:
            self.open_body_bytes -= record.body_bytes

    def snapshot(
        self,
        truncate_below: int,
        peer_progress: Mapping[str, int] = NO_PROGRESS,
        peers_ordered: Mapping[str, int] | None = None,
        prepared: PreparedForms | None = None,
    ) -> tuple[SnapshotForm, list[str]]:
        """A snapshot without the synced history below position ``truncate_below``
        (``truncation_cut``), and the ids it leaves out; ``peer_progress`` and
        ``peers_ordered`` as for ``truncated_entry`` (none reported: every origin's
        dropped entries listed; ``peers_ordered`` None: as recorded so far). The kept
        records' forms are taken from ``prepared`` where it holds their version, and
        built here for the others."""
        dropped = self.truncation_cut(truncate_below)
        cut = len(dropped)
        gone = set(dropped)
        snapshot = txlog_pb2.Snapshot(
            counter=self.counter,
            local_seq=self.local_seq,
            coordinator_counter=self.coordinator_counter,
            epoch=self.epoch,
            epoch_local_admit_txs_max=self.epoch_local_admit,
            synced_len=self.synced_len,
        )
        # One at a time, not a list of messages: each held its own arena while the
        # list lived, thousands at once under the store's lock.
        add_synced = snapshot.synced.add
        for meta in itertools.islice(self.synced, cut, None):
            add_synced(ts=meta.ts, tx_id=meta.tx_id, origin=meta.origin)
        if self.view is not None:
            snapshot.view.installed.CopyFrom(proposal_to_proto(self.view))
        if self.vote is not None:
            snapshot.vote.CopyFrom(vote_to_proto(self.vote))
        snapshot.synced_offset = self.synced_offset + cut
        snapshot.truncated_last_tx_id = dropped[-1] if dropped else self.truncated_last_tx_id
        self._absent_after(
            dropped, peer_progress, snapshot.synced_for_the_absent, snapshot.absent_lost
        )
        recorded = self.peers_ordered if peers_ordered is None else peers_ordered
        snapshot.peers_ordered.extend(_orders_proto(recorded))
        snapshot.removed_order_end = self.removed_order_end
        kept = EncodedForms()
        txs = self.txs
        records, versions, forms = prepared or ([], [], EncodedForms())
        at = 0  # the next prepared record: they are in ``txs``'s order, as the kept ones
        for record in txs.values():
            built = -1
            while at < len(records) and records[at] is not record:
                if txs.get(records[at].tx_id) is records[at]:
                    break  # still here, further on: ``record`` was not prepared
                at += 1  # gone since it was prepared
            if at < len(records) and records[at] is record:
                built, at = at, at + 1
            if record.tx_id in gone:
                continue
            stamped = self.unsettled.get(record.tx_id)
            if stamped is not None:  # the stamp is not the record's (settled apart)
                form = self._snapshot_tx(record)
                form.stamp_local_seq = stamped[1]
                kept.append(form.SerializeToString())
            elif built >= 0 and versions[built] == record.version:
                kept.append_from(forms, built)
            else:
                kept.append(self._saved(record))
        return SnapshotForm(snapshot, kept), dropped

    def kept_records(self, truncate_below: int) -> list[TxRecord]:
        """The records a snapshot below ``truncate_below`` would keep (for
        ``prepare_snapshot``), in ``txs``'s order."""
        return [record for record in self.txs.values() if not 0 < record.position < truncate_below]

    def prepare_snapshot(self, records: list[TxRecord]) -> PreparedForms:
        """Build the snapshot form of these records (``kept_records``), in a thread while
        the store goes on, so that ``snapshot`` under the lock builds only what changed
        meanwhile (building 12,000 took 1 s, all of it under the lock: issue 47's
        stall). A record may change while it is read here: each form comes with the
        version read before it was built, and ``snapshot`` takes only those whose record
        still has it. Lists side by side, not a tuple a record: thousands of tuples made
        in a burst outlive it in CPython's free list and pin the pools they were spread
        over."""
        versions = [record.version for record in records]
        forms = EncodedForms()
        for record in records:
            forms.append(self._saved(record))
        return PreparedForms(records, versions, forms)

    def _saved(self, record: TxRecord) -> bytes:
        return self._snapshot_tx(record).SerializeToString()

    def _snapshot_tx(self, record: TxRecord) -> txlog_pb2.SnapshotTx:
        saved = txlog_pb2.SnapshotTx(
            tx_id=record.tx_id,
            has_meta=record.meta is not None,
            idempotency_key=record.idempotency_key,
            body_digest=record.body_digest,
            body_bytes=record.body_bytes,
            body_held=record.body_held,
            traceparent=record.traceparent,
            local=record.local,
            seq=record.seq,
            membership=record.membership,
        )
        if record.meta is not None:
            saved.meta.CopyFrom(meta_to_proto(record.meta))
        if record.outcome is not None:
            record.outcome.into(saved.outcome)
        add, node_id = saved.history.add, self.node_id
        for state, at_unix_ms, service in record.history.fields():
            add(state=state, service=service, node_id=node_id).at.FromMilliseconds(at_unix_ms)
        return saved

    def drop_truncated(self, snapshot: SnapshotForm, dropped: list[str]) -> None:
        """What applying ``snapshot`` (made by ``snapshot`` just now, nothing applied
        since) does, in place: the ``dropped`` synced entries and their records go, and
        every other record stays the same object. Rebuilding the state from the snapshot
        cost a rotation time in proportion to what it keeps, under the store's lock, and
        left readers that hold a record or the ``txs`` dict (a follower between two
        batches) with copies nothing updates any more: a feed stalled for good at the
        first rotation under load."""
        assert [m.tx_id for m in self.synced[: len(dropped)]] == dropped, "a stale snapshot"
        head = snapshot.head
        assert head.synced_offset == self.synced_offset + len(dropped), "a stale snapshot"
        self._drop(dropped, head.truncated_last_tx_id)
        self._restore_absent(head.synced_for_the_absent, head.absent_lost)
        self.peers_ordered = _orders_from(head.peers_ordered)

    def _drop(self, dropped: Sequence[str], truncated_last_tx_id: str) -> None:
        """The first ``len(dropped)`` synced entries and their records go; every other
        record stays the same object (``drop_truncated``)."""
        del self.synced[: len(dropped)]
        self.synced_offset += len(dropped)
        self.truncated_last_tx_id = truncated_last_tx_id
        for tx_id in dropped:
            record = self.txs.pop(tx_id, None)
            if record is not None:
                self._let_go(record)  # an operator's truncate may cut open bodies
        self._prune_seq_order()


def _seq_of(record: TxRecord) -> int:
    return record.seq


def _orders_proto(orders: Mapping[str, int]) -> list[txlog_pb2.PeerOrder]:
    return [txlog_pb2.PeerOrder(peer=peer, ordered_len=at) for peer, at in sorted(orders.items())]


def _orders_from(orders: Iterable[txlog_pb2.PeerOrder]) -> dict[str, int]:
    return {entry.peer: entry.ordered_len for entry in orders}
