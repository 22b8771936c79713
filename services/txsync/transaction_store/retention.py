"""What the store keeps of its history, and what it lets go: how far truncation may go
and what holds it (``truncation_hold``, from the progress the coordinator and dispatch
report), a truncated transaction's verdict (``Verdict``, for the clients still waiting
on it) and a rotation's bodies not yet filed, carried into the new log (``CarriedBodies``,
written as ``BodyStored`` entries after the snapshot). Pure, with the time given: the
store's rotation and truncation (``rotation.py``) use them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from txsync.protocol import TxState
from txsync.transaction_store.state import Outcome, StoreState, TxRecord
from txsync.v1 import common_pb2, txlog_pb2

HISTORY_KEPT_BY_AGE_MOST = 2_048
"""The most newest positions ``--history-kept-ms`` keeps (``--history-kept`` may keep
more): the age window's memory is the rate times its length, unbounded without this.
It counts against ``--unpassed-max`` (the core hears only what the window lets go), so
it is half of that bound (4,096 until 2026-12-01): the rest is the room a burst has
before flow control slows it. Waits for what it let go find the truncated verdicts."""


COPY_LEASE_MS = 70 * 60 * 1000
"""How long a copy's lease holds at most: the coordinator's whole copy must finish within
an hour (``dc_copies.DC_COPY_TIMEOUT_S``), then the adopter catches up from the lease."""


class CopyLease(NamedTuple):
    """A copy of this DC's testing worker at ``position`` is on its way to a DC that
    starts from it: truncation keeps the positions past it until that DC caught up far
    enough to hold them as a peer does, so that it goes on from its copy instead of
    needing another (``copy_leases``)."""

    position: int
    until_ms: int


@dataclass(slots=True)
class Progress:
    """How far the others have come, as reported (``ReportProgress``); in memory only: a
    restarted store truncates nothing until the coordinator and the dispatch report
    again (each does every ``PROGRESS_REPORT_S``)."""

    peer_synced_len: dict[str, int] = field(default_factory=dict)
    """How far each peer has come with every body held: truncation keeps what it has not."""
    peer_posted_len: dict[str, int] = field(default_factory=dict)
    """How far each peer heard from since the coordinator started says its order came
    (its latest post), whatever was sent to it lately: recorded (``peers_ordered``)."""
    peer_ordered_len: dict[str, int] = field(default_factory=dict)
    """How far each peer's order has come (its synced length, bodies held or not), where
    the report says (a coordinator of 0.3 on): only a peer whose order is further
    behind than ``--peer-hold-max`` is let go. One whose order is recent and bodies are
    not was still fetching them from the others, and letting it go dropped them
    everywhere (the simulator: invariant 4 at once)."""
    peers_reported: bool = False
    """The coordinator reported its whole set of peers (possibly none: a DC alone)."""
    workers_min_position: int | None = None
    core_history_len: int | None = None
    """The coordinator's core serves catch-up from memory only above this synced
    length (None: its report does not say, as from a coordinator of 0.2)."""
    allowed_through: int = 0
    """How far truncation may go by everything but the coordinator's core, as found at
    the last report (``report_progress``): the core counts as behind (``unpassed``) only
    below it."""
    truncated_total: int = 0
    """Transactions truncated since the store started."""
    truncated_in_place: int = 0
    """Of those, truncated between rotations (``truncate_in_place``)."""
    let_go: frozenset[str] = frozenset()
    """The peers the last report found past ``--peer-hold-max`` (each is logged once)."""
    copy_leases: dict[str, CopyLease] = field(default_factory=dict)
    """Adopter -> the lease of the copy on its way to it (``copy_leases``); in memory
    only, as the rest of the progress: a store restarted during a copy holds nothing
    for it, and the adopter may need another copy."""
    last_rotation_ms: int = 0


@dataclass(slots=True)
class MissingBodyWatch:
    """How long the first synced position whose body is not here has been the first. A
    DC that catches up fetches bodies after ordering them, and the position moves on as
    they arrive; one that stays has a body no peer sends, and this DC's workers wait at
    it for good. That happened silently, the DC healthy: a peer of 0.1.0 truncated bodies
    a DC back from a restart had ordered and not fetched (docs/operations.md, "Upgrading
    from 0.1.0")."""

    position: int = 0
    """0: every synced body is here."""
    since_s: float = 0.0

    def waited_s(self, first_missing: int, now_s: float) -> float:
        """Seconds ``first_missing`` (0: none) has been the first missing, as observed
        now; the store observes at every progress report and status call."""
        if first_missing != self.position:
            self.position, self.since_s = first_missing, now_s
        return now_s - self.since_s if first_missing else 0.0


@dataclass(frozen=True, slots=True)
class TruncationHold:
    """How far truncation may go now, and what keeps it from going further."""

    below: int
    """Synced positions below this one may be truncated (0: none)."""
    held_by: str
    """What stops it at ``below`` ("" if only ``history_kept`` or the synced end does)."""
    let_go: tuple[tuple[str, int], ...] = ()
    """Peers whose order is further behind than ``peer_hold_max`` (as named in
    ``held_by``, with how far their order came), which hold nothing: truncation passes
    their order's end, and each starts from a copy of another DC when back
    (docs/dc-snapshots.md)."""


def truncation_hold(
    state: StoreState,
    progress: Progress,
    *,
    witness: bool,
    history_kept: int,
    history_kept_ms: int,
    first_unfinished: int,
    now_ms: int,
    peer_hold_max: int = 0,
) -> TruncationHold:
    """Truncation keeps what a peer DC or a worker of this DC has not passed, what is not
    finished here (its state record would find no transaction: ``first_unfinished``),
    the newest ``history_kept`` positions, and what finished within ``history_kept_ms``
    of ``now_ms``. A witness has no workers: only the peers count there. A peer whose
    order is further behind than ``peer_hold_max`` positions (0: no bound) is let go,
    where truncation then passes its order's end: one down for long would hold the
    others' memory and disk for as long as it is away."""
    end = state.synced_len
    passed: list[tuple[int, str]] = []
    if pending := state.pending_membership():
        # A node it adds replays the order from position 1, fetched from its peers'
        # txlogs (``check_can_join``). Until the configuration has it, the peers'
        # reports leave it out: this DC keeps what it holds of the history meanwhile,
        # so that one DC at least (the one that took it) can serve the new one. (The
        # simulator: a node added while every DC truncated waited for ever, seed 3 of
        # `membership`; and every DC truncated between syncing an add and installing
        # it, seed 1002.)
        passed.append((0, f"membership change {pending}, not applied yet"))
    if not progress.peers_reported and not progress.peer_synced_len:
        passed.append((0, "the sync-coordinator, which has not reported the peers yet"))
    peers_passed = [(length, f"peer {peer}") for peer, length in progress.peer_synced_len.items()]
    if state.view is not None:
        # A node the installed configuration added is in the coordinator's reports
        # from its next one on (each ``PROGRESS_REPORT_S``); until then the last report
        # names the peers before the change, and truncating on it dropped what the new
        # node was about to fetch (the simulator, with rotations: seed 103 of
        # `membership`, five nodes).
        reported = progress.peer_synced_len
        peers_passed += [
            (0, f"peer {node}, not reported yet")
            for node, _ in state.view.configuration.weights
            if node != state.node_id and node not in reported
        ]
    if not witness:
        if progress.workers_min_position is None:
            passed.append((0, "the worker-dispatch, which has not reported the workers yet"))
        else:
            passed.append((progress.workers_min_position, "the slowest worker"))
        passed.append((first_unfinished - 1, "unfinished transactions"))

    for adopter, hold in copy_leases(progress, end, now_ms, peer_hold_max).items():
        passed.append((hold, f"a copy for {adopter}"))
    removed_end = state.removed_order_end

    def bound(holds: list[tuple[int, str]]) -> tuple[int, str]:
        """The highest position truncation may drop below ``holds``, and what holds it."""
        through, holder = min(holds, key=lambda limit: limit[0], default=(end, ""))
        kept_from_end = max(0, end - history_kept)
        if through >= kept_from_end:
            through, holder = kept_from_end, ""
        if history_kept_ms:
            recent = finished_before(state, now_ms - history_kept_ms, through)
            # The age window is bounded in count too: at a batched load's rate, 10 s
            # held 17,000 transactions (about 50 MB) that waits no longer need (they
            # find truncated verdicts).
            recent = max(recent, end - max(history_kept, HISTORY_KEPT_BY_AGE_MOST))
            if recent < through:
                through, holder = recent, ""
        # A node the configuration left out may be added again, and catch up from the
        # logs if its order ends past the history's start: truncation stopping between
        # the bodies it holds and that end left them gone everywhere
        # (``removed_order_end``). Inside ``bound`` so that a peer is let go only when
        # truncation passes its order's end after this hold too.
        if state.synced_offset < through <= removed_end:
            through = state.synced_offset
            holder = f"a removed node, whose order may reach {removed_end},"
        return through, holder

    # A peer whose order is further behind than ``peer_hold_max`` is let go: it holds
    # nothing, and starts from a copy when back. Only if truncation then passes its
    # order's end: one that stopped between the bodies it holds and that end would
    # find the history it asks for still here and the bodies it lacks gone, and wait
    # for them for good (the simulator: seed 98 of `delay,drop,duplicate,reorder,crash`,
    # three nodes, a bound of 4). Such a peer holds what its bodies lack, as before.
    ordered = progress.peer_ordered_len if peer_hold_max else {}
    released = {
        f"peer {peer}": length
        for peer, length in ordered.items()
        if peer in progress.peer_synced_len and length < end - peer_hold_max
    }
    while True:
        holding = [(length, peer) for length, peer in peers_passed if peer not in released]
        through, holder = bound(passed + holding)
        stuck = [peer for peer, length in released.items() if length >= through]
        if not stuck:
            break
        for peer in stuck:
            del released[peer]
    core = progress.core_history_len
    if core is not None and core < through:
        through, holder = core, "the sync-coordinator's core"
    if holder:
        holder = f"{holder} at {through} ({end - through} behind)"
    return TruncationHold(through + 1 if through else 0, holder, tuple(released.items()))


def kept_on_purpose(history_kept: int, history_kept_ms: int) -> int:
    """The most newest positions truncation keeps whoever passed them: ``history_kept``,
    or the age window's cap if that is larger and the window is on."""
    return max(history_kept, HISTORY_KEPT_BY_AGE_MOST if history_kept_ms else 0)


def unpassed(state: StoreState, progress: Progress, *, first_unfinished: int) -> tuple[int, str]:
    """How many synced positions lie past what the slowest of the live pipeline passed,
    and which it is: a peer in the installed view, this DC's slowest worker, what is
    unfinished here, or the coordinator's core (which truncation waits for, newest
    positions kept on purpose included: ``history_kept``, the age window). These are
    what hold history in memory while every DC is up; the store refuses its own clients'
    submits past ``--unpassed-max`` (flow control, as Galera's), so that a burst cannot
    fill memory the allocator then keeps (``docs/transaction-store.md``,
    "Backpressure"). A peer out of the view, a copy's lease or a removed node hold
    history too, but are left out: one DC away must not stop the others' submits
    (``--peer-hold-max`` bounds what they hold). (0, "") until the coordinator and the
    dispatch have reported: a store just started refuses nothing for lack of news."""
    if not progress.peers_reported or progress.workers_min_position is None:
        return 0, ""
    end = state.synced_len
    members = (
        set(state.view.view.members) if state.view is not None else set(progress.peer_synced_len)
    )
    holds = [(progress.workers_min_position, "the slowest worker")]
    holds.append((first_unfinished - 1, "the first unfinished transaction"))
    # A peer counts by its order (its latest post, else as recorded), not by the bodies
    # it holds: one that waits for a body no DC sends (``MissingBodyWatch``) must not
    # stop every DC's submits for good, nor one of a release that does not say what it
    # holds (0.1.0 says 0: in a mixed-release CI run dc1 and dc2 refused every submit
    # while dc3 ran 0.1.0, and the upgrade stopped).
    holds += [
        (
            progress.peer_posted_len.get(peer, progress.peer_ordered_len.get(peer, length)),
            f"peer {peer}",
        )
        for peer, length in progress.peer_synced_len.items()
        if peer in members
    ]
    # The core hears how far the store may truncate a report after the store found it,
    # and the store truncates no further until it has: at a batched load's rate that
    # report's delay held 2,000-6,000 positions. Only below what the rest allows: where
    # a peer away holds truncation, the core stops there too, and must not count.
    core = progress.core_history_len
    if core is not None and core < progress.allowed_through:
        holds.append((core, "the sync-coordinator's core"))
    through, holder = min(holds, key=lambda hold: hold[0])
    through = max(through, state.synced_offset)
    return max(0, end - through), holder


def copy_leases(progress: Progress, end: int, now_ms: int, peer_hold_max: int) -> dict[str, int]:
    """Adopter -> the position up to which each live copy lease lets truncation go: the
    copy's position, or how far the adopter came since, whichever is further.

    A lease ends when its time is out, when the adopter holds truncation as a peer
    again (it reported synced past the copy's position, within ``peer_hold_max`` of the
    end), when it left the configuration (the coordinator's report leaves it out), or
    when it would hold more than ``peer_hold_max`` positions, as a peer down for long
    would (0: no bound). An ended lease stays ended: the store drops it at the report
    that ends it (``live_copy_leases``), so a peer that later falls behind holds as any
    peer does, not as the copy's adopter. Without a lease, the adopter (silent while
    it copies, so let go past ``peer_hold_max``) found, when its copy arrived, every
    peer truncated past its position, and needed another copy: for ever, for a database
    slower to send than the peers' truncation."""
    held = {}
    for adopter, lease in progress.copy_leases.items():
        synced = progress.peer_synced_len.get(adopter, 0)
        hold = max(lease.position, synced)
        if now_ms >= lease.until_ms:
            continue
        if progress.peers_reported and adopter not in progress.peer_synced_len:
            continue  # no longer configured: it holds nothing, as a removed peer
        if peer_hold_max and end - hold > peer_hold_max:
            continue
        if synced >= lease.position and (not peer_hold_max or end - synced <= peer_hold_max):
            continue  # held as a peer from here on
        held[adopter] = hold
    return held


def take_copy_lease(progress: Progress, adopter: str, position: int, now_ms: int) -> None:
    """A copy at ``position`` goes to ``adopter`` (``ExportBase``): its lease replaces
    any earlier one of that adopter."""
    progress.copy_leases[adopter] = CopyLease(position, now_ms + COPY_LEASE_MS)


def live_copy_leases(
    progress: Progress, end: int, now_ms: int, peer_hold_max: int
) -> dict[str, CopyLease]:
    """The leases ``copy_leases`` still holds, to replace ``progress.copy_leases`` with
    at each report (the others ended for good)."""
    live = copy_leases(progress, end, now_ms, peer_hold_max)
    return {adopter: lease for adopter, lease in progress.copy_leases.items() if adopter in live}


def peers_ordered(state: StoreState, progress: Progress) -> dict[str, int]:
    """How far each peer's order came, to record with a truncation or snapshot
    (``StoreState.peers_ordered``): as the coordinator reports it (every peer it heard
    from since it started, ``peer_posted_len``; a coordinator of an earlier release
    names only those it may let go), and as recorded before for the peers it has not
    heard from. A peer out of the configuration goes. Without the record, a coordinator
    that restarted while a DC was away reported that DC at 0, and its store held every
    transaction until it came back (``bench.soak --dc-down-s``: 73,288, 250 MiB)."""
    recorded = {**state.peers_ordered, **progress.peer_ordered_len, **progress.peer_posted_len}
    if progress.peers_reported:
        configured = progress.peer_synced_len
        return {peer: at for peer, at in recorded.items() if peer in configured}
    return recorded


def within_core(below: int, core_history_len: int | None) -> int:
    """``below`` (0: none) lowered to what the coordinator's core has heard may go
    (``Progress.core_history_len``): the core learns where the history starts from the
    answers to its reports, so truncating past what it knows let it serve a DC added
    meanwhile, from memory, metas whose bodies every DC had dropped (a real 4-DC
    cluster: the new DC waited for them for good). It truncates at the next report."""
    through = below - 1 if below else 0
    if core_history_len is not None and core_history_len < through:
        through = core_history_len
    return through + 1 if through else 0


def finished_before(state: StoreState, cutoff_ms: int, through: int) -> int:
    """The last position up to ``through`` before the first one that finished after
    ``cutoff_ms`` (``history_kept_ms``). Only the positions truncation would drop are
    looked at: the scan stops at the first recent one."""
    position = state.synced_offset + 1
    while position <= through:
        meta = state.synced_at(position - 1)
        record = state.txs.get(meta.tx_id) if meta is not None else None
        if record is None or not record.history or record.history[-1].at_unix_ms > cutoff_ms:
            break
        position += 1
    return position - 1


class Verdict(NamedTuple):
    """What a client waiting on a truncated transaction is told: its outcome's fields,
    not the outcome itself. A message parsed as part of a request keeps that whole
    request's memory alive (protobuf's arenas): kept for 32,768 transactions, the
    outcomes took 1.4 KB each, and the store's RSS grew with the history again."""

    state: TxState
    position: int
    rows_affected: tuple[int, ...]
    error: str
    duplicate_of: str

    @classmethod
    def of(cls, state: TxState, outcome: Outcome | None) -> Verdict:
        if outcome is None:
            return cls(state, 0, (), "", "")
        return cls(
            state, outcome.position, tuple(outcome.rows_affected), outcome.error,
            outcome.duplicate_of,
        )  # fmt: skip

    def into(self, message: common_pb2.Outcome) -> None:
        """Set ``message`` (empty, or a field of a message being built) to this."""
        message.state = common_pb2.TxState.ValueType(self.state.value)
        message.position = self.position
        message.rows_affected[:] = self.rows_affected
        message.error = self.error
        message.duplicate_of = self.duplicate_of


@dataclass(frozen=True, slots=True)
class CarriedBodies:
    """The bodies a rotation carries into the new log, not yet filed among the bodies:
    what each one's entry holds, read on the loop under the store's lock (a record may
    change), as lists side by side, and encoded one at a time as the new file is
    written (``carried_entries``). Lists of references are one allocation each, however
    many bodies; a tuple a body, and every entry encoded ahead and held for the
    rotation's length, were thousands of small objects made in a burst under a batched
    load, and the pools they were spread over outlived it (issue 47: each store's
    high-water mark was set by its first rotation under that load)."""

    tx_ids: list[str]
    bodies: list[bytes]
    digests: list[bytes]
    memberships: list[bool]
    traceparents: list[str]

    @classmethod
    def of(
        cls, tx_ids: list[str], bodies: Mapping[str, bytes], records: Mapping[str, TxRecord]
    ) -> CarriedBodies:
        """The bodies of ``tx_ids`` (each in ``bodies``, with its record in ``records``)."""
        return cls(
            tx_ids,
            [bodies[tx_id] for tx_id in tx_ids],
            [records[tx_id].body_digest for tx_id in tx_ids],
            [records[tx_id].membership for tx_id in tx_ids],
            [records[tx_id].traceparent for tx_id in tx_ids],
        )


def carried_entries(carried: CarriedBodies, now_ms: int) -> Iterator[bytes]:
    """The ``BodyStored`` entries (``carried``) a rotation writes after its snapshot,
    encoded, one at a time (``CarriedBodies``): as messages, thousands of them held
    while a rotation ran cost about 2 KB each (``txlog.files.SnapshotForm`` has the
    measure), and as bytes still a small object each."""
    fields = zip(
        carried.tx_ids, carried.bodies, carried.digests, carried.memberships,
        carried.traceparents, strict=True,
    )  # fmt: skip
    for tx_id, body, digest, membership, traceparent in fields:
        stored = txlog_pb2.BodyStored(
            tx_id=tx_id, body_digest=digest, body_bytes=len(body), body=body,
            membership=membership, traceparent=traceparent, carried=True,
        )  # fmt: skip
        yield txlog_pb2.LogEntry(at_unix_ms=now_ms, body_stored=stored).SerializeToString()


def split_by_budget(
    tx_ids: list[str], bodies: Mapping[str, bytes], budget: int
) -> tuple[list[str], list[str]]:
    """Of ``tx_ids``, those whose ``bodies`` fit ``budget`` bytes (in order: the oldest
    first), and the rest."""
    taken = 0
    for index, tx_id in enumerate(tx_ids):
        taken += len(bodies[tx_id])
        if taken > budget:
            return tx_ids[:index], tx_ids[index:]
    return tx_ids, []
