"""A DC's transaction-store in the simulation: the store's own state machine
(``StoreState``), its rules (``step_rules``) and the internal API's conversions
(``step_wire``, ``store_wire``), over a disk that is the txlog's own frames in memory
(issue 53). No model of the store is left in the simulator: a write the store would
refuse fails the seed, and a restart replays exactly what the frames on the disk say.

What runs here as it runs in ``TransactionStore``:

- each write is planned against the staged state (``plan_step``, ``plan_bodies``,
  ``plan_verdicts``, the submit stamp of ``stamp_floor``), applied to it at once, and
  made durable later, in log order, as one frame (a ``LogBatch``) per write;
- a crash keeps the frames written so far, and may tear the next one; recovery scans
  the frames (``framing.scan``), cuts a torn tail and replays the rest into a new
  ``StoreState``, which must equal the state the durable writes built;
- a coordinator's start stages the epoch's entry and loads ``protocol_state``, encoded
  and decoded as the services do;
- the local submits to hand over at a start are ``pending_local``, in order.

- the progress the coordinator and dispatch report (``report_progress``), in memory
  only, and the truncation in place it allows (``retention.truncation_hold``, the
  store's ``truncate_in_place``): a ``truncated`` entry, staged and made durable like
  any write, after which the history below it is gone from memory, the disk's replay
  and every reader (catch-up, the feeds, body fetches).

- rotation (``Rotations._rotate_alone``): once the disk holds ``ROTATION_BYTES``
  after its snapshot, at a moment nothing staged is unwritten (the store flushes its
  writer under its lock first), the staged state's snapshot (``StoreState.snapshot``),
  less the history the reports allow to go, is dropped from memory
  (``drop_truncated``) and encoded as the store encodes its new file
  (``txlog.files.write_rotation``: split into parts, the kept bodies carried after
  it); at the commit, later, what was appended meanwhile is copied on after it and the
  new file replaces the disk, whose replay must give the durable state. A crash before
  the commit leaves the old disk (the new file was a ``.tmp`` no one reads).

What it leaves out: bodies' bytes (the simulated bodies are empty), idempotency keys,
backpressure, body files (every kept body is carried), bak- files and the files' own
I/O (the txlog tests cover them).
"""

from __future__ import annotations

import io
from collections import deque
from collections.abc import Callable, Container
from dataclasses import dataclass

from txsync.protocol import DurableState, NodeId, TxId, TxState
from txsync.refusals import Refusal
from txsync.sim.invariants import InvariantViolation
from txsync.sync_coordinator.shell import StepWrite
from txsync.sync_coordinator.store_wire import durable_from_proto, persist_request
from txsync.transaction_store.retention import (
    CarriedBodies,
    Progress,
    TruncationHold,
    carried_entries,
    live_copy_leases,
    peers_ordered,
    take_copy_lease,
    truncation_hold,
)
from txsync.transaction_store.state import Moved, StoreState
from txsync.transaction_store.step_rules import (
    BaseAdoption,
    StateChangeRequest,
    StoredBody,
    export_base,
    first_unfinished,
    keep_testing,
    plan_base_adopted,
    plan_bodies,
    plan_step,
    plan_verdicts,
    protocol_state,
    stamp_floor,
    stamps_at_clock,
)
from txsync.transaction_store.step_wire import protocol_state_to_proto, step_from_proto
from txsync.transaction_store.txlog.files import SnapshotForm, write_rotation
from txsync.transaction_store.txlog.framing import encode_frame, scan
from txsync.v1 import common_pb2, txlog_pb2

StateFactory = Callable[[str], StoreState]
"""Builds a store's state (tests/sim: a broken one)."""

DISPATCH = "worker-dispatch"
SUBMITS = "transaction-store"
TRUNCATION_STEP = 3
"""Positions that must be truncatable before the store truncates in place (the store's
``TRUNCATION_STEP`` is 256): small, so that a schedule of 20 transactions truncates."""
ROTATION_BYTES = 1_500
"""Bytes appended after the disk's snapshot that start a rotation (the store's
``--log-file-bytes-max`` is 16 MiB): a schedule of 20 transactions on five nodes
appends about 7 KB to each disk, so each store rotates a few times."""
SNAPSHOT_FRAME_BYTES = 512
"""A snapshot larger than this is split into parts, and the carried bodies into
batches of about this size (the store's ``SNAPSHOT_FRAME_BYTES`` is 16 MiB): the
simulated snapshots of a few transactions are split too."""


