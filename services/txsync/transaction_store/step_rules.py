"""The store's rules for a protocol step, peers' bodies, local submits' stamps and state
changes (issue 53): pure functions of the store's state (``StoreState``) and the time,
given as ``now_ms``. Each validates a request in full and returns the log entries that
make it (changing nothing), or raises a ``Refusal`` naming the rule broken. No I/O,
clock, lock or gRPC inside: ``TransactionStore`` calls them under its lock and stages
what they return, and the simulator's store (``sim/store.py``) runs the same rules on
the same ``StoreState``, so a write the store would refuse fails a seed.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field

from txsync.codec import base_to_proto, meta_to_proto, proposal_to_proto, vote_to_proto
from txsync.protocol import (
    IMPLIED_STATES,
    MergeBase,
    PersistViewVote,
    TxMeta,
    TxState,
    ViewProposal,
    is_allowed_transition,
)
from txsync.refusals import Refusal, Refused
from txsync.transaction_store.state import (
    ABSENT_SYNCED_MAX,
    FINAL_STATES,
    Moved,
    StoreState,
    TxRecord,
    needs_no_body,
)
from txsync.transaction_store.validation import STATE_CHANGES_MAX, check_tx_id, invalid
from txsync.v1 import common_pb2, txlog_pb2


@dataclass(frozen=True, slots=True)
class StateChangeRequest:
    """One transaction's next state, as a coordinator's step or the dispatch asks for it."""

    tx_id: str
    state: TxState
    outcome: common_pb2.Outcome | None = None
    at_unix_ms: int = 0
    """When the sender made the change; 0: now. Kept within the record's last step and now."""


PROTOCOL_STATE_SYNCED_MAX = 100_000
"""Synced entries a coordinator loads at start (the newest)."""


@dataclass(frozen=True, slots=True)
class ProtocolState:
    """What a new coordinator incarnation starts from (``load_protocol_state``)."""

    epoch: int
    counter: int
    merge_base: MergeBase
    synced_tail: list[TxMeta]
    incoming: list[tuple[TxMeta, bool]]
    """Incoming metas and whether each body is held."""
    synced_unacquired: list[TxMeta]
    view: ViewProposal | None
    vote: PersistViewVote | None
    history_len: int = 0
    """The history starts after this synced length (what was truncated)."""


def protocol_state(state: StoreState) -> ProtocolState:
    """The protocol's durable state as a coordinator loads it (the store reads it right
    after staging the new epoch's entry)."""
    txs = state.txs
    return ProtocolState(
        epoch=state.epoch,
        counter=state.counter,
        merge_base=state.merge_base,
        synced_tail=state.synced[-PROTOCOL_STATE_SYNCED_MAX:],
        incoming=[(meta, txs[meta.tx_id].body_held) for meta in state.incoming.values()],
        synced_unacquired=[m for m in state.synced if not needs_no_body(txs[m.tx_id])],
        view=state.view,
        vote=state.vote,
        history_len=state.history_len,
    )


PeerBody = tuple[str, bytes, bytes, str]
"""A body a peer sent: (tx_id, encoded TxBody, the origin's digest, traceparent)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolStep:
    """One step of the coordinator's protocol core, as the store makes it durable."""

    counter: int = 0
    """0 leaves the counter as it is; otherwise it must not be lower than the counter the
    coordinator wrote last."""
    local_seq: int = 0
    """The highest local submit the coordinator had stepped (logged with ``counter``)."""
    incoming: Sequence[TxMeta] = ()
    synced_start: MergeBase | None = None
    """The base the synced entries extend (must be the stored merge base)."""
    synced: Sequence[TxMeta] = ()
    changes: Sequence[StateChangeRequest] = ()
    service: str = "sync-coordinator"
    """Kept in the transactions' history."""
    forgotten: Sequence[str] = ()
    installed_view: ViewProposal | None = None
    vote: PersistViewVote | None = None
    bodies: Sequence[PeerBody] = ()
    """Peers' bodies the step acquires, written ahead of its other entries (one held
    already is skipped); one that fails its checks fails the step."""


