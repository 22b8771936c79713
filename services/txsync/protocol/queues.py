"""The two queues of a node's transaction log, and the ADD rule over posted queues."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from txsync.protocol.model import GENESIS_TX_ID, MergeBase, NodeId, TxId, TxMeta


class IncomingQueue:
    """Known, not yet synced metas sorted by ``(ts, tx_id)``, each flagged acquired or not.

    It counts the metas of ``own`` (the node holding it), which the local admission
    bounds (``Limits.local_admit_txs_max``)."""

    __slots__ = ("_acquired", "_metas", "_own", "_own_len")

    def __init__(self, own: NodeId) -> None:
        self._metas: list[TxMeta] = []
        self._acquired: dict[TxId, bool] = {}
        self._own = own
        self._own_len = 0

    def __len__(self) -> int:
        return len(self._metas)

    @property
    def own_len(self) -> int:
        """Metas whose origin is the node holding the queue."""
        return self._own_len

    def __contains__(self, tx_id: object) -> bool:
        return tx_id in self._acquired

    def metas(self) -> Sequence[TxMeta]:
        return self._metas

    def is_acquired(self, tx_id: TxId) -> bool:
        return self._acquired[tx_id]

    def insert(self, meta: TxMeta, *, acquired: bool) -> None:
        assert meta.tx_id not in self._acquired, meta
        bisect.insort(self._metas, meta)
        self._acquired[meta.tx_id] = acquired
        if meta.origin == self._own:
            self._own_len += 1

    def mark_acquired(self, tx_id: TxId) -> bool:
        """Flag a body as held; true if this changed anything."""
        if self._acquired.get(tx_id, True):
            return False
        self._acquired[tx_id] = True
        return True

    def postable(self, count_max: int) -> tuple[TxMeta, ...]:
        """The queue cut at the first unacquired body and at ``count_max`` metas."""
        end = 0
        for meta in self._metas:
            if end >= count_max or not self._acquired[meta.tx_id]:
                break
            end += 1
        return tuple(self._metas[:end])

    def remove(self, tx_ids: Iterable[TxId]) -> None:
        gone = {tx_id for tx_id in tx_ids if tx_id in self._acquired}
        if not gone:
            return
        for tx_id in gone:
            del self._acquired[tx_id]
        kept = []
        for meta in self._metas:
            if meta.tx_id not in gone:
                kept.append(meta)
            elif meta.origin == self._own:
                self._own_len -= 1
        self._metas = kept

    def pop_prefix(self, count: int) -> None:
        for meta in self._metas[:count]:
            del self._acquired[meta.tx_id]
            if meta.origin == self._own:
                self._own_len -= 1
        del self._metas[:count]


class SyncedQueue:
    """The agreed, append-only order. Only the newest ``window_max`` entries stay in
    memory; ``length`` and ``base`` always describe the whole queue."""

    __slots__ = ("_window", "_window_max", "_window_start")

    def __init__(self, window_max: int, *, length: int = 0, tail: Sequence[TxMeta] = ()) -> None:
        assert window_max > 0
        assert len(tail) <= length
        keep = list(tail[-window_max:])
        self._window: list[TxMeta] = keep
        self._window_start = length - len(keep)
        self._window_max = window_max

    @property
    def length(self) -> int:
        return self._window_start + len(self._window)

    @property
    def base(self) -> MergeBase:
        if self.length == 0:
            return MergeBase.genesis()
        assert self._window, "the last synced entry is always in memory"
        return MergeBase(self.length, self._window[-1].tx_id)

    @property
    def window_start(self) -> int:
        return self._window_start

    def id_at(self, index: int) -> TxId | None:
        """The tx id at ``index`` (0-based), or None if it is outside the window."""
        offset = index - self._window_start
        if 0 <= offset < len(self._window):
            return self._window[offset].tx_id
        return None

    def base_at(self, length: int) -> MergeBase | None:
        """The merge base this queue had when it was ``length`` long (None: not in memory)."""
        if length == 0:
            return MergeBase(0, GENESIS_TX_ID)
        tx_id = self.id_at(length - 1)
        return None if tx_id is None else MergeBase(length, tx_id)

    def entries(self, start: int, count_max: int) -> tuple[TxMeta, ...]:
        assert start >= self._window_start
        offset = start - self._window_start
        return tuple(self._window[offset : offset + count_max])

    def tail(self) -> Sequence[TxMeta]:
        return self._window

    def extend(self, metas: Sequence[TxMeta]) -> None:
        self._window.extend(metas)
        excess = len(self._window) - self._window_max
        if excess > 0:
            del self._window[:excess]
            self._window_start += excess


def addable_prefix(queues: Sequence[Sequence[TxMeta]], limit_ts: int) -> tuple[TxMeta, ...]:
    """ADD (PROTOCOL.md §2.3): the longest common prefix of all posted queues whose
    entries all have ``ts <= limit_ts`` (the least collected counter).

    The cut is what makes ADD safe: every member stamps new transactions above its posted
    counter, so no transaction at or below ``limit_ts`` can still appear anywhere.
    """
    assert queues
    shortest = min(queues, key=len)
    end = 0
    for index, meta in enumerate(shortest):
        if meta.ts > limit_ts:
            break
        if any(queue[index] != meta for queue in queues):
            break
        end = index + 1
    return tuple(shortest[:end])
