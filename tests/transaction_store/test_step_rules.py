"""The store's step rules as pure functions (``step_rules``): given a ``StoreState`` and
the time they plan entries or refuse, and change nothing; the entries they plan, applied,
move the state. How far truncation may go (``retention``) too. No store, file or event
loop here: what a simulator can run."""

from __future__ import annotations

import functools
import uuid

import pytest

from txsync.codec import proposal_to_proto
from txsync.protocol import Configuration, MergeBase, TxMeta, TxState, View, ViewProposal
from txsync.refusals import Refusal, Refused
from txsync.transaction_store import state as state_module
from txsync.transaction_store.retention import (
    CopyLease,
    Progress,
    TruncationHold,
    copy_leases,
    live_copy_leases,
    truncation_hold,
    unpassed,
)
from txsync.transaction_store.state import StoreState
from txsync.transaction_store.step_rules import (
    BaseAdoption,
    ProtocolStep,
    StateChangeRequest,
    StoredBody,
    export_base,
    plan_base_adopted,
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


def test_a_peer_is_let_go_only_where_truncation_passes_its_order_after_every_hold() -> None:
    """A peer past ``peer_hold_max`` is let go (and warned of) only if truncation then
    passes its order's end; the removed-node hold is one of the holds that decide it,
    so while it keeps truncation below that peer, the peer holds as before."""
    state = StoreState("dc1")
    for stamp in range(1, 7):
        _synced_peer_tx(state, stamp)
    progress = Progress(
        {"dc2": 6, "dc3": 1}, peer_ordered_len={"dc2": 6, "dc3": 1}, peers_reported=True,
        workers_min_position=6,
    )  # fmt: skip
    hold = functools.partial(
        truncation_hold, state, progress, witness=False, history_kept=0, history_kept_ms=0,
        first_unfinished=7, now_ms=NOW_MS, peer_hold_max=2,
    )  # fmt: skip
    assert hold() == TruncationHold(7, "", (("peer dc3", 1),))
    # As installing a view that leaves a node out records: its order may reach 6.
    state.removed_order_end = 6
    assert hold() == TruncationHold(0, "a removed node, whose order may reach 6, at 0 (6 behind)")
    state.removed_order_end = 5  # truncation passes it whole: dc3 is let go again
    assert hold() == TruncationHold(7, "", (("peer dc3", 1),))


def test_a_copy_lease_keeps_what_follows_the_copy_until_its_adopter_caught_up() -> None:
    """``retention.copy_leases``: a peer let go, copying this DC at position 3, finds
    positions 4 on here when its copy arrives, however long the copy took. The lease
    ends once the peer holds truncation as a peer again, at its time out, or once it
    would hold more than ``peer_hold_max`` positions, as a peer would."""
    state = StoreState("dc1")
    for stamp in range(1, 9):
        _synced_peer_tx(state, stamp)
    progress = Progress(
        {"dc2": 8, "dc3": 0}, peer_ordered_len={"dc2": 8, "dc3": 0}, peers_reported=True,
        workers_min_position=8,
    )  # fmt: skip

    def hold(now_ms: int = NOW_MS) -> TruncationHold:
        return truncation_hold(
            state, progress, witness=False, history_kept=0, history_kept_ms=0,
            first_unfinished=9, now_ms=now_ms, peer_hold_max=6,
        )  # fmt: skip

    assert hold() == TruncationHold(9, "", (("peer dc3", 0),))  # dc3 let go: all may go
    progress.copy_leases["dc3"] = CopyLease(3, NOW_MS + 1_000)
    assert hold() == TruncationHold(4, "a copy for dc3 at 3 (5 behind)", (("peer dc3", 0),))
    assert hold(now_ms=NOW_MS + 1_000).below == 9  # timed out
    _synced_peer_tx(state, 9)
    _synced_peer_tx(state, 10)  # the lease would hold 7 positions, past the bound of 6
    assert hold().below == 9
    progress.peer_synced_len["dc3"] = progress.peer_ordered_len["dc3"] = 5  # back, at 5
    assert hold() == TruncationHold(6, "peer dc3 at 5 (5 behind)")
    assert copy_leases(progress, 10, NOW_MS, peer_hold_max=6) == {}  # held as a peer
    progress.peer_synced_len["dc3"] = 2  # reported from before its copy, no bound
    assert copy_leases(progress, 10, NOW_MS, peer_hold_max=0) == {"dc3": 3}
    del progress.peer_synced_len["dc3"]  # removed from the configuration
    assert copy_leases(progress, 10, NOW_MS, peer_hold_max=0) == {}
    # An ended lease stays ended: dropped at the report that ends it, it does not hold
    # again when its adopter falls behind (the simulator: a removed adopter's lease held
    # truncation for good, and hid a broken store's duplicates from 1,200 seeds).
    progress.copy_leases = live_copy_leases(progress, 10, NOW_MS, peer_hold_max=0)
    assert progress.copy_leases == {}
    progress.peer_synced_len["dc3"] = 2
    assert copy_leases(progress, 10, NOW_MS, peer_hold_max=0) == {}


def test_flow_control_counts_the_peers_in_the_view_by_their_order_and_the_workers() -> None:
    """``retention.unpassed`` (``--unpassed-max``): how far the slowest of what holds
    history while every DC is up is behind the synced end. A peer out of the installed
    view counts for nothing (one DC away must not stop the others' submits), nor do the
    bodies a peer lacks (it counts by its order: one waiting for a body no DC sends must
    not stop every DC), nor anything before both reports came (a store just started)."""
    state = StoreState("dc1")
    for stamp in range(1, 11):
        _synced_peer_tx(state, stamp)
    progress = Progress({"dc2": 4, "dc3": 2}, peer_ordered_len={"dc2": 9, "dc3": 2})

    def behind(first_unfinished: int = 11) -> tuple[int, str]:
        return unpassed(state, progress, first_unfinished=first_unfinished)

    assert behind() == (0, "")  # neither the coordinator nor the dispatch reported yet
    progress.peers_reported = True
    assert behind() == (0, "")  # the dispatch has not
    progress.workers_min_position = 7
    assert behind() == (8, "peer dc3")  # view 0: every configured peer is a member
    assert behind(first_unfinished=4) == (8, "peer dc3")
    assert behind(first_unfinished=2) == (9, "the first unfinished transaction")
    _install(state, ["dc1", "dc2"], ["dc3"])  # dc3 excluded
    assert behind() == (3, "the slowest worker")  # dc2 counts at 9, not its bodies' 4
    progress.workers_min_position = 10
    assert behind() == (1, "peer dc2")
    # The core lags what the rest allows (it hears at the next report): it counts.
    progress.core_history_len, progress.allowed_through = 5, 8
    assert behind() == (5, "the sync-coordinator's core")
    # A peer away holds truncation at 5, the core heard that: it holds nothing more.
    progress.allowed_through = 5
    assert behind() == (1, "peer dc2")
    progress.core_history_len = None
    _truncate_below(state, 6, {})
    progress.peer_ordered_len["dc2"] = 3  # reported from before the truncation
    assert behind() == (5, "peer dc2")  # nothing below the history's start is held
    # A peer of 0.1.0 says it holds no bodies (its synced length in the report is 0):
    # it counts by its latest post's order, as one of this release does.
    progress.peer_synced_len["dc2"] = 0
    progress.peer_posted_len["dc2"] = 10
    assert behind() == (0, "the slowest worker")


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
    _truncate_below(state, 4, {})
    with pytest.raises(Refusal) as gone:
        every(2, 1)
    assert gone.value.kind is Refused.TRUNCATED and "below position 4" in gone.value.message
    assert [meta.tx_id for meta in every(3, 2)[1]] == ids[3:5]


def _install(state: StoreState, members: list[str], configured: list[str]) -> None:
    """Install view 1 of ``members``, configured with them and ``configured``."""
    weights = tuple((node, 1) for node in sorted([*members, *configured]))
    view = ViewProposal(View(1, tuple(members)), MergeBase.genesis(), (), Configuration(weights, 0))
    installed = txlog_pb2.ViewInstalled(installed=proposal_to_proto(view))
    state.apply(txlog_pb2.LogEntry(at_unix_ms=NOW_MS, view_installed=installed))


def _truncate_below(state: StoreState, below: int, peer_progress: dict[str, int]) -> None:
    dropped = state.truncation_cut(below)
    entry = state.truncated_entry(dropped, peer_progress, peers_ordered={})
    state.apply(txlog_pb2.LogEntry(truncated=entry))


def test_a_copy_is_exported_only_at_a_position_whose_entry_and_the_one_before_are_held() -> None:
    """``export_base``: a copy of a worker at Q needs the entry at Q (the adopter's merge
    base) and the base before it; a truncation in place keeps only the id of its last."""
    source = StoreState("dc1")
    ids = [_synced_peer_tx(source, stamp) for stamp in range(1, 5)]
    _truncate_below(source, 3, {"dc2": 4})  # 1 and 2 go; 2 is kept by its id alone
    adoption = export_base(source, 3, TxState.FAILED, "dc4", 0)
    assert adoption == BaseAdoption(
        TxMeta(3, ids[2], "dc2"), MergeBase(2, ids[1]), TxState.FAILED, source.counter
    )
    with pytest.raises(Refusal) as truncated:
        export_base(source, 2, TxState.OK, "dc4", 0)
    assert truncated.value.kind is Refused.TRUNCATED and "needs 1 and 2" in str(truncated.value)
    with pytest.raises(Refusal) as past:
        export_base(source, 5, TxState.OK, "dc4", 0)
    assert past.value.kind is Refused.PAST_END


def test_a_copy_past_a_membership_entry_not_applied_yet_is_refused() -> None:
    """The adopter's membership follower starts past the copy: a change no installed
    configuration applied yet would never reach it."""
    source = StoreState("dc1")
    _synced_peer_tx(source, 1)
    entry = _synced_peer_tx(source, 2)
    source.txs[entry].membership = True
    source.membership_entries[entry] = None  # as a stored membership body marks it
    _synced_peer_tx(source, 3)
    assert export_base(source, 1, TxState.OK, "dc4", 0).meta.ts == 1
    with pytest.raises(Refusal) as pending:
        export_base(source, 3, TxState.OK, "dc4", 0)
    assert pending.value.kind is Refused.PRECONDITION
    assert "membership entry at position 2 is not applied yet" in str(pending.value)


def test_a_new_dc_adopts_a_copy_keeping_its_own_metas_and_forgetting_the_others() -> None:
    """``plan_base_adopted`` and the ``base_adopted`` entry: the history up to the copy
    counts as truncated, its entry is finished (it needs no body), foreign incoming
    metas are forgotten and the DC's own stay; a rotation's snapshot carries it."""
    source = StoreState("dc1")
    ids = [_synced_peer_tx(source, stamp) for stamp in range(1, 6)]
    joiner = StoreState("dc4")
    _install(joiner, ["dc1", "dc2"], ["dc4"])
    own = txlog_pb2.TxSubmitted(tx_id=str(uuid.uuid4()), ts=2, local_seq=1)
    joiner.apply(txlog_pb2.LogEntry(at_unix_ms=NOW_MS, submitted=own))
    foreign = TxMeta(9, str(uuid.uuid4()), "dc2")
    for entry in plan_step(joiner, ProtocolStep(incoming=[foreign]), NOW_MS):
        joiner.apply(entry)
    first = source.synced[0]
    for entry in plan_step(
        joiner, ProtocolStep(synced_start=MergeBase.genesis(), synced=[first]), NOW_MS
    ):
        joiner.apply(entry)
    adoption = export_base(source, 4, TxState.OK, "dc4", 1)
    joiner.apply(plan_base_adopted(joiner, adoption, NOW_MS))
    assert joiner.merge_base == MergeBase(4, ids[3]) and joiner.synced_offset == 3
    assert joiner.base_at(3) == MergeBase(3, ids[2])
    assert ids[0] not in joiner.txs, "the history before the copy is truncated"
    assert foreign.tx_id not in joiner.txs and list(joiner.incoming) == [own.tx_id]
    assert joiner.txs[ids[3]].state is TxState.OK and not joiner.txs[ids[3]].body_held
    assert joiner.counter >= source.counter
    assert joiner.bodies_held_len() == 4, "a finished entry needs no body"
    assert protocol_state(joiner).synced_unacquired == []
    snapshot, dropped = joiner.snapshot(0, {})
    whole = snapshot.message()
    replayed = StoreState("dc4")
    replayed.apply(txlog_pb2.LogEntry(snapshot=whole))
    assert not dropped and replayed.merge_base == joiner.merge_base
    assert replayed.base_at(3) == joiner.base_at(3) and set(replayed.txs) == set(joiner.txs)
    # Its history starts past the copy: it never held the body at 4, which the others
    # may have truncated, so a lagger at 3 is sent to a copy too, not served 4.
    assert joiner.history_len == replayed.history_len == protocol_state(joiner).history_len == 4
    with pytest.raises(Refusal) as truncated:
        read_synced(joiner, 3, 1, synced_durably=lambda _: True)
    assert truncated.value.kind is Refused.TRUNCATED and "below position 5" in str(truncated.value)
    with pytest.raises(Refusal) as behind:
        plan_base_adopted(joiner, export_base(source, 4, TxState.OK, "dc4", 1), NOW_MS)
    assert behind.value.kind is Refused.PRECONDITION and "nothing to adopt" in str(behind.value)


def _synced_own_tx(state: StoreState, origin: str, stamp: int) -> str:
    """A transaction of ``origin`` synced here (its body is not needed here)."""
    tx_id = str(uuid.uuid4())
    meta = TxMeta(stamp, tx_id, origin)
    step = ProtocolStep(incoming=[meta], synced_start=state.merge_base, synced=[meta])
    for entry in plan_step(state, step, NOW_MS):
        state.apply(entry)
    return tx_id


def test_what_is_truncated_of_an_origin_that_did_not_pass_it_is_listed_until_it_does() -> None:
    """``synced_for_the_absent``: a truncation lists the entries of every origin (not
    this DC) that did not report passing them; a later one drops what the origin has
    reported passing since; a rotation's snapshot carries the list, and so does the
    entry's replay."""
    state = StoreState("dc1")
    ids = [
        _synced_own_tx(state, origin, n) for n, origin in enumerate(["dc1", "dc3", "dc3", "dc2"], 1)
    ]
    _truncate_below(state, 4, {"dc2": 4})  # dc3 never reported: it may be away
    assert state.synced_for_the_absent == {"dc3": {ids[1]: 2, ids[2]: 3}}
    replayed = StoreState("dc1")
    for entry in _replay_log(state):
        replayed.apply(entry)
    _synced_own_tx(state, "dc2", 5)
    _truncate_below(state, 5, {"dc2": 5, "dc3": 2})  # dc3 came back as far as 2
    assert state.synced_for_the_absent == {"dc3": {ids[2]: 3}}
    snapshot, _ = state.snapshot(0, {"dc2": 5, "dc3": 3})
    assert list(snapshot.head.synced_for_the_absent) == [], "dc3 has passed them all"


def _replay_log(state: StoreState) -> list[txlog_pb2.LogEntry]:
    snapshot, _ = state.snapshot(0, {})
    whole = snapshot.message()
    return [txlog_pb2.LogEntry(snapshot=whole)]


def test_a_copy_names_the_adopters_own_transactions_synced_past_its_end() -> None:
    """A DC that was away may hold as incoming its own transactions the others synced
    meanwhile: the copy names them, from the history held and from the list of what was
    truncated, and the adopter drops them; its other own metas stay incoming."""
    source = StoreState("dc1")
    _synced_own_tx(source, "dc3", 1)
    gone = _synced_own_tx(source, "dc3", 2)
    _synced_own_tx(source, "dc2", 3)
    held = _synced_own_tx(source, "dc3", 4)
    _synced_own_tx(source, "dc2", 5)
    first_meta = source.synced[0]
    _truncate_below(source, 4, {"dc2": 5})  # 1-3 go; dc3 did not report
    adoption = export_base(source, 5, TxState.OK, "dc3", 1)
    assert adoption.synced_own == ((2, gone), (4, held)), "not 1: the adopter has it"
    away = StoreState("dc3")
    _install(away, ["dc1", "dc2"], ["dc3"])
    for entry in plan_step(
        away, ProtocolStep(synced_start=MergeBase.genesis(), synced=[first_meta]), NOW_MS
    ):
        away.apply(entry)
    kept = str(uuid.uuid4())
    for n, tx_id in ((2, gone), (4, held), (6, kept)):
        submitted = txlog_pb2.TxSubmitted(tx_id=tx_id, ts=n, local_seq=n)
        away.apply(txlog_pb2.LogEntry(at_unix_ms=NOW_MS, submitted=submitted))
    away.apply(plan_base_adopted(away, adoption, NOW_MS))
    assert list(away.incoming) == [kept] and gone not in away.txs and held not in away.txs
    assert protocol_state(away).incoming == [(TxMeta(6, kept, "dc3"), True)]


def test_no_copy_is_given_to_an_origin_whose_list_overflowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past ``ABSENT_SYNCED_MAX`` entries an origin's list is incomplete: a copy could
    leave it holding a synced transaction as incoming, so none is given until it reports
    passing what was left out."""
    state = StoreState("dc1")
    ids = [_synced_own_tx(state, "dc3", n) for n in range(1, 5)]
    with monkeypatch.context() as bound:
        bound.setattr(state_module, "ABSENT_SYNCED_MAX", 1)
        _truncate_below(state, 3, {})  # dc3's 1 is listed, 2 overflows
    assert state.synced_for_the_absent == {"dc3": {ids[0]: 1}}
    assert state.absent_lost == {"dc3": 2}
    with pytest.raises(Refusal) as lost:
        export_base(state, 4, TxState.OK, "dc3", 1)
    assert lost.value.kind is Refused.PRECONDITION and "kept no list" in str(lost.value)
    assert export_base(state, 4, TxState.OK, "dc3", 2).synced_own == ((3, ids[2]), (4, ids[3]))
    stranger = StoreState("dc4")
    running = BaseAdoption(state.synced[-1], MergeBase(3, ids[2]), TxState.TESTING, 2)
    with pytest.raises(Refusal) as unfinished:
        plan_base_adopted(stranger, running, NOW_MS)
    assert unfinished.value.kind is Refused.INVALID
