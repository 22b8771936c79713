"""The dispatch's records of TESTING, OK and FAILED on their way to the store.

They go in order, in batches of up to ``STATE_BATCH_MAX``, one ``AdvanceStates`` call
at a time: whatever was recorded while a call was out goes in the next. A TESTING record
waits up to ``TESTING_HELD_S`` for its transaction's outcome, so that both go in one call,
TESTING with the time it was made (``StateChange.at_unix_ms``): at low load that halves
the calls, and the store writes TESTING with the outcome anyway (``docs/transaction-
store.md``). A longer test is reported TESTING on its own once that time has passed, so a
slow transaction still shows it.

A refusal that passes (the store restarting, busy) sends the same batch again; any other
drops the batch and calls ``on_dropped``: retrying it would stop the DC recording
outcomes for good, and the pipeline, restarted, reads every position the store has not
finished and records it again from the testing worker's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import grpc

from txsync.v1 import common_pb2, store_pb2, store_pb2_grpc

log = logging.getLogger(__name__)

STATE_BATCH_MAX = 512
"""State changes sent to the store in one call."""
TESTING_HELD_S = 0.2
"""How long a TESTING record waits for its outcome before it goes on its own."""
RETRY_AFTER_S = 0.5
STATES_RETRIED = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.ABORTED,
})  # fmt: skip
"""Refusals of ``AdvanceStates`` that pass (the store restarting, busy): the same
batch again. Any other refusal is for good."""
SERVICE = "worker-dispatch"


class StateRecords:
    def __init__(
        self,
        store: store_pb2_grpc.StoreInternalServiceAsyncStub,
        on_dropped: Callable[[], None],
        *,
        testing_held_s: float = TESTING_HELD_S,
    ) -> None:
        self._store = store
        self._on_dropped = on_dropped
        self._testing_held_s = testing_held_s
        self._changes: list[store_pb2.StateChange] = []
        self._ready = asyncio.Event()
        self._testing_held: dict[str, tuple[store_pb2.StateChange, float]] = {}
        """TESTING records waiting for their outcomes, with when they go alone (monotonic
        seconds), oldest first. At most one per transaction in flight."""

    def record(
        self,
        tx_id: str,
        state: common_pb2.TxState.ValueType,
        outcome: common_pb2.Outcome | None = None,
    ) -> None:
        change = store_pb2.StateChange(tx_id=tx_id, state=state)
        if state == common_pb2.TX_STATE_TESTING:
            change.at_unix_ms = time.time_ns() // 1_000_000
            self._testing_held.pop(tx_id, None)  # a restarted pipeline's record: newest last
            self._testing_held[tx_id] = (change, time.monotonic() + self._testing_held_s)
            self._ready.set()  # the sender times its release
            return
        held = self._testing_held.pop(tx_id, None)
        if held is not None:
            self._changes.append(held[0])
        if outcome is not None:
            change.outcome.CopyFrom(outcome)
        self._changes.append(change)
        self._ready.set()

    async def run(self) -> None:
        """Send the records, for as long as the dispatch runs."""
        while True:
            wait_s = self._release_testing()
            if not self._changes:
                with contextlib.suppress(TimeoutError):  # a held TESTING is due
                    await asyncio.wait_for(self._ready.wait(), wait_s)
                self._ready.clear()
                continue
            batch = self._changes[:STATE_BATCH_MAX]
            try:
                await self._store.AdvanceStates(
                    store_pb2.AdvanceStatesRequest(changes=batch, service=SERVICE), timeout=30
                )
            except grpc.aio.AioRpcError as error:
                if error.code() in STATES_RETRIED:
                    log.warning("store refused states (%s); retrying", error.details())
                    await asyncio.sleep(RETRY_AFTER_S)
                    continue
                log.error(
                    "store refused %d state changes (%s: %s): re-reading the unfinished positions",
                    len(batch),
                    error.code().name,
                    error.details(),
                )
                del self._changes[: len(batch)]
                self._on_dropped()
                await asyncio.sleep(RETRY_AFTER_S)
                continue
            del self._changes[: len(batch)]

    def _release_testing(self) -> float | None:
        """Queue the TESTING records whose outcome took too long; the seconds until the
        next one is due (None: none is held)."""
        now = time.monotonic()
        held = self._testing_held
        while held:
            tx_id, (change, due) = next(iter(held.items()))
            if due > now:
                return due - now
            del held[tx_id]
            self._changes.append(change)
        return None