def plan_step(state: StoreState, step: ProtocolStep, now_ms: int) -> list[txlog_pb2.LogEntry]:
    """Validate a protocol step completely, then return its entries, each stamped
    ``now_ms`` (changes nothing).

    Entry order: counter, forgotten metas, metas, synced append, view, vote, states.
    (The coordinator never forgets and re-learns a meta within one step.)
    """
    counter, incoming, synced = step.counter, step.incoming, step.synced
    synced_start, forgotten = step.synced_start, step.forgotten
    installed_view, vote = step.installed_view, step.vote
    entries: list[txlog_pb2.LogEntry] = []
    if counter:
        if counter < state.coordinator_counter:
            raise Refusal(
                Refused.PRECONDITION,
                f"counter {counter} is below the stored {state.coordinator_counter}: "
                "counters only rise",
            )
        raised = txlog_pb2.CounterRaised(counter=counter, local_seq=step.local_seq)
        entries.append(_entry(now_ms, counter=raised))
    if forgotten:
        for tx_id in forgotten:
            check_forgettable(state, tx_id)
        entries.append(
            _entry(now_ms, forgotten=txlog_pb2.IncomingForgotten(tx_ids=list(forgotten)))
        )
    for meta in incoming:
        check_tx_id(meta.tx_id, "incoming.tx_id")
        record = state.txs.get(meta.tx_id)
        if record is not None and record.position:
            raise Refusal(Refused.CONFLICT, f"tx {meta.tx_id} is already synced")
        restamped = record is not None and record.local and meta.origin == state.node_id
        if record is not None and record.meta not in (None, meta) and not restamped:
            raise Refusal(
                Refused.PRECONDITION,
                f"tx {meta.tx_id} is known as {record.meta}, not {meta}",
            )
        entries.append(_entry(now_ms, meta_known=txlog_pb2.MetaKnown(meta=meta_to_proto(meta))))
    if synced:
        if synced_start != state.merge_base:
            raise Refusal(
                Refused.PRECONDITION,
                f"synced append at {synced_start} does not extend the merge base "
                f"{state.merge_base}",
            )
        seen: set[str] = set()
        for meta in synced:
            check_tx_id(meta.tx_id, "synced.tx_id")
            record = state.txs.get(meta.tx_id)
            if (record is not None and record.position) or meta.tx_id in seen:
                raise Refusal(Refused.CONFLICT, f"tx {meta.tx_id} is already synced")
            seen.add(meta.tx_id)
        entries.append(
            _entry(
                now_ms,
                synced=txlog_pb2.SyncedAppended(
                    start=base_to_proto(state.merge_base),
                    metas=[meta_to_proto(m) for m in synced],
                ),
            )
        )
    if installed_view is not None:
        if installed_view.view.view_no <= state.view_no:
            raise Refusal(
                Refused.PRECONDITION,
                f"view {installed_view.view.view_no} is not newer than the installed "
                f"view {state.view_no}",
            )
        installed = txlog_pb2.ViewInstalled(installed=proposal_to_proto(installed_view))
        entries.append(_entry(now_ms, view_installed=installed))
    if vote is not None:
        entries.append(_entry(now_ms, view_voted=vote_to_proto(vote)))
    synced_ids = {meta.tx_id for meta in synced}
    entries.extend(
        plan_changes(
            state, step.changes, step.service, now_ms, newly_synced=synced_ids, incoming=incoming
        )
    )
    return entries


@dataclass(frozen=True, slots=True)
class StoredBody:
    """A peer's body to store, checked already (``validation.check_peer_body``)."""

    tx_id: str
    encoded: bytes
    digest: bytes
    traceparent: str
    membership: bool


@dataclass(slots=True)
class BodyEntries:
    """What storing some peers' bodies writes (``plan_bodies``)."""

    entries: list[txlog_pb2.LogEntry] = field(default_factory=list)
    traced: list[str] = field(default_factory=list)
    """Bodies whose trace context arrives with them."""


