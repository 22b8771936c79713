"""The store's step rules as pure functions (``step_rules``): given a ``StoreState`` and
the time they plan entries or refuse, and change nothing; the entries they plan, applied,
move the state. How far truncation may go (``retention``) too. No store, file or event
loop here: what a simulator can run."""

from __future__ import annotations

import functools
import uuid

import pytest

from txsync.protocol import TxMeta, TxState
from txsync.refusals import Refusal, Refused
from txsync.transaction_store.retention import Progress, TruncationHold, truncation_hold
from txsync.transaction_store.state import StoreState
from txsync.transaction_store.step_rules import (
    ProtocolStep,
    StateChangeRequest,
    StoredBody,
    plan_bodies,
    plan_changes,
    plan_step,
    plan_verdicts,
    protocol_state,
    read_synced,
    stamp_floor,
    stamps_at_clock,
)
from txsync.v1 import common_pb2, txlog_pb2

NOW_MS = 1_700_000_000_000


def _synced_peer_tx(state: StoreState, stamp: int = 1) -> str:
    """A peer's transaction, synced and ENQUEUED here (its body held)."""
    tx_id = str(uuid.uuid4())
    meta = TxMeta(stamp, tx_id, "dc2")
    step = ProtocolStep(incoming=[meta], synced_start=state.merge_base, synced=[meta])
    for entry in plan_step(state, step, NOW_MS):
        state.apply(entry)
    body = common_pb2.TxBody(statements=[common_pb2.Statement(sql="SELECT 1")])
    encoded = body.SerializeToString()
    stored = txlog_pb2.BodyStored(tx_id=tx_id, body_bytes=len(encoded), body=encoded)
    state.apply(txlog_pb2.LogEntry(at_unix_ms=NOW_MS, body_stored=stored))
    assert state.txs[tx_id].state is TxState.ENQUEUED
    return tx_id


def test_a_step_is_planned_at_the_given_time_and_changes_nothing_until_applied() -> None:
    state = StoreState("dc1")
    tx_id = str(uuid.uuid4())
    meta = TxMeta(3, tx_id, "dc2")
    step = ProtocolStep(counter=3, incoming=[meta], synced_start=state.merge_base, synced=[meta])
    entries = plan_step(state, step, NOW_MS)
    assert [entry.WhichOneof("entry") for entry in entries] == ["counter", "meta_known", "synced"]
    assert {entry.at_unix_ms for entry in entries} == {NOW_MS}
    assert tx_id not in state.txs and state.merge_base.synced_len == 0  # planned only
    for entry in entries:
        state.apply(entry)
    assert state.txs[tx_id].position == 1 and state.merge_base.synced_len == 1
    again = ProtocolStep(synced_start=state.merge_base, synced=[meta])
    with pytest.raises(Refusal) as synced_twice:
        plan_step(state, again, NOW_MS)
    assert synced_twice.value.kind is Refused.CONFLICT


def test_a_step_that_breaks_a_rule_is_refused_by_kind() -> None:
    state = StoreState("dc1")
    for entry in plan_step(state, ProtocolStep(counter=5), NOW_MS):
        state.apply(entry)
    with pytest.raises(Refusal) as lower:
        plan_step(state, ProtocolStep(counter=4), NOW_MS)
    assert lower.value.kind is Refused.PRECONDITION and "counters only rise" in str(lower.value)
    stale = ProtocolStep(synced_start=state.merge_base, synced=[TxMeta(6, str(uuid.uuid4()), "x")])
    _synced_peer_tx(state, stamp=6)  # the merge base moves on: the step's start is stale
    with pytest.raises(Refusal) as fork:
        plan_step(state, stale, NOW_MS)
    assert fork.value.kind is Refused.PRECONDITION and "does not extend" in str(fork.value)
    with pytest.raises(Refusal) as unknown:
        plan_step(state, ProtocolStep(forgotten=[str(uuid.uuid4())]), NOW_MS)
    assert "is not known here" in str(unknown.value)


