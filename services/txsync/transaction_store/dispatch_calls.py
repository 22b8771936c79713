"""The transaction-store's calls from worker-dispatch: the stream of enqueued positions
(``follow_enqueued``) and the states dispatch records (``advance_states``). Part of
``TransactionStore`` (``store.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

from txsync.protocol import TxState
from txsync.refusals import Refusal, Refused
from txsync.settings import FOLLOW_GATHER_MS_MOST
from txsync.transaction_store.state import FINAL_STATES, TxRecord
from txsync.transaction_store.step_rules import StateChangeRequest, keep_testing, plan_verdicts
from txsync.transaction_store.store_core import StoreCore, now_ms
from txsync.transaction_store.validation import invalid

FOLLOW_BATCH_MAX = 256
"""Positions per batch that ``follow_enqueued`` yields (one stream message each)."""


FOLLOW_GATHER_BELOW = 32
"""A follower's pause (``gather_s``) follows only a batch of fewer positions than this:
a bigger one says the load batches by itself, and a pause would only idle the follower
(batches of 50 submits, 4 clients per DC: 5-10% fewer transactions a second with a 20 ms
pause after every batch; docs/benchmarks.md, Tuning 26)."""


class DispatchCalls(StoreCore):
    """worker-dispatch's calls (``service.py``'s internal API)."""

    async def follow_enqueued(
        self,
        from_position: int,
        *,
        membership_only: bool = False,
        finished_only: bool = False,
        from_first_unfinished: bool = False,
        gather_s: float = 0.0,
        skip_truncated: bool = False,
    ) -> AsyncGenerator[list[tuple[int, TxRecord]], None]:
        """Yield the synced positions from ``from_position`` on once each is ENQUEUED or
        later, as lists of every position ready by then, in order (at most
        ``FOLLOW_BATCH_MAX``). ``membership_only``: only the membership entries, still
        strictly in order; ``finished_only``: once OK or FAILED; ``from_first_unfinished``:
        from the first position not yet OK or FAILED if that comes earlier; ``gather_s``:
        wait that long after each batch smaller than ``FOLLOW_GATHER_BELOW``, so that a
        follower in no haste takes what became ready meanwhile as one batch (at low load a
        batch per transaction otherwise: a stream message, and a wakeup of the follower's
        process); ``skip_truncated``: where the history at the position was truncated
        (before the call or while it follows), go on at the first position still held."""
        if not 0 <= gather_s <= FOLLOW_GATHER_MS_MOST / 1000:
            raise invalid(f"gather_ms: at most {FOLLOW_GATHER_MS_MOST}")
        position = max(1, from_position)
        if from_first_unfinished:
            position = min(position, self.first_unfinished_position())
        wanted = TxState.OK if finished_only else TxState.ENQUEUED
        state_txs = self.state
        while True:
            txs = state_txs.txs
            changed = self._changed
            ready: list[tuple[int, TxRecord]] = []
            while len(ready) < FOLLOW_BATCH_MAX:
                meta = state_txs.synced_at(position - 1)
                if meta is None and position <= state_txs.synced_offset and skip_truncated:
                    position = state_txs.synced_offset + 1
                    continue
                if meta is None and position <= state_txs.synced_offset:
                    raise Refusal(Refused.TRUNCATED, f"position {position} was truncated")
                record = txs.get(meta.tx_id) if meta is not None else None
                state = self._written_state(record)
                if record is None or state is None or state < wanted:
                    break
                if record.membership or not membership_only:
                    ready.append((position, record))
                position += 1
            if ready:
                yield ready
                if gather_s and len(ready) < FOLLOW_GATHER_BELOW:
                    await asyncio.sleep(gather_s)
            else:
                await changed.wait()

    async def advance_states(self, changes: Sequence[StateChangeRequest], service: str) -> None:
        async with self._lock:
            plan = plan_verdicts(self.state, changes, service, now_ms(), self._testing_unwritten)
            moved = keep_testing(self.state, plan, self._testing_unwritten)
            staged = self._stage(plan.written) if plan.written else None
        if moved:
            self._announce(moved)
        for change in changes:
            if change.state in FINAL_STATES:
                self.body_cache.discard(change.tx_id)  # read back no more (files serve)
        if staged is not None:
            await self._durable(staged)