def plan_bodies(state: StoreState, bodies: Sequence[StoredBody], now_ms: int) -> BodyEntries:
    """The entries that store the bodies not held yet, each once."""
    planned = BodyEntries()
    taken: set[str] = set()
    for body in bodies:
        record = state.txs.get(body.tx_id)
        if (record is not None and record.body_held) or body.tx_id in taken:
            continue
        taken.add(body.tx_id)
        if body.traceparent and not (record and record.traceparent):
            planned.traced.append(body.tx_id)
        stored = txlog_pb2.BodyStored(
            tx_id=body.tx_id,
            body_digest=body.digest,
            body_bytes=len(body.encoded),
            body=body.encoded,
            membership=body.membership,
            traceparent=body.traceparent,
        )
        planned.entries.append(_entry(now_ms, body_stored=stored))
    return planned


def stamps_at_clock(state: StoreState, submits: int) -> bool:
    """Whether a call's local submits are stamped at least at the wall clock: when the
    DC is under load, else one above the staged counter.

    Under load, a stamp one above the staged counter is passed by any peer's post
    that raised the core's counter between the submit's write and its hand-over, and
    the core then stamps it anew: a write and an fsync the stamp was meant to save.
    At the clock only a post naming a stamp made later passes it. Measured at 16
    single-submit clients per DC (docs/benchmarks.md, Tuning 23 and 25): renewals
    0.6 -> 0.1 per transaction and 12% fewer ``PersistSteps``; throughput 13% higher
    in one hour's pairs, within the spread in another's.

    With one client per DC the clock costs latency at 50 ms RTT (p50 +5 ms): an
    ADD takes metas only up to the lowest counter the members posted, and stamps
    spread apart by real time leave a quiet DC's counter behind the others'. So
    the clock is used only while another local submit is on its way to its post
    (stamped and not yet settled, or waiting for a stamp) or a call brings several:
    signs of load a lone client never gives. Correctness never depends on it: the
    core stamps anew whatever it has passed."""
    return submits > 1 or bool(state.unsettled) or bool(state.pending_local)


def stamp_floor(state: StoreState, clock_us: int) -> int:
    """The stamp a call's first submit goes one above (each next one above the one
    before): every counter and timestamp staged, and ``clock_us`` (0: no clock)."""
    return max(state.counter, clock_us - 1)


def check_can_join(state: StoreState, node_id: str, *, from_snapshot: bool = False) -> None:
    """A node that joins replays the order from position 1, fetched from its peers'
    txlogs. Once this DC truncated the start of its history, a new node would wait for
    it for ever, and every DC would hold its truncation back for that node (at position
    0) from then on: refused, unless the new DC can start past its peers' truncation
    from a copy of a DC (``from_snapshot``: this DC can export one, docs/dc-snapshots.md;
    the simulator's DCs always can). A node already
    configured (a new address) is no join. (Once the entry is taken, this DC truncates
    nothing until it is applied: ``retention.truncation_hold``.)"""
    view = state.view
    configured = view is not None and any(node == node_id for node, _ in view.configuration.weights)
    offset = state.synced_offset
    if offset and not configured and not from_snapshot:
        raise Refusal(
            Refused.PRECONDITION,
            f"{node_id} cannot join: {state.node_id} truncated synced positions "
            f"1-{offset}, and a new DC replays the order from position 1 unless it "
            f"starts from a copy of a DC, which {state.node_id} cannot export (it has no "
            'worker-dispatch; docs/operations.md, "Adding a DC")',
        )


@dataclass(frozen=True, slots=True)
class BaseAdoption:
    """A copy of a source DC's worker database at ``meta``'s position, with what the
    source's store says of it (docs/dc-snapshots.md)."""

    meta: TxMeta
    """The synced entry at the copy's position Q."""
    before: MergeBase
    """The source's base at Q - 1 (its entry at Q - 1, truncated or not)."""
    final_state: TxState
    """How the copy applied ``meta``: OK or FAILED."""
    counter: int
    """The source's counter."""
    synced_own: tuple[tuple[int, str], ...] = ()
    """The adopter's own transactions the source synced before the copy's position and
    past the adopter's synced end: (position, tx id). It may hold them as incoming."""


