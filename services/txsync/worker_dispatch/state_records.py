"""The dispatch's records of TESTING, OK and FAILED on their way to the store.

They go in order, in batches of up to ``STATE_BATCH_MAX``, one at a time on one
``AdvanceStatesStream``: whatever was recorded while a batch was out goes in the next. A
stream, not a unary call per batch: at low load every transaction is a batch, and a
stream message costs both ends about half what a unary call does (172 against 362 us of
CPU here, ``make bench-messages``). A TESTING record
waits up to ``TESTING_HELD_S`` for its transaction's outcome, so that both go in one call,
TESTING with the time it was made (``StateChange.at_unix_ms``): at low load that halves
the calls, and the store writes TESTING with the outcome anyway (``docs/transaction-
store.md``). A longer test is reported TESTING on its own once that time has passed, so a
slow transaction still shows it.

A refusal ends the stream; the next batch opens a new one. A refusal that passes (the
store restarting, busy, no answer within ``ANSWER_TIMEOUT_S``) sends the same batch
again; any other drops the batch and calls ``on_dropped``: retrying it would stop the DC
recording outcomes for good, and the pipeline, restarted, reads every position the store
has not finished and records it again from the testing worker's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TypeAlias

import grpc

from txsync.v1 import common_pb2, store_pb2, store_pb2_grpc

log = logging.getLogger(__name__)

STATE_BATCH_MAX = 512
"""State changes sent to the store in one call."""
TESTING_HELD_S = 0.2
"""How long a TESTING record waits for its outcome before it goes on its own."""
RETRY_AFTER_S = 0.5
ANSWER_TIMEOUT_S = 30.0
"""How long a batch may wait for the store's answer before it is sent again."""
STATES_RETRIED = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.ABORTED,
})  # fmt: skip
"""Refusals of a batch that pass (the store restarting, busy): the same
batch again. Any other refusal is for good."""
SERVICE = "worker-dispatch"

StatesStream: TypeAlias = (
    "grpc.aio.StreamStreamCall[store_pb2.AdvanceStatesStreamRequest, "
    "store_pb2.AdvanceStatesStreamResponse]"
)


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
        self.refusals = 0
        """Batches the store refused or did not answer (each sent again or dropped)."""

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
        stream: StatesStream | None = None
        try:
            while True:
                wait_s = self._release_testing()
                if not self._changes:
                    # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that
                    # lands as the event is set, and the dispatch's stop then waited for
                    # ever (1 in ~15 in-process runs with two running at once).
                    with contextlib.suppress(TimeoutError):  # a held TESTING is due
                        async with asyncio.timeout(wait_s):
                            await self._ready.wait()
                    self._ready.clear()
                    continue
                batch = self._changes[:STATE_BATCH_MAX]
                if stream is None:
                    stream = self._store.AdvanceStatesStream()
                refusal = await _sent(stream, batch)
                if refusal is None:
                    del self._changes[: len(batch)]
                    continue
                stream.cancel()
                stream = None
                self.refusals += 1
                code, details = refusal
                if code in STATES_RETRIED:
                    log.warning("store refused states (%s); retrying", details)
                else:
                    log.error(
                        "store refused %d state changes (%s: %s): re-reading the unfinished "
                        "positions",
                        len(batch),
                        code.name,
                        details,
                    )
                    del self._changes[: len(batch)]
                    self._on_dropped()
                await asyncio.sleep(RETRY_AFTER_S)
        finally:
            if stream is not None:
                stream.cancel()

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


async def _sent(
    stream: StatesStream, batch: list[store_pb2.StateChange]
) -> tuple[grpc.StatusCode, str] | None:
    """Send one batch on the stream and wait for its answer: None once the store has
    it durably, else the refusal (the stream is then finished or to be given up).

    A batch that could not be written was refused by nobody: every batch before it was
    answered, so the stream broke in between (the store stopped, the connection went;
    gRPC then reports INTERNAL from its core as often as UNAVAILABLE). It passes."""
    try:
        states = store_pb2.AdvanceStatesRequest(changes=batch, service=SERVICE)
        await stream.write(store_pb2.AdvanceStatesStreamRequest(batch=states))
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as error:
        return grpc.StatusCode.UNAVAILABLE, f"the stream broke before the batch went: {error}"
    try:
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            answer = await stream.read()
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details() or ""
    except TimeoutError:
        return grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer within {ANSWER_TIMEOUT_S:.0f} s"
    if answer is grpc.aio.EOF:
        return grpc.StatusCode.UNAVAILABLE, "the store ended the stream"
    return None