@dataclass(frozen=True, slots=True)
class Stamped:
    """A local submit as the store wrote it: its stamp (0: none) and local_seq."""

    tx_id: TxId
    stamp: int
    local_seq: int


@dataclass(frozen=True, slots=True)
class Verdict:
    """worker-dispatch's state for a transaction, as the store wrote it."""

    tx_id: TxId
    state: TxState


Write = StepWrite | Stamped | Verdict
"""A write the store makes durable, which tells the simulation what to do then."""


@dataclass(frozen=True, slots=True)
class _Staged:
    entries: list[txlog_pb2.LogEntry]
    write: Write | None


@dataclass(frozen=True, slots=True)
class _Rotation:
    """A rotation between its snapshot and its commit (``LogFiles.prepare_rotation``)."""

    frames: bytes
    """The new file as prepared: the snapshot's frames and the carried bodies'."""
    covered: int
    """The disk's length when the snapshot was taken: the commit copies on from there."""
    snapshot: SnapshotForm
    dropped: list[str]
    testing: list[txlog_pb2.LogEntry]
    """The TESTING held in memory then (``_testing_unwritten``), which the snapshot
    records as the state's: on the disk once the new file is."""


class SimStore:
    """One DC's store: ``state`` is what it plans against (everything staged),
    ``durable`` what its disk holds."""

    def __init__(
        self,
        node_id: NodeId,
        state_factory: StateFactory = StoreState,
        membership: Container[TxId] = (),
        peer_hold_max: int = 0,
    ) -> None:
        self.node_id = node_id
        self.peer_hold_max = peer_hold_max
        self._state_factory = state_factory
        self._membership = membership
        """The membership entries' ids: a body stored says whether it is one, as the
        coordinator's write says it of a peer's body (the simulated bodies are empty)."""
        self.state = state_factory(node_id)
        self.durable = state_factory(node_id)
        self.disk = bytearray()
        self._unwritten: deque[_Staged] = deque()
        self._testing_unwritten: dict[str, txlog_pb2.LogEntry] = {}
        self.progress = Progress()
        """As the coordinator and dispatch reported it; a restarted store starts over."""
        self._rotation: _Rotation | None = None
        self._snapshot_bytes = 0
        """The disk's bytes up to the end of its snapshot (0: the disk has none)."""

    # --- writes, staged in order ---------------------------------------------------------

    def stage_step(self, write: StepWrite, now_ms: int) -> None:
        """A coordinator's write, sent as the coordinator sends it and checked as the
        servicer and the store check it."""
        try:
            step = step_from_proto(persist_request(write.merged))
            bodies = [
                StoredBody(tx_id, encoded, digest, traceparent, tx_id in self._membership)
                for tx_id, encoded, digest, traceparent in step.bodies
            ]
            entries = plan_bodies(self.state, bodies, now_ms).entries
            entries += plan_step(self.state, step, now_ms)
        except Refusal as refusal:
            raise InvariantViolation(
                0, f"{self.node_id}'s store refused a step: {refusal}"
            ) from None
        self._stage(entries, write)

    def submit(
        self, tx_id: TxId, now_ms: int, clock_us: int, *, stamped: bool, membership: bool = False
    ) -> Stamped:
        """A client's submit, stamped as the store stamps it (``clock_us``: the store's
        wall clock, used under load); ``stamped=False``: written without a stamp, so
        that the coordinator stamps it (as the services did before); ``membership``: an
        operator's membership entry (the admin API's)."""
        stamp = 0
        if stamped:
            clock = clock_us if stamps_at_clock(self.state, 1) else 0
            stamp = stamp_floor(self.state, clock) + 1
        local_seq = self.state.local_seq + 1
        submitted = txlog_pb2.TxSubmitted(
            tx_id=tx_id, service=SUBMITS, ts=stamp, local_seq=local_seq, membership=membership
        )
        written = Stamped(tx_id, stamp, local_seq)
        self._stage([txlog_pb2.LogEntry(at_unix_ms=now_ms, submitted=submitted)], written)
        return written

    def record_verdict(self, tx_id: TxId, state: TxState, digest: bytes, now_ms: int) -> bool:
        """worker-dispatch's state for one transaction (its outcome carries the DC's
        digest at the position, which a restarted pipeline is fed back); False: nothing
        to write (a repeat, or TESTING, which waits in memory for its outcome)."""
        outcome = None
        if state in (TxState.OK, TxState.FAILED):
            outcome = common_pb2.Outcome(
                state=common_pb2.TxState.ValueType(state.value), state_digest=digest
            )
        change = StateChangeRequest(tx_id, state, outcome)
        try:
            plan = plan_verdicts(self.state, [change], DISPATCH, now_ms, self._testing_unwritten)
        except Refusal as refusal:
            problem = f"{self.node_id}'s store refused {state.name} of {tx_id}: {refusal}"
            raise InvariantViolation(7, problem) from None
        keep_testing(self.state, plan, self._testing_unwritten)
        if not plan.written:
            return False
        self._stage(plan.written, Verdict(tx_id, state))
        return True

    def report_progress(
        self,
        peers: dict[str, int] | None,
        workers_min: int | None,
        now_ms: int,
        *,
        truncate: bool,
        ordered: dict[str, int] | None = None,
        posted: dict[str, int] | None = None,
    ) -> bool:
        """A report, as ``TransactionStore.report_progress`` takes it: the coordinator's
        (``peers``: every peer of the configuration) or dispatch's (``workers_min``).
        True if it staged a truncation in place (a write to make durable); never without
        ``truncate``."""
        progress = self.progress
        if peers is not None:
            progress.peer_synced_len = dict(peers)
            progress.peer_ordered_len = dict(ordered or {})
            progress.peer_posted_len = dict(posted or {})
            progress.peers_reported = True
        if workers_min is not None:
            progress.workers_min_position = workers_min
        state = self.state
        progress.copy_leases = live_copy_leases(
            progress, state.synced_len, now_ms, self.peer_hold_max
        )
        hold = self._truncation_hold(now_ms)
        if (
            not truncate
            or self._rotation is not None  # it truncates too: they take turns
            or hold.below - 1 - state.synced_offset < TRUNCATION_STEP
        ):
            return False
        dropped = state.truncation_cut(hold.below)
        if not dropped:
            return False
        orders = peers_ordered(state, self.progress)
        truncated = state.truncated_entry(dropped, self.progress.peer_synced_len, orders)
        entry = txlog_pb2.LogEntry(at_unix_ms=now_ms, truncated=truncated)
        self._stage([entry], None)
        return True

    def _truncation_hold(self, now_ms: int) -> TruncationHold:
        return truncation_hold(
            self.state,
            self.progress,
            witness=False,
            history_kept=0,
            history_kept_ms=0,
            # Finished durably: one whose verdict is still being written counts as
            # unfinished, as the store counts it (``first_unfinished_position``).
            first_unfinished=first_unfinished(self.durable, 1, ()),
            now_ms=now_ms,
            peer_hold_max=self.peer_hold_max,
        )

    # --- rotation --------------------------------------------------------------------------

    @property
    def rotating(self) -> bool:
        """A rotation is between its snapshot and its commit."""
        return self._rotation is not None

    def rotation_due(self) -> bool:
        """The disk grew ``ROTATION_BYTES`` past its snapshot, no rotation runs, and
        nothing staged is unwritten (the store flushes its writer before its snapshot)."""
        return (
            self._rotation is None
            and not self._unwritten
            and len(self.disk) - self._snapshot_bytes > ROTATION_BYTES
        )

    def start_rotation(self, now_ms: int, *, truncate: bool) -> None:
        """The snapshot of what the disk holds (everything staged is written), less the
        history the reports allow to go (none without ``truncate``), dropped from
        memory at once, and the new file prepared as the store prepares it."""
        assert self.rotation_due(), "a rotation starts flushed, one at a time"
        below = self._truncation_hold(now_ms).below if truncate else 0
        state = self.state
        orders = peers_ordered(state, self.progress)
        snapshot, dropped = state.snapshot(below, self.progress.peer_synced_len, orders)
        state.drop_truncated(snapshot, dropped)
        held = [tx_id for tx_id, record in state.txs.items() if record.body_held]
        carried = CarriedBodies.of(held, dict.fromkeys(held, b""), state.txs)  # no bodies here
        entries = carried_entries(carried, now_ms)
        new_file = io.BytesIO()
        write_rotation(new_file, snapshot, now_ms, entries, SNAPSHOT_FRAME_BYTES)
        testing = [e for t, e in self._testing_unwritten.items() if t in state.txs]
        self._rotation = _Rotation(new_file.getvalue(), len(self.disk), snapshot, dropped, testing)

    def commit_rotation(self) -> tuple[int, list[Moved]]:
        """The new file, with what was appended since its snapshot copied on, replaces
        the disk; its replay must give the durable state (``drop_truncated`` done on it
        as on the staged state). The transactions it truncated, and the transitions the
        disk holds now (the TESTING the snapshot recorded)."""
        rotation = self._rotation
        assert rotation is not None, "a rotation was started"
        self._rotation = None
        durable = self.durable
        durable.drop_truncated(rotation.snapshot, rotation.dropped)
        moved: list[Moved] = []
        for entry in rotation.testing:  # a repeat where an outcome carried it since
            moved += durable.apply(entry)
        self.disk = bytearray(rotation.frames) + self.disk[rotation.covered :]
        self._snapshot_bytes = len(rotation.frames)
        if _fingerprint(self._recover()) != _fingerprint(durable):
            raise InvariantViolation(
                0, f"{self.node_id}: the state a rotated file replays is not the durable one"
            )
        return len(rotation.dropped), moved

    def history_from(self) -> int:
        """The first synced position the store holds (``ReportProgress``'s answer)."""
        return self.state.history_len + 1

    def bodies_held_len(self) -> int:
        """What ``ReportProgress`` answers the coordinator, which posts it: as the disk
        holds it (``TransactionStore.bodies_held_durably_len``)."""
        return self.durable.bodies_held_len()

    def _stage(self, entries: list[txlog_pb2.LogEntry], write: Write | None) -> None:
        for entry in entries:
            self.state.apply(entry)
        self._unwritten.append(_Staged(entries, write))

    # --- the disk --------------------------------------------------------------------------

    @property
    def unwritten(self) -> int:
        return len(self._unwritten)

    def write_next(self) -> tuple[Write | None, list[Moved]]:
        """The oldest staged write becomes durable: its frame is appended. The
        transitions it made, as the durable state records them."""
        staged = self._unwritten.popleft()
        if staged.entries:  # a step with nothing to write (the store answers it at once)
            self.disk += encode_frame(_batch(staged.entries))
        moved: list[Moved] = []
        for entry in staged.entries:
            moved += self.durable.apply(entry)
        return staged.write, moved

    def crash(self, torn_bytes: int) -> None:
        """The process dies: what was not written is gone, and ``torn_bytes`` of the
        next write's frame may have reached the disk. Recovery replays the frames."""
        if self._unwritten and self._unwritten[0].entries and torn_bytes:
            frame = encode_frame(_batch(self._unwritten[0].entries))
            self.disk += frame[: min(torn_bytes, len(frame) - 1)]
        self._unwritten.clear()
        self._testing_unwritten.clear()
        self._rotation = None  # its new file was a .tmp: no one reads it
        self.progress = Progress()
        recovered = self._recover()
        if _fingerprint(recovered) != _fingerprint(self.durable):
            raise InvariantViolation(
                0, f"{self.node_id}: the state replayed is not the durable one"
            )
        self.durable = recovered
        self.state = self._recover()

    def _recover(self) -> StoreState:
        result = scan(bytes(self.disk))
        if result.corruption is not None:
            raise InvariantViolation(0, f"{self.node_id}: txlog corrupt: {result.corruption}")
        del self.disk[result.good_end :]  # a torn tail is cut, as the store cuts it
        state = self._state_factory(self.node_id)
        for _, payload in result.frames:
            for entry in txlog_pb2.LogBatch.FromString(payload).entries:
                state.apply(entry)
        return state

    # --- a coordinator's start -------------------------------------------------------------

    def load_protocol_state(self, now_ms: int, local_admit_txs_max: int) -> DurableState:
        """Stage and write the new epoch's entry (nothing is staged ahead of it: the
        store restarted with the coordinator), then load the state as the coordinator
        receives it."""
        assert not self._unwritten, "a coordinator starts with its store"
        epoch = txlog_pb2.EpochStarted(
            epoch=self.state.epoch + 1, local_admit_txs_max=local_admit_txs_max
        )
        self.write_at_once(txlog_pb2.LogEntry(at_unix_ms=now_ms, epoch=epoch))
        loaded = protocol_state_to_proto(self.node_id, protocol_state(self.state))
        return durable_from_proto(loaded)

    # --- a DC started from another DC's snapshot (docs/dc-snapshots.md) -------------------

    def export_base(
        self, position: int, final_state: TxState, adopter: NodeId, adopter_len: int, now_ms: int
    ) -> BaseAdoption:
        """What this store says of a copy of its worker at ``position`` for ``adopter``
        (its disk's state: a worker applies only durable positions), and the copy's
        lease, as ``TransactionStore.export_base`` takes it. Raises ``Refusal``."""
        adoption = export_base(self.durable, position, final_state, adopter, adopter_len)
        take_copy_lease(self.progress, adopter, position, now_ms)
        return adoption

    def may_adopt(self, adoption: BaseAdoption, now_ms: int) -> bool:
        """Whether the store would adopt the copy's base (as dispatch asks it first)."""
        try:
            plan_base_adopted(self.state, adoption, now_ms)
        except Refusal:
            return False
        return True

    def adopt_base(self, adoption: BaseAdoption, now_ms: int) -> None:
        """Start past the copy, as the store does before its coordinator restarts onto
        it (nothing staged: the store restarted with the coordinator). Raises
        ``Refusal``."""
        self.write_at_once(plan_base_adopted(self.state, adoption, now_ms))

    def write_at_once(self, entry: txlog_pb2.LogEntry) -> None:
        """Stage an entry and make it durable, with nothing staged ahead of it."""
        assert not self._unwritten, "written in log order"
        self._stage([entry], None)
        self.write_next()

    def pending_local(self) -> list[TxId]:
        """The local submits the store's watch hands over first, unstamped."""
        return list(self.state.pending_local)

    # --- reads -----------------------------------------------------------------------------

    def body_held(self, tx_id: TxId) -> bool:
        record = self.durable.txs.get(tx_id)
        return record is not None and record.body_held

    def synced_durably(self, tx_id: str) -> bool:
        """Its synced append is on the disk, not only staged."""
        record = self.durable.txs.get(tx_id)
        return record is not None and record.position > 0

    def known(self, tx_id: TxId) -> bool:
        """Its meta is durable here, incoming or synced."""
        record = self.durable.txs.get(tx_id)
        return record is not None and record.meta is not None


