"""The transaction-store's calls from the sync-coordinator: the protocol's state at a
new epoch, protocol steps checked and staged in order, the bodies peers send, the synced
queue a lagging peer reads, and the stream of local submits. Part of
``TransactionStore`` (``store.py``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from txsync.protocol import MergeBase, TxMeta, TxState
from txsync.refusals import Refusal, Refused
from txsync.telemetry import work
from txsync.transaction_store.local_submits import LocalSubmit, LocalSubmitBatch, LocalWatch
from txsync.transaction_store.step_rules import (
    BodyEntries,
    PeerBody,
    ProtocolState,
    ProtocolStep,
    StoredBody,
    plan_bodies,
    plan_step,
    protocol_state,
    read_synced,
)
from txsync.transaction_store.store_core import Staged, StoreCore, now_ms, reached
from txsync.transaction_store.tx_tracing import trace_history
from txsync.transaction_store.validation import (
    BODIES_PER_CALL_MAX,
    FORGOTTEN_METAS_MAX,
    PERSIST_METAS_MAX,
    READ_SYNCED_MAX,
    STATE_CHANGES_MAX,
    check_peer_body,
    invalid,
)
from txsync.v1 import common_pb2, txlog_pb2

LOCAL_WATCHERS_MAX = 8
"""Concurrent ``watch_local_submits`` streams (one per coordinator incarnation)."""


class _CheckedBody(NamedTuple):
    sent: PeerBody
    body: common_pb2.TxBody
    """Parsed, within the limits, matching its digest."""


@dataclass(frozen=True, slots=True)
class StagedStep:
    """A protocol step applied in memory and handed to the writer (``stage_step``)."""

    staged: Staged | None
    """None: the step changed nothing."""
    entries: list[txlog_pb2.LogEntry]
    merge_base: MergeBase
    traced: Sequence[str] = ()
    """Transactions whose trace context arrived with a body of this step."""


class CoordinatorCalls(StoreCore):
    """The sync-coordinator's calls (``service.py``'s internal API)."""

    async def load_protocol_state(self, local_admit_txs_max: int) -> ProtocolState:
        """Raise and persist the epoch (a new incarnation of the coordinator, whose core
        holds at most ``local_admit_txs_max`` own metas), and return the protocol's state
        as of that entry: everything in it is durable once the epoch is. (Read after the
        epoch's write instead, it could hold a submit stamped meanwhile and not yet
        durable, whose stamp the coordinator would post.) The entry settles the stamps
        the last incarnation may have posted and voids the rest (``state.py``).

        (A synced transaction whose body is recorded is ENQUEUED by that record itself,
        ``state.py``: a coordinator that dies before its core saw the body arrive strands
        nothing, and no repair is needed here, as one was when ENQUEUED was an entry the
        coordinator wrote: the nemesis run once found 14 such positions at one DC.)"""
        async with self._lock:
            epoch = self.state.epoch + 1
            started = txlog_pb2.EpochStarted(epoch=epoch, local_admit_txs_max=local_admit_txs_max)
            staged = self._stage([self._entry(epoch=started)])
            loaded = protocol_state(self.state)
        await self._durable(staged)
        return loaded

    async def persist_step(self, step: ProtocolStep) -> MergeBase:
        """Check one protocol step, apply it and answer once it is durable."""
        return await self.finish_step(await self.stage_step(step))

    async def stage_step(self, step: ProtocolStep) -> StagedStep:
        """Check a step and apply it (handed to the writer, not yet durable): steps staged
        one after another are checked against each other, in that order, which is what
        lets the coordinator send the next before the last is on disk."""
        if max(len(step.incoming), len(step.synced)) > PERSIST_METAS_MAX:
            raise invalid(f"at most {PERSIST_METAS_MAX} incoming and synced metas per step")
        if len(step.forgotten) > FORGOTTEN_METAS_MAX:
            raise invalid(f"at most {FORGOTTEN_METAS_MAX} forgotten metas per step")
        if len(step.changes) > STATE_CHANGES_MAX:
            raise invalid(f"at most {STATE_CHANGES_MAX} state changes per step")
        checked = self._checked_bodies(step.bodies)
        async with self._lock:
            # Checked in full before anything is applied: a refused step leaves no trace.
            entries = plan_step(self.state, step, now_ms())
            node_id = self.state.node_id
            renewed = sum(1 for meta in step.incoming if meta.origin == node_id)
            if renewed:  # a local meta comes from the coordinator only stamped anew
                work.count(work.STAMPS_RENEWED, renewed)
            bodies = self._body_entries(checked)
            entries[:0] = bodies.entries
            staged = None
            if entries:
                staged = self._stage(entries, traced_whole=bodies.traced)
            return StagedStep(staged, entries, self.state.merge_base, bodies.traced)

    async def finish_step(self, step: StagedStep) -> MergeBase:
        """Wait until a staged step is durable; the merge base it left."""
        if step.staged is not None:
            await self._durable(step.staged)
        for tx_id in step.traced:
            trace_history(self.state, tx_id)
        return step.merge_base

    @staticmethod
    def _checked_bodies(bodies: Sequence[PeerBody]) -> list[_CheckedBody]:
        """A step's bodies, each checked (the first that fails its checks fails all)."""
        if len(bodies) > BODIES_PER_CALL_MAX:
            raise invalid(f"bodies: {len(bodies)} is over {BODIES_PER_CALL_MAX}")
        return [_CheckedBody(body, check_peer_body(*body[:3])) for body in bodies]

    def _body_entries(self, checked: Sequence[_CheckedBody]) -> BodyEntries:
        """Under the lock: the entries that store the bodies not held yet (each once);
        their bytes wait in ``_unfiled`` until a rotation files them."""
        planned = plan_bodies(
            self.state,
            [
                StoredBody(tx_id, encoded, digest, traceparent, body.HasField("membership"))
                for (tx_id, encoded, digest, traceparent), body in checked
            ],
            now_ms(),
        )
        for entry in planned.entries:
            self._unfiled[entry.body_stored.tx_id] = entry.body_stored.body
        return planned

    def read_synced(self, from_len: int, count_max: int) -> tuple[MergeBase, list[TxMeta]]:
        if not 1 <= count_max <= READ_SYNCED_MAX:
            raise invalid(f"count_max: {count_max} is outside 1..{READ_SYNCED_MAX}")
        # A synced entry's append is in the log once ACCEPTED is (not only staged).
        return read_synced(
            self.state,
            from_len,
            count_max,
            lambda tx_id: self._has_reached(tx_id, TxState.ACCEPTED),
        )

    async def watch_local_submits(self) -> AsyncGenerator[list[LocalSubmit], None]:
        """Every local submit the protocol may not hold yet, each once, with its body, in
        batches of what one message takes (``LocalSubmitBatch``). First those waiting
        when the watch starts: the ones to stamp anew (``pending_local``), then the
        durable stamped ones no counter or epoch has settled, in order (a coordinator
        that holds one already refuses it as a repeat). Then new ones as they become
        durable (``_hand_durable_submits``), not found by rescanning at every write."""
        if len(self._local_watchers) >= LOCAL_WATCHERS_MAX:
            raise Refusal(
                Refused.OVERLOADED,
                f"at most {LOCAL_WATCHERS_MAX} local submit watches at once",
            )
        handed = LocalWatch()
        self._local_watchers.add(handed)
        try:
            staged = {entry.submitted.tx_id for _, entries in self._unhanded for entry in entries}
            stamped = [
                (tx_id, stamp, seq)
                for tx_id, (stamp, seq) in self.state.unsettled.items()
                if tx_id not in staged  # handed as they become durable
            ]
            pending = [*((tx_id, 0, 0) for tx_id in self.state.pending_local), *stamped]
            batch = LocalSubmitBatch()
            for tx_id, stamp, seq in pending:
                submit = await self._local_submit(tx_id, stamp, seq)
                if not batch.takes(submit):
                    yield batch.submits
                    batch = LocalSubmitBatch()
                batch.add(submit)
            if batch.submits:
                yield batch.submits
            already = {tx_id for tx_id, _, _ in pending}
            while True:
                new = []
                for submit in await handed.next_batch():
                    if submit.tx_id in already:
                        already.discard(submit.tx_id)  # submitted while the pending were read
                    else:
                        new.append(submit)
                if new:
                    yield new
        finally:
            self._local_watchers.discard(handed)

    async def _local_submit(self, tx_id: str, stamp: int, local_seq: int) -> LocalSubmit:
        record = self.state.txs[tx_id]
        held, _ = await self.read_bodies([tx_id])
        body = held[0][1] if held else b""
        return LocalSubmit(tx_id, body, record.body_digest, record.traceparent, stamp, local_seq)

    def missing_body_alarm(self, held: int | None = None) -> str:
        """An alarm once the first synced position whose body is not here has stayed
        the first for ``body_missing_alarm_s`` ("" until then): called at every
        progress report, so that it counts from when the body went missing. ``held``:
        ``bodies_held_durably_len()``, when the caller has it already."""
        state = self.state
        if held is None:
            held = self.bodies_held_durably_len()
        first = held + 1 if held < state.synced_len else 0
        waited = self._missing_body.waited_s(first, time.monotonic())
        meta = state.synced_at(first - 1) if first else None
        if meta is None or waited < self.config.body_missing_alarm_s:
            return ""
        return (
            f"BODY MISSING: position {first} ({meta.tx_id}, from {meta.origin}) has waited "
            f"{waited:.0f} s for its body, and this DC's workers with it; if no peer holds "
            'it any more, see docs/operations.md, "Upgrading from 0.1.0"'
        )

    def bodies_held_durably_len(self) -> int:
        """``StoreState.bodies_held_len`` as the disk holds it: up to the first synced
        position whose body, or whose ENQUEUED, is still on its way to the disk. The
        coordinator posts it, and the peers truncate up to it: answered from memory
        (which holds staged writes), a peer could delete the last copies of a body this
        DC then lost in a crash, and its workers would wait for it for ever."""
        held = self.state.bodies_held_len()
        txs = self.state.txs
        for tx_id, (_, written) in self._undurable.items():
            if written is not None and reached(written, TxState.ENQUEUED):
                continue
            record = txs.get(tx_id)
            if record is not None and 0 < record.position <= held:
                held = record.position - 1
        return held