def test_state_changes_only_step_forward_and_a_repeat_is_a_no_op() -> None:
    state = StoreState("dc1")
    tx_id = _synced_peer_tx(state)
    ok = common_pb2.Outcome(state=common_pb2.TX_STATE_OK, position=1)
    finished = [
        StateChangeRequest(tx_id, TxState.TESTING),
        StateChangeRequest(tx_id, TxState.OK, ok),
    ]
    entries = plan_changes(state, finished, "worker-dispatch", NOW_MS)
    assert [TxState(entry.state.state) for entry in entries] == [TxState.TESTING, TxState.OK]
    for entry in entries:
        state.apply(entry)
    assert plan_changes(state, finished[1:], "worker-dispatch", NOW_MS) == []  # repeated
    with pytest.raises(Refusal) as backwards:
        plan_changes(state, finished[:1], "worker-dispatch", NOW_MS)
    assert backwards.value.kind is Refused.PRECONDITION
    # The dispatch's restart reports TESTING again after its verdict: a repeat for it.
    assert plan_changes(state, finished[:1], "wd", NOW_MS, passed_is_repeat=True) == []
    failed = common_pb2.Outcome(state=common_pb2.TX_STATE_FAILED, position=1)
    with pytest.raises(Refusal) as other_verdict:
        plan_changes(
            state, [StateChangeRequest(tx_id, TxState.FAILED, failed)], "wd", NOW_MS,
            passed_is_repeat=True,
        )  # fmt: skip
    assert "OK -> FAILED is not a forward step" in str(other_verdict.value)


def test_a_late_report_keeps_its_time_within_the_history_and_now() -> None:
    state = StoreState("dc1")
    tx_id = _synced_peer_tx(state)
    early = StateChangeRequest(tx_id, TxState.TESTING, at_unix_ms=NOW_MS - 60_000)
    late = StateChangeRequest(tx_id, TxState.TESTING, at_unix_ms=NOW_MS + 60_000)
    (kept_back,) = plan_changes(state, [early], "wd", NOW_MS)
    assert kept_back.at_unix_ms == NOW_MS  # not before the record's last step
    (clamped,) = plan_changes(state, [late], "wd", NOW_MS + 1_000)
    assert clamped.at_unix_ms == NOW_MS + 1_000  # not after now


def test_testing_waits_in_memory_and_rides_its_outcomes_entry() -> None:
    state = StoreState("dc1")
    tx_id = _synced_peer_tx(state)
    testing = StateChangeRequest(tx_id, TxState.TESTING)
    first = plan_verdicts(state, [testing], "worker-dispatch", NOW_MS, {})
    assert first.written == [] and len(first.testing) == 1  # nothing to write yet
    state.apply(first.testing[0])
    unwritten = {tx_id: first.testing[0]}
    ok = common_pb2.Outcome(state=common_pb2.TX_STATE_OK, position=1)
    verdict = StateChangeRequest(tx_id, TxState.OK, ok)
    second = plan_verdicts(state, [verdict], "worker-dispatch", NOW_MS + 5, unwritten)
    assert second.settled == [tx_id] and second.testing == []
    [entry] = second.written
    assert entry.state.testing_at_unix_ms == NOW_MS  # one entry: the outcome with TESTING
    assert unwritten == {tx_id: first.testing[0]}, "the plan changes nothing it is given"
    state.apply(entry)
    assert state.txs[tx_id].state is TxState.OK
    repeat = plan_verdicts(state, [testing], "worker-dispatch", NOW_MS, {})  # a restart's
    assert repeat.written == [] and repeat.testing == []
    failed = common_pb2.Outcome(state=common_pb2.TX_STATE_FAILED, position=1)
    with pytest.raises(Refusal, match="OK -> FAILED"):
        plan_verdicts(state, [StateChangeRequest(tx_id, TxState.FAILED, failed)], "x", NOW_MS, {})
    with pytest.raises(Refusal, match="TESTING, OK or FAILED only"):
        plan_verdicts(state, [StateChangeRequest(tx_id, TxState.ACCEPTED)], "x", NOW_MS, {})


def test_a_testing_by_another_service_is_written_as_its_own_entry() -> None:
    state = StoreState("dc1")
    tx_id = _synced_peer_tx(state)
    testing = plan_verdicts(
        state, [StateChangeRequest(tx_id, TxState.TESTING)], "old-dispatch", NOW_MS, {}
    ).testing
    state.apply(testing[0])
    ok = common_pb2.Outcome(state=common_pb2.TX_STATE_OK, position=1)
    plan = plan_verdicts(
        state, [StateChangeRequest(tx_id, TxState.OK, ok)], "worker-dispatch", NOW_MS,
        {tx_id: testing[0]},
    )  # fmt: skip
    assert [e.state.state for e in plan.written] == [TxState.TESTING.value, TxState.OK.value]


