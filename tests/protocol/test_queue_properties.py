"""Property tests of the queues and the ADD rule against plain-list models."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from txsync.protocol import GENESIS_TX_ID, IncomingQueue, MergeBase, SyncedQueue, TxMeta
from txsync.protocol.queues import addable_prefix

tx_names = st.text(alphabet="abcdefghijklmnop", min_size=1, max_size=4)
metas = st.builds(TxMeta, ts=st.integers(1, 50), tx_id=tx_names, origin=st.sampled_from("xyz"))


class IncomingQueueMachine(RuleBasedStateMachine):
    """The queue stays sorted, unique and equal to a dict model under any operations, and
    counts the metas of its own node ("x")."""

    added = Bundle("added")

    def __init__(self) -> None:
        super().__init__()
        self.queue = IncomingQueue("x")
        self.model: dict[str, tuple[TxMeta, bool]] = {}

    @rule(target=added, meta=metas, acquired=st.booleans())
    def insert(self, meta: TxMeta, acquired: bool) -> str:
        if meta.tx_id not in self.model:
            self.queue.insert(meta, acquired=acquired)
            self.model[meta.tx_id] = (meta, acquired)
        return meta.tx_id

    @rule(tx_id=added)
    def acquire(self, tx_id: str) -> None:
        changed = self.queue.mark_acquired(tx_id)
        if tx_id in self.model:
            meta, was = self.model[tx_id]
            assert changed == (not was)
            self.model[tx_id] = (meta, True)
        else:
            assert not changed

    @rule(tx_ids=st.lists(added, max_size=3))
    def remove(self, tx_ids: list[str]) -> None:
        self.queue.remove(tx_ids)
        for tx_id in tx_ids:
            self.model.pop(tx_id, None)

    @rule(count=st.integers(0, 3))
    def pop_prefix(self, count: int) -> None:
        head = list(self.queue.metas())[:count]
        self.queue.pop_prefix(count)
        for meta in head:
            del self.model[meta.tx_id]

    @invariant()
    def matches_model(self) -> None:
        expected = sorted(meta for meta, _ in self.model.values())
        assert list(self.queue.metas()) == expected
        assert len(self.queue) == len(self.model)
        assert self.queue.own_len == sum(1 for m, _ in self.model.values() if m.origin == "x")
        for tx_id, (_, acquired) in self.model.items():
            assert tx_id in self.queue
            assert self.queue.is_acquired(tx_id) == acquired

    @invariant()
    def postable_is_the_acquired_head(self) -> None:
        for count_max in (0, 2, 100):
            postable = self.queue.postable(count_max)
            expected: list[TxMeta] = []
            for meta in sorted(m for m, _ in self.model.values()):
                if len(expected) >= count_max or not self.model[meta.tx_id][1]:
                    break
                expected.append(meta)
            assert list(postable) == expected


TestIncomingQueue = IncomingQueueMachine.TestCase
TestIncomingQueue.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


@given(
    window=st.integers(1, 6),
    chunks=st.lists(st.lists(metas, max_size=4), max_size=6),
)
def test_synced_queue_window_behaves_like_a_list(window: int, chunks: list[list[TxMeta]]) -> None:
    queue = SyncedQueue(window)
    model: list[TxMeta] = []
    for chunk in chunks:
        queue.extend(chunk)
        model.extend(chunk)
        assert queue.length == len(model)
        assert queue.base == (
            MergeBase(len(model), model[-1].tx_id) if model else MergeBase(0, GENESIS_TX_ID)
        )
        assert len(queue.tail()) <= window
        for index in range(len(model)):
            got = queue.id_at(index)
            if index >= queue.window_start:
                assert got == model[index].tx_id
                assert queue.base_at(index + 1) == MergeBase(index + 1, model[index].tx_id)
            else:
                assert got is None
                assert queue.base_at(index + 1) is None
    restored = SyncedQueue(window, length=len(model), tail=model)
    assert restored.base == queue.base
    assert list(restored.tail()) == list(queue.tail())


sorted_queues = st.lists(
    st.lists(metas, max_size=8, unique_by=lambda m: m.tx_id).map(sorted), min_size=1, max_size=5
)


@given(queues=sorted_queues, limit_ts=st.integers(0, 60))
def test_addable_prefix_is_the_longest_common_prefix_under_the_cut(
    queues: list[list[TxMeta]], limit_ts: int
) -> None:
    prefix = addable_prefix(queues, limit_ts)
    for queue in queues:
        assert tuple(queue[: len(prefix)]) == prefix
    assert all(meta.ts <= limit_ts for meta in prefix)
    # Maximal: the next position differs somewhere, ends a queue, or passes the cut.
    n = len(prefix)
    extendable = all(len(q) > n for q in queues) and len({q[n] for q in queues}) == 1
    assert not extendable or queues[0][n].ts > limit_ts


@given(queues=sorted_queues)
def test_cut_is_implied_when_every_counter_covers_its_queue(queues: list[list[TxMeta]]) -> None:
    """With a post from every member, each counter is at least every ts it posted (the
    Lamport rule, enforced by validation), so the common prefix never crosses the cut:
    the cut only matters for ADD over fewer than all members (docs/protocol.md)."""
    counters = [max((m.ts for m in q), default=0) for q in queues]
    limit = min(counters)
    assert addable_prefix(queues, limit) == addable_prefix(queues, 10**9)