def export_base(
    state: StoreState, position: int, final_state: TxState, adopter: str, adopter_len: int
) -> BaseAdoption:
    """What a source DC's store says of a copy of its worker database at ``position``
    (the testing worker's, applied ``final_state``), for DC ``adopter`` whose synced
    queue ends at ``adopter_len`` to adopt: with the adopter's own transactions synced
    in between, from the history held and from ``synced_for_the_absent`` (docs/dc-
    snapshots.md). Every one of them is there: this DC truncates what a configured
    peer reported passing only, and lists what it truncates of any other origin.

    Refused where the adopter could not go on from it: a position whose entry or the
    one before it this store no longer holds (a truncation in place keeps only the id of
    its last entry; the copy is asked again once the worker applied further), one past
    the synced end, and one at or past a membership entry no installed configuration
    applied yet: the adopter's membership follower starts after the position, so it
    would never learn that change (the views it installs carry the applied ones)."""
    meta = state.synced_at(position - 1)
    before = state.base_at(position - 1)
    if meta is None or before is None:
        raise Refusal(
            Refused.TRUNCATED if position <= state.synced_len else Refused.PAST_END,
            f"{state.node_id} holds synced positions {state.synced_offset + 1}-"
            f"{state.synced_len}: a copy at {position} needs {position - 1} and {position}",
        )
    pending = state.pending_membership()
    record = state.txs.get(pending) if pending else None
    if record is not None and 0 < record.position <= position:
        raise Refusal(
            Refused.PRECONDITION,
            f"the membership entry at position {record.position} is not applied yet: "
            f"a copy at {position} waits for the view that applies it",
        )
    lost = state.absent_lost.get(adopter, 0)
    if lost > adopter_len:
        raise Refusal(
            Refused.PRECONDITION,
            f"{state.node_id} kept no list of what it synced for {adopter} up to position "
            f"{lost} (over {ABSENT_SYNCED_MAX} of its transactions): {adopter} catches "
            "up from a peer that holds its history instead",
        )
    listed = state.synced_for_the_absent.get(adopter, {})
    synced_own = [(at, tx_id) for tx_id, at in listed.items() if adopter_len < at <= position]
    for at in range(max(adopter_len, state.synced_offset) + 1, position + 1):
        held = state.synced_at(at - 1)
        if held is not None and held.origin == adopter:
            synced_own.append((at, held.tx_id))
    return BaseAdoption(meta, before, final_state, state.counter, tuple(sorted(synced_own)))


def plan_base_adopted(state: StoreState, adoption: BaseAdoption, now_ms: int) -> txlog_pb2.LogEntry:
    """The entry that starts this DC at the adoption's position Q (``BaseAdopted``).

    Only a DC behind Q may. Its own incoming metas stay, but for those the copy names
    as synced already (``BaseAdoption.synced_own``): the others' metas it forgets (their
    origins post again what they have not synced)."""
    q = adoption.before.synced_len + 1
    if q <= state.synced_len:
        raise Refusal(
            Refused.PRECONDITION,
            f"{state.node_id} holds synced positions up to {state.synced_len}: "
            f"nothing to adopt at {q}",
        )
    if adoption.final_state not in FINAL_STATES:
        raise invalid(f"final_state: {adoption.final_state.name} is not OK or FAILED")
    check_tx_id(adoption.meta.tx_id)
    adopted = txlog_pb2.BaseAdopted(
        synced_offset=adoption.before.synced_len,
        last_tx_id=adoption.before.last_tx_id if adoption.before.synced_len else "",
        meta=meta_to_proto(adoption.meta),
        final_state=common_pb2.TxState.ValueType(adoption.final_state.value),
        counter=adoption.counter,
    )
    for at, tx_id in adoption.synced_own:
        adopted.synced_own.add(origin=state.node_id, position=at, tx_id=tx_id)
    return _entry(now_ms, base_adopted=adopted)