def test_bodies_are_planned_once_each_and_only_if_not_held() -> None:
    state = StoreState("dc1")
    held = _synced_peer_tx(state)
    new = str(uuid.uuid4())
    bodies = [
        StoredBody(held, b"x", b"d", "", False),
        StoredBody(new, b"abc", b"d", "00-" + "1" * 32 + "-" + "2" * 16 + "-01", False),
        StoredBody(new, b"abc", b"d", "", False),
    ]
    planned = plan_bodies(state, bodies, NOW_MS)
    assert [e.body_stored.tx_id for e in planned.entries] == [new]
    assert planned.entries[0].body_stored.body_bytes == 3 and planned.traced == [new]


def test_a_submit_is_stamped_above_what_is_staged_and_at_the_clock_under_load() -> None:
    state = StoreState("dc1")
    for entry in plan_step(state, ProtocolStep(counter=7), NOW_MS):
        state.apply(entry)
    assert not stamps_at_clock(state, 1) and stamps_at_clock(state, 2)
    assert stamp_floor(state, 0) == 7 and stamp_floor(state, 1_000) == 999
    submitted = txlog_pb2.TxSubmitted(tx_id=str(uuid.uuid4()), ts=8, local_seq=1)
    state.apply(txlog_pb2.LogEntry(at_unix_ms=NOW_MS, submitted=submitted))
    assert stamps_at_clock(state, 1), "a stamp not yet settled is a sign of load"
    loaded = protocol_state(state)
    assert loaded.counter == 8 and [(m.ts, held) for m, held in loaded.incoming] == [(8, True)]


def test_truncation_goes_as_far_as_every_peer_and_worker_passed_and_says_who_holds_it() -> None:
    """``retention.truncation_hold``: a function of the state, the reported progress and
    the time, as the simulator can call it."""
    state = StoreState("dc1")
    for stamp in range(1, 7):
        _synced_peer_tx(state, stamp)
    hold = functools.partial(
        truncation_hold, state, witness=False, history_kept=0, history_kept_ms=0,
        first_unfinished=7, now_ms=NOW_MS,
    )  # fmt: skip
    assert hold(Progress()) == TruncationHold(
        0, "the sync-coordinator, which has not reported the peers yet at 0 (6 behind)"
    )
    progress = Progress({"dc2": 5, "dc3": 3}, peers_reported=True, workers_min_position=4)
    assert hold(progress) == TruncationHold(4, "peer dc3 at 3 (3 behind)")
    progress.peer_synced_len["dc3"] = 6
    assert hold(progress) == TruncationHold(5, "the slowest worker at 4 (2 behind)")
    assert hold(progress, first_unfinished=3) == TruncationHold(
        3, "unfinished transactions at 2 (4 behind)"
    )
    # A witness has no workers; the newest history_kept stay whoever passed them.
    assert hold(progress, witness=True) == TruncationHold(6, "peer dc2 at 5 (1 behind)")
    assert hold(progress, witness=True, history_kept=3) == TruncationHold(4, "")
    # What finished within history_kept_ms of now stays (all six finished at NOW_MS).
    assert hold(progress, witness=True, history_kept_ms=1_000) == TruncationHold(0, "")
    later = NOW_MS + 2_000
    assert hold(progress, witness=True, history_kept_ms=1_000, now_ms=later) == TruncationHold(
        6, "peer dc2 at 5 (1 behind)"
    )


def test_a_lagger_is_served_only_appends_that_are_durable() -> None:
    """``read_synced`` (what a coordinator serves from the txlog): the state holds staged
    appends too; the chunk stops at the first one not yet durable, as a post's base
    does (persist before send)."""
    state = StoreState("dc1")
    ids = [_synced_peer_tx(state, stamp) for stamp in range(1, 7)]
    every = functools.partial(read_synced, state, synced_durably=lambda _: True)
    start, entries = every(2, 3)
    assert (start.synced_len, start.last_tx_id) == (2, ids[1])
    assert [meta.tx_id for meta in entries] == ids[2:5]
    staged = set(ids[4:])  # positions 5 and 6: written, not yet durable
    start, entries = read_synced(state, 2, 3, lambda tx_id: tx_id not in staged)
    assert [meta.tx_id for meta in entries] == ids[2:4]
    assert read_synced(state, 4, 3, lambda tx_id: tx_id not in staged)[1] == []
    with pytest.raises(Refusal) as past:
        every(7, 1)
    assert past.value.kind is Refused.PAST_END
    state.apply(txlog_pb2.LogEntry(truncated=state.truncated_entry(state.truncation_cut(4))))
    with pytest.raises(Refusal) as gone:
        every(2, 1)
    assert gone.value.kind is Refused.TRUNCATED and "below position 4" in gone.value.message
    assert [meta.tx_id for meta in every(3, 2)[1]] == ids[3:5]
