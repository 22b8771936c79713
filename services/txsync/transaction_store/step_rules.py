"""The store's rules for a protocol step and for state changes (issue 53): pure
functions of the store's state (``StoreState``) and the time, given as ``now_ms``. Each
validates a request in full and returns the log entries that make it (changing
nothing), or raises a ``Refusal`` naming the rule broken. No I/O, clock, lock or gRPC
inside: ``TransactionStore`` calls them under its lock and stages what they return, and
a simulator can run the same rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from txsync.codec import base_to_proto, meta_to_proto
from txsync.protocol import IMPLIED_STATES, MergeBase, TxMeta, TxState, is_allowed_transition
from txsync.refusals import Refusal, Refused
from txsync.transaction_store.state import FINAL_STATES, StoreState, TxRecord
from txsync.transaction_store.validation import check_tx_id, invalid
from txsync.v1 import common_pb2, txlog_pb2


@dataclass(frozen=True, slots=True)
class StateChangeRequest:
    """One transaction's next state, as a coordinator's step or the dispatch asks for it."""

    tx_id: str
    state: TxState
    outcome: common_pb2.Outcome | None = None
    at_unix_ms: int = 0
    """When the sender made the change; 0: now. Kept within the record's last step and now."""


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
    installed_view: common_pb2.ViewProposal | None = None
    vote: common_pb2.ViewVote | None = None
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
        entries.append(
            _entry(now_ms, view_installed=txlog_pb2.ViewInstalled(installed=installed_view))
        )
    if vote is not None:
        entries.append(_entry(now_ms, view_voted=vote))
    synced_ids = {meta.tx_id for meta in synced}
    entries.extend(
        plan_changes(
            state, step.changes, step.service, now_ms, newly_synced=synced_ids, incoming=incoming
        )
    )
    return entries


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