def _fingerprint(state: StoreState) -> tuple[object, ...]:
    records = sorted(
        (
            tx_id,
            record.state,
            record.body_held,
            record.meta,
            record.local,
            record.position,
            record.membership,
            record.outcome,
        )
        for tx_id, record in state.txs.items()
    )
    return (
        state.truncated_last_tx_id,
        bool(state.pending_membership()),  # which one it names follows the dict's order
        state.incoming_state_txs,
        state.open_body_bytes,
        state.epoch_local_admit,
        state.counter,
        state.coordinator_counter,
        state.epoch,
        state.local_seq,
        state.synced_offset,
        tuple(state.synced),
        tuple(sorted(state.incoming.items())),  # the core sorts them (IncomingQueue)
        tuple(state.pending_local),
        tuple(state.unsettled.items()),
        state.view,
        state.vote,
        tuple(
            sorted((o, tuple(sorted(e.items()))) for o, e in state.synced_for_the_absent.items())
        ),
        tuple(sorted(state.absent_lost.items())),
        tuple(sorted(state.peers_ordered.items())),
        state.removed_order_end,
        tuple(records),
    )


def _batch(entries: list[txlog_pb2.LogEntry]) -> bytes:
    return txlog_pb2.LogBatch(entries=entries).SerializeToString()