def check_membership_change(
    state: StoreState,
    change: common_pb2.MembershipChange,
    peers_progress: Mapping[str, int],
    *,
    adds: bool,
    joins_from_snapshot: bool = False,
) -> int:
    """Whether the admin API may take ``change`` here, and the ``after_position`` it is
    taken against: the position of the membership entry the installed configuration
    reflects. Another change ordered before it voids it (``Configuration.is_void_after``),
    so "one change at a time" holds across the cluster, not only at this DC.

    Refused: adding a node once this DC truncated its history, unless it joins from a
    snapshot (``check_can_join``); any
    change while one known here is not applied yet; and removing a node while another
    node of the configuration has not come as far as the position where the
    configuration last changed (``peers_progress``, as the coordinator reports it): a
    node added then replays history that the DCs truncated before they learned of it,
    which the DC that took the add may alone hold (the simulator, seed 1510 of
    ``membership``: dc5 took dc6's add, was removed before dc6 had synced anything,
    and dc6 waited for ever)."""
    if adds:
        check_can_join(state, change.node_id, from_snapshot=joins_from_snapshot)
    if pending := state.pending_membership():
        raise Refusal(
            Refused.PRECONDITION,
            f"membership change {pending} is not applied yet: one change at a time "
            "(retry once the view that applies it is installed)",
        )
    configuration = state.view.configuration if state.view is not None else None
    applied = configuration.applied_position if configuration is not None else 0
    if change.weight == 0 and configuration is not None:
        for node, _ in configuration.weights:
            come = peers_progress.get(node, 0)
            if node in (state.node_id, change.node_id) or come >= applied:
                continue
            raise Refusal(
                Refused.PRECONDITION,
                f"{change.node_id} cannot be removed yet: {node} has synced {come} "
                f"positions, short of {applied}, where the configuration last changed; a "
                f"DC added since may need history that only {change.node_id} holds (wait "
                f"until {node} has caught up, or remove {node} first)",
            )
    return applied


def check_forgettable(state: StoreState, tx_id: str) -> None:
    check_tx_id(tx_id, "forgotten")
    record = state.txs.get(tx_id)
    problem = None
    if record is None or record.meta is None:
        problem = "is not known here"
    elif record.local:
        problem = "was submitted here (an origin never forgets its own transactions)"
    elif record.position:
        problem = "is synced"
    # A held body is no reason to refuse: a peer's push may have stored it just
    # before the coordinator's core, not yet told, forgot the meta.
    if problem is not None:
        raise Refusal(Refused.PRECONDITION, f"tx {tx_id} {problem}")


