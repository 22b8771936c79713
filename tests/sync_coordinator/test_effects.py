"""Merging several steps' effects into one store write keeps what the core's order means."""

from __future__ import annotations

from txsync.protocol import (
    Ballot,
    Configuration,
    MergeBase,
    PersistCounter,
    PersistDropIncoming,
    PersistIncoming,
    PersistSynced,
    PersistView,
    PersistViewVote,
    Ready,
    StateChanged,
    TxMeta,
    TxState,
    View,
    ViewProposal,
)
from txsync.sync_coordinator.effects import MergedPersist

T1, T2, T3 = (TxMeta(n, f"00000000-0000-4000-8000-00000000000{n}", "dc2") for n in (1, 2, 3))
VIEW_1 = ViewProposal(
    View(1, ("dc1", "dc2")), MergeBase.genesis(), (), Configuration.of({"dc1": 1, "dc2": 1})
)
VOTE = PersistViewVote(Ballot(1, 1, "dc1"), None, None)


def _merge(*readies: Ready) -> MergedPersist:
    merged = MergedPersist()
    for ready in readies:
        merged.add(ready)
    return merged


def test_counters_take_the_highest_and_synced_appends_join() -> None:
    merged = _merge(
        Ready(persist=(PersistCounter(5), PersistSynced(MergeBase.genesis(), (T1,)))),
        Ready(persist=(PersistCounter(3), PersistSynced(MergeBase(1, T1.tx_id), (T2,)))),
    )
    assert merged.counter == 5
    assert merged.synced_start == MergeBase.genesis() and merged.synced == [T1, T2]


def test_a_vote_before_an_install_in_the_same_batch_is_void() -> None:
    merged = _merge(Ready(persist=(VOTE,)), Ready(persist=(PersistView(VIEW_1),)))
    assert merged.installed == VIEW_1 and merged.vote is None
    later_vote = PersistViewVote(Ballot(2, 1, "dc1"), None, None)
    merged.add(Ready(persist=(later_vote,)))
    assert merged.vote == later_vote, "a vote after the install is the next view change's"


def test_a_meta_forgotten_then_learned_again_is_kept() -> None:
    merged = _merge(
        Ready(persist=(PersistDropIncoming((T1.tx_id, T2.tx_id)),)),
        Ready(
            persist=(PersistIncoming((T1,)),),
            state_changes=(StateChanged(T1.tx_id, TxState.INCOMING),),
        ),
    )
    assert list(merged.forgotten) == [T2.tx_id]
    assert merged.incoming == [T1]


def test_a_meta_learned_then_forgotten_in_one_batch_never_reaches_the_store() -> None:
    merged = _merge(
        Ready(
            persist=(PersistIncoming((T1, T3)),),
            state_changes=(
                StateChanged(T1.tx_id, TxState.INCOMING),
                StateChanged(T3.tx_id, TxState.INCOMING),
            ),
        ),
        Ready(persist=(PersistDropIncoming((T1.tx_id, T2.tx_id)),)),
    )
    assert merged.incoming == [T3]
    assert [change.tx_id for change in merged.changes] == [T3.tx_id]
    assert list(merged.forgotten) == [T2.tx_id]
    assert not merged.is_empty()
