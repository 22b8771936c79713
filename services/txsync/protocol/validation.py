"""Checks on messages from peers. A message that fails one is refused whole; the core
never trusts a peer to be well-formed, only to be honest."""

from __future__ import annotations

from itertools import pairwise

from txsync.protocol.limits import Limits
from txsync.protocol.model import Post, SyncedEntries, TxMeta


def _metas_problem(metas: tuple[TxMeta, ...]) -> str | None:
    for meta in metas:
        if meta.ts <= 0:
            return f"tx {meta.tx_id} has timestamp {meta.ts} (must be positive)"
        if not meta.tx_id or not meta.origin:
            return "a meta lacks its tx id or origin"
    return None


def sorted_metas_problem(metas: tuple[TxMeta, ...], counter: int | None) -> str | None:
    """Why a posted queue (or a seal) is malformed: bad metas, not strictly sorted, or a
    timestamp above the sender's ``counter`` (None: no counter to check against)."""
    problem = _metas_problem(metas)
    if problem is not None:
        return problem
    for before, after in pairwise(metas):
        if not before < after:
            return f"queue not strictly sorted at tx {after.tx_id}"
    if counter is not None and metas and metas[-1].ts > counter:
        return f"queue holds ts {metas[-1].ts} above the sender's counter {counter}"
    return None


def post_problem(post: Post, limits: Limits) -> str | None:
    """Why ``post`` must be refused, or None if it is well-formed."""
    if len(post.queue) > limits.post_txs_max:
        return f"{len(post.queue)} metas exceed post_txs_max={limits.post_txs_max}"
    if post.base.synced_len < 0 or post.counter < 0 or post.epoch < 0 or post.seq < 0:
        return "negative length, counter, epoch or sequence number"
    return sorted_metas_problem(post.queue, post.counter)


def synced_entries_problem(msg: SyncedEntries, limits: Limits) -> str | None:
    """Why a catch-up message must be refused, or None if it is well-formed."""
    if not msg.entries:
        return "no entries"
    if len(msg.entries) > limits.catchup_entries_max:
        return f"{len(msg.entries)} entries exceed catchup_entries_max={limits.catchup_entries_max}"
    if msg.start.synced_len < 0:
        return "negative start length"
    if len({meta.tx_id for meta in msg.entries}) != len(msg.entries):
        return "an entry repeats a tx id"
    return _metas_problem(msg.entries)