def plan_changes(
    state: StoreState,
    changes: Sequence[StateChangeRequest],
    service: str,
    now_ms: int,
    *,
    newly_synced: set[str] | None = None,
    incoming: Sequence[TxMeta] = (),
    passed_is_repeat: bool = False,
) -> list[txlog_pb2.LogEntry]:
    """The entries of ``changes``, each a forward step of the lifecycle.

    ``passed_is_repeat``: a state the transaction has already passed (TESTING once it
    is OK) is a repeat, a no-op, rather than a step backwards. worker-dispatch needs
    this: a pipeline that restarts while its earlier states are still on their way
    here reads those positions as unfinished and records TESTING again, after the
    verdict it sent before (refusing that refused the whole batch, every retry, and
    stopped the DC recording outcomes for good). Two different verdicts still are
    refused."""
    entries: list[txlog_pb2.LogEntry] = []
    pending: dict[str, TxState | None] = {}
    learned: set[str] | None = None  # the step's incoming ids, built if needed
    for change in changes:
        check_tx_id(change.tx_id, "changes.tx_id")
        record = state.txs.get(change.tx_id)
        if change.state in IMPLIED_STATES:
            # Written by no entry of its own: the meta, synced append or body that
            # implies it is (``state.py``). Only checked, as it was when written.
            if learned is None:
                learned = {meta.tx_id for meta in incoming}
            check_implied(change, record, learned, newly_synced or set())
            continue
        committed = record.state if record is not None else None
        current = pending.get(change.tx_id, committed)  # earlier in this request first
        if current is change.state:
            continue  # repeated: a no-op, so that retries are safe
        if passed_is_repeat and passed(current, change.state):
            continue
        if not is_allowed_transition(current, change.state):
            name = current.name if current is not None else "unknown"
            raise Refusal(
                Refused.PRECONDITION,
                f"tx {change.tx_id}: {name} -> {change.state.name} is not a forward step "
                "of INCOMING -> ACCEPTED -> ENQUEUED -> TESTING -> OK | FAILED",
            )
        if change.state in FINAL_STATES and change.outcome is None:
            raise invalid(f"tx {change.tx_id}: {change.state.name} needs an outcome")
        moved = txlog_pb2.StateMoved(
            tx_id=change.tx_id,
            state=common_pb2.TxState.ValueType(change.state.value),
            service=service,
        )
        if change.outcome is not None:
            moved.outcome.CopyFrom(change.outcome)
        entry = _entry(now_ms, state=moved)
        if change.at_unix_ms:
            # Reported late (TESTING with its outcome): the sender's time, within
            # what the history and this clock allow.
            since = record.history[-1].at_unix_ms if record and record.history else 0
            entry.at_unix_ms = max(since, min(change.at_unix_ms, entry.at_unix_ms))
        entries.append(entry)
        pending[change.tx_id] = change.state
    return entries


@dataclass(frozen=True, slots=True)
class VerdictPlan:
    """The entries of a dispatch's state changes (``plan_verdicts``)."""

    testing: list[txlog_pb2.LogEntry]
    """TESTING entries, applied in memory only until their outcome's entry carries them."""
    written: list[txlog_pb2.LogEntry]
    """The entries to write, in order."""
    settled: list[str]
    """Transactions whose unwritten TESTING a written entry now carries."""


def plan_verdicts(
    state: StoreState,
    changes: Sequence[StateChangeRequest],
    service: str,
    now_ms: int,
    testing_unwritten: Mapping[str, txlog_pb2.LogEntry],
) -> VerdictPlan:
    """worker-dispatch's TESTING, OK and FAILED (``plan_changes`` with a passed state a
    repeat).

    TESTING is written with the transaction's outcome, in the outcome's entry
    (``testing_at_unix_ms``), not on its own: alone it cost a log batch and, at low
    load, an fsync per transaction per DC; as an entry beside the outcome, a quarter of
    the log entries under load. Until then it is in memory only; a restart finds the
    transaction ENQUEUED, and the dispatch, which starts at the first unfinished
    position, tests it again (the testing worker answers from its record). The log
    keeps the whole history, the pipeline's timings included."""
    if len(changes) > STATE_CHANGES_MAX:
        raise invalid(f"at most {STATE_CHANGES_MAX} changes per call")
    for change in changes:
        if change.state < TxState.TESTING:
            raise invalid(
                f"tx {change.tx_id}: dispatch moves transactions to TESTING, OK or FAILED "
                f"only, not {change.state.name}"
            )
    entries = plan_changes(state, changes, service, now_ms, passed_is_repeat=True)
    plan = VerdictPlan([], [], [])
    testing_now: dict[str, txlog_pb2.LogEntry] = {}
    for entry in entries:
        moving = entry.state
        if moving.state == TxState.TESTING.value:
            plan.testing.append(entry)
            testing_now[moving.tx_id] = entry
            continue
        testing = testing_now.pop(moving.tx_id, None)
        if testing is None:
            testing = testing_unwritten.get(moving.tx_id)
        if testing is not None:
            plan.settled.append(moving.tx_id)
        if testing is not None and testing.state.service == moving.service:
            moving.testing_at_unix_ms = testing.at_unix_ms  # memory has it: a repeat
        elif testing is not None:
            plan.written.append(testing)  # its own service: its own entry (a repeat too)
        plan.written.append(entry)
    return plan


