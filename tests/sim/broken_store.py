"""Deliberately broken store states: the simulator must catch them. Each is the store's
own ``StoreState`` with one rule changed, run by the simulated store (``sim/store.py``)
in place of the real one, as a store with that bug would run.
"""

from __future__ import annotations

from txsync.protocol import TxState
from txsync.transaction_store.state import (
    FINAL_STATES,
    IMPLIED_BY,
    Moved,
    Step,
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


class TruncatesBeforeAJoinState(StoreState):
    """A membership entry taken here does not hold truncation back: every DC may
    truncate the start of the history between the admin API's check and the
    configuration that adds the node, which then has no DC to replay it from."""

    def pending_membership(self) -> str:
        return ""


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
