"""Deliberately broken store states: the simulator must catch them. Each is the store's
own ``StoreState`` with one rule changed, run by the simulated store (``sim/store.py``)
in place of the real one, as a store with that bug would run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from txsync.protocol import TxState
from txsync.transaction_store.history import Step
from txsync.transaction_store.state import (
    FINAL_STATES,
    IMPLIED_BY,
    Moved,
    RepeatedAbsentLost,
    RepeatedAbsentSynced,
    StoreState,
    TxRecord,
)
from txsync.v1 import txlog_pb2


class KeepsVoidStampsState(StoreState):
    """The replay rule for stamped submits (docs/protocol.md, "The submit's counter,
    stamped by the store") left out: a counter written before the coordinator stepped a
    submit settles the submit's stamp instead of voiding it. After a crash in the wrong
    moment its node holds a transaction at a timestamp below a counter it already
    posted without it."""

    def _settle_stamps(self, counter: int, local_seq: int) -> None:
        for tx_id, (stamp, seq) in list(self.unsettled.items()):
            if seq > local_seq and stamp > counter:
                break
            del self.unsettled[tx_id]


class KeepsEveryStampAtEpochState(StoreState):
    """A new epoch settles every open stamp, as it did before the bound on a core's own
    metas: a restarted core takes back every stamp its store took, more than its
    ``local_admit_txs_max``, and with queues full of different metas no ADD passes."""

    def _settle_at_epoch(self) -> None:
        self.unsettled.clear()


class EnqueuesUnsyncedState(StoreState):
    """A body stored makes its transaction ENQUEUED whatever its state, so a
    transaction still INCOMING (not yet in the agreed order) jumps to ENQUEUED: a
    transition the lifecycle forbids, and a position dispatch could run out of order."""

    def apply(self, entry: txlog_pb2.LogEntry) -> list[Moved]:
        moved = super().apply(entry)
        if entry.HasField("body_stored"):
            record = self.txs[entry.body_stored.tx_id]
            if record.state is TxState.INCOMING and record.state not in FINAL_STATES:
                self._apply_state(
                    record, Step(TxState.ENQUEUED, entry.at_unix_ms, IMPLIED_BY), moved
                )
        return moved


class SnapshotForgetsUnstampedSubmitsState(StoreState):
    """A rotation's snapshot leaves out that a submit is local: a submit written and
    acknowledged, but not yet stamped by the protocol, is no longer handed to the
    coordinator once the store restarts from that file (its client was told it was
    taken). The simulated store replays every rotated file and compares."""

    def _snapshot_tx(self, record: TxRecord) -> txlog_pb2.SnapshotTx:
        saved = super()._snapshot_tx(record)
        if record.meta is None:
            saved.local = False
        return saved


class AdoptsOnePastState(StoreState):
    """A DC that adopts a copy's base takes its entry one position past where it is (the
    copy's ``synced_offset`` read as the entry's own position): from there on its order
    is shifted by one against every other DC's."""

    def _apply_base_adopted(
        self, adopted: txlog_pb2.BaseAdopted, at: int, moved: list[Moved]
    ) -> None:
        shifted = txlog_pb2.BaseAdopted()
        shifted.CopyFrom(adopted)
        shifted.synced_offset += 1
        super()._apply_base_adopted(shifted, at, moved)


class ForgetsTheAbsentState(StoreState):
    """A truncation lists nothing of what it drops for origins that did not pass it
    (``synced_for_the_absent``): a DC that was away and starts from a copy keeps as
    incoming its own transactions synced meanwhile, and posts them again."""

    def _absent_after(
        self,
        dropped: Sequence[str],
        peer_progress: Mapping[str, int],
        listed: RepeatedAbsentSynced,
        lost: RepeatedAbsentLost,
    ) -> None:
        return