def read_synced(
    state: StoreState, from_len: int, count_max: int, synced_durably: Callable[[str], bool]
) -> tuple[MergeBase, list[TxMeta]]:
    """Up to ``count_max`` synced entries from position ``from_len + 1`` on, and the base
    they start at: what a coordinator serves a lagging peer from the txlog. Only entries
    whose synced append is durable (``synced_durably``): ``state`` holds staged writes
    too, and an entry a crash then takes back may be sealed otherwise by a view change,
    after the peer appended it (persist before send, PROTOCOL.md rule 9)."""
    if from_len > state.synced_len:
        raise Refusal(
            Refused.PAST_END,
            f"from_len {from_len} is past the synced queue's end {state.synced_len}",
        )
    start = state.base_at(from_len)
    if start is None or from_len < state.history_len:
        raise Refusal(
            Refused.TRUNCATED,
            f"synced entries below position {state.history_len + 1} were truncated",
        )
    begin = from_len - state.synced_offset
    entries = state.synced[begin : begin + count_max]
    # Appends become durable in log order: the first one that is not marks the end.
    written = next(
        (n for n, meta in enumerate(entries) if not synced_durably(meta.tx_id)), len(entries)
    )
    return start, entries[:written]


def first_unfinished(state: StoreState, from_position: int, undurable: Container[str]) -> int:
    """The first synced position (1-based) from ``from_position`` on not yet OK or FAILED
    (one with its verdict in ``undurable``, still being written, counts as unfinished:
    truncated now, the waiter its staged write woke would find no record to answer
    with); one past the end if every one is."""
    position = max(from_position, state.synced_offset + 1)
    while position <= state.synced_len:
        meta = state.synced_at(position - 1)
        record = state.txs.get(meta.tx_id) if meta is not None else None
        if record is None or record.state not in FINAL_STATES or record.tx_id in undurable:
            break
        position += 1
    return position


def keep_testing(
    state: StoreState, plan: VerdictPlan, testing_unwritten: dict[str, txlog_pb2.LogEntry]
) -> list[Moved]:
    """Apply a plan's TESTING in memory and keep its entries until their outcomes carry
    them (``testing_unwritten``, the caller's); the transitions made."""
    moved: list[Moved] = []
    for entry in plan.testing:
        moved += state.apply(entry)
        testing_unwritten[entry.state.tx_id] = entry
    for tx_id in plan.settled:
        testing_unwritten.pop(tx_id, None)
    return moved


def check_implied(
    change: StateChangeRequest,
    record: TxRecord | None,
    learned: set[str],
    newly_synced: set[str],
) -> None:
    """A coordinator's INCOMING, ACCEPTED or ENQUEUED (sent only by coordinators of
    the previous version): refused where the fact that implies it is missing."""
    tx_id, state = change.tx_id, change.state
    known = (
        tx_id in learned
        or tx_id in newly_synced
        or (record is not None and record.meta is not None)
    )
    synced = tx_id in newly_synced or bool(record and record.position)
    problem = None
    if not known:
        problem = "its meta is not known here"
    elif state is not TxState.INCOMING and not synced:
        problem = "it is not in the synced queue"
    elif state is TxState.ENQUEUED and not (record and record.body_held):
        problem = "its body is not held here"
    if problem is not None:
        raise Refusal(
            Refused.PRECONDITION,
            f"tx {tx_id} cannot be {state.name}: {problem}",
        )


def passed(current: TxState | None, wanted: TxState) -> bool:
    """``current`` lies beyond ``wanted`` on the lifecycle (OK and FAILED are two ends,
    neither beyond the other)."""
    if current is None or (current in FINAL_STATES and wanted in FINAL_STATES):
        return False
    return current > wanted


def _entry(now_ms: int, **kwargs: object) -> txlog_pb2.LogEntry:
    return txlog_pb2.LogEntry(at_unix_ms=now_ms, **kwargs)  # type: ignore[arg-type]
