"""``WorkerService``: apply in order, read after a position, report position and health.

The backend is synchronous (SQLite's driver, psycopg's blocking mode), so every database
call runs in a worker thread; the backend serialises writers itself. Waiting readers
sleep on one condition that every apply wakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import grpc
from google.protobuf.message import DecodeError
from opentelemetry.trace import StatusCode

from txsync.rpc import MalformedRequest, ServiceError, abort, answers_errors, check_request
from txsync.shares import Shares, caller_of
from txsync.telemetry import SECONDS_BUCKETS, context_of, tracer, work
from txsync.telemetry.histograms import PlainHistogram, process_wide
from txsync.v1 import common_pb2, worker_pb2
from txsync.worker.backend import (
    APPLY_BATCH_MAX,
    Backend,
    QueryRefused,
    SnapshotBackend,
    Storage,
    ToApply,
)
from txsync.worker.outcomes import Applied, Outcome
from txsync.worker.recent_ids import RecentIds
from txsync.worker.transactions import (
    Transaction,
    param_to_proto,
    statement_from_proto,
    transaction_from_proto,
)

log = logging.getLogger(__name__)

QUERY_TIMEOUT_DEFAULT_S = 5.0
QUERY_TIMEOUT_MAX_S = 60.0
QUERY_ROWS_DEFAULT = 1_000
QUERY_ROWS_MAX = 10_000
STORAGE_EVERY_S = 10.0
"""How often a heartbeat measures the database and its disk (PostgreSQL: a query)."""
READ_THREADS = 2
"""Threads that run reads (``Query``), apart from the applies' and heartbeats': slow reads
queue for these and never take the threads that keep the worker applying and healthy."""
READS_PENDING_MAX = 64
"""Reads running or waiting (for their position or a read thread); one more is refused
(RESOURCE_EXHAUSTED) rather than queued without end, and one caller may hold 48."""
SNAPSHOT_CHUNK_BYTES = 1024 * 1024
RECENT_TX_IDS_MAX = 8_192
"""Ids of the latest transactions applied, by which a read waiting for one is woken (it
checks them at every batch applied, ``APPLY_BATCH_MAX``)."""
APPLIED_IDS_KEPT = 65_536
"""Ids of transactions applied since start remembered as digests (``RecentIds``, 1 MiB):
a read after an older id than these, or than the database's outcomes, waits for it."""
APPLY_QUEUE_MAX = 1_024
"""Apply requests read ahead of the one being applied (dispatch keeps at most its window
in flight, far fewer; past this gRPC's flow control holds the sender back)."""


class _EndOfStream:
    """The request stream ended (or the caller broke it off)."""


def _transaction_of(encoded: bytes) -> Transaction:
    """An ApplyRequest's body, decoded: the one place a worker parses it."""
    work.count(work.BODY_DECODES)
    try:
        return transaction_from_proto(common_pb2.TxBody.FromString(encoded))
    except DecodeError as error:
        raise ServiceError(
            grpc.StatusCode.INVALID_ARGUMENT, f"body: not a valid TxBody ({error})"
        ) from None


APPLY_SECONDS = process_wide(PlainHistogram(
    "txsync.worker.apply.duration",
    "time to apply each batch of transactions to the database, commit included",
    "s", SECONDS_BUCKETS,
))  # fmt: skip
APPLY_BATCH_SIZE = process_wide(PlainHistogram(
    "txsync.worker.apply.batch_size", "transactions per batch applied", "",
    tuple(float(2**k) for k in range(11)),
))  # fmt: skip


async def _read_into(
    requests: AsyncIterator[worker_pb2.ApplyRequest | MalformedRequest],
    arrived: asyncio.Queue[worker_pb2.ApplyRequest | MalformedRequest | _EndOfStream],
) -> None:
    try:
        async for request in requests:
            await arrived.put(request)
    except asyncio.CancelledError:
        raise
    except Exception as error:  # the caller went away mid-stream: it ends here too
        log.debug("apply stream ended by the caller: %r", error)
    await arrived.put(_EndOfStream())


class WorkerServicer:
    """Served with ``add_service``. ``scratch``: where snapshots are staged."""

    def __init__(self, worker_id: str, backend: Backend, scratch: Path | None = None) -> None:
        self.worker_id = worker_id
        self.backend = backend
        self.scratch = scratch
        self.applied = backend.applied()
        self.draining = False
        self.last_heartbeat_s: float | None = None
        """When dispatch last asked (monotonic): it stops asking when it forgot us."""
        self._applied_changed = asyncio.Condition()
        self._exported: Applied | None = None
        self._recent: OrderedDict[str, int] = OrderedDict()
        """The newest ids applied, which wake the reads waiting for them."""
        self._applied_ids = RecentIds(APPLIED_IDS_KEPT)
        """Ids applied since start, further back (older ones: the backend's outcomes)."""
        self._read_threads = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="read")
        self._storage: Storage | None = None
        self._storage_at = 0.0
        self.reads = Shares("reads", READS_PENDING_MAX)
        """Reads running or waiting for their position, by caller (``shares.py``)."""

    def close(self) -> None:
        """After the server stopped: reads still running end at the backend's interrupt."""
        self._read_threads.shutdown(wait=False, cancel_futures=True)

    async def Apply(
        self,
        requests: AsyncIterator[worker_pb2.ApplyRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[worker_pb2.ApplyResponse]:
        """One outcome per transaction, in order. A transaction that is not the next one
        ends the stream with FAILED_PRECONDITION naming our position, so that dispatch
        resumes from there; one applied before is answered from its recorded outcome.

        Requests are read ahead (up to APPLY_QUEUE_MAX) and whatever has arrived while
        the previous batch ran is applied together, in one database transaction: under
        load one commit and one thread hop serve many transactions; one at a time, a
        batch is that one."""
        async for outcomes in self._apply(requests, context):
            for outcome in outcomes:
                yield outcome

    async def ApplyBatches(
        self,
        requests: AsyncIterator[worker_pb2.ApplyBatchesRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[worker_pb2.ApplyBatchesResponse]:
        """``Apply`` with many transactions per message each way: one answer per batch
        applied together (worker-dispatch's stream: 6 messages per transaction fewer
        than one per transaction each way, with a worker per DC, issue 20)."""

        async def each(
            messages: AsyncIterator[worker_pb2.ApplyBatchesRequest],
        ) -> AsyncIterator[worker_pb2.ApplyRequest | MalformedRequest]:
            async for message in messages:
                if isinstance(message, MalformedRequest):
                    yield message
                    return
                if len(message.txs) > APPLY_BATCH_MAX:
                    yield MalformedRequest(
                        "txsync.v1.ApplyBatchesRequest",
                        f"{len(message.txs)} transactions, over {APPLY_BATCH_MAX}",
                    )
                    return
                for request in message.txs:
                    yield request

        async for outcomes in self._apply(each(requests), context):
            yield worker_pb2.ApplyBatchesResponse(outcomes=outcomes)

    async def _apply(
        self,
        requests: AsyncIterator[worker_pb2.ApplyRequest | MalformedRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[list[worker_pb2.ApplyResponse]]:
        """The outcomes of each batch applied together, in order (``Apply``)."""
        arrived: asyncio.Queue[worker_pb2.ApplyRequest | MalformedRequest | _EndOfStream] = (
            asyncio.Queue(APPLY_QUEUE_MAX)
        )
        reader = asyncio.get_running_loop().create_task(_read_into(requests, arrived))
        try:
            ended = False
            while not ended:
                batch: list[worker_pb2.ApplyRequest | MalformedRequest] = []
                while len(batch) < APPLY_BATCH_MAX and (not batch or not arrived.empty()):
                    request = await arrived.get()
                    if isinstance(request, _EndOfStream):
                        ended = True
                        break
                    batch.append(request)
                failure: ServiceError | None = None
                taken: list[worker_pb2.ApplyRequest] = []
                to_apply: list[ToApply] = []
                for request in batch:
                    try:
                        check_request(request)
                        assert not isinstance(request, MalformedRequest)
                        transaction = _transaction_of(request.body)
                    except ServiceError as error:
                        failure = error  # apply what came before it
                        break
                    taken.append(request)
                    to_apply.append(
                        ToApply(request.position, request.tx_id, transaction, not request.skip)
                    )
                started_ns = time.time_ns()
                outcomes, out_of_order = (
                    await work.in_thread(self.backend.apply_many, to_apply)
                    if to_apply
                    else ([], None)
                )
                if to_apply:
                    APPLY_SECONDS.record((time.time_ns() - started_ns) / 1e9)
                    APPLY_BATCH_SIZE.record(len(to_apply))
                answers: list[worker_pb2.ApplyResponse] = []
                for request, outcome in zip(taken, outcomes, strict=False):
                    self._trace_apply(request, outcome, started_ns)
                    self._record_applied(outcome)
                    answers.append(
                        worker_pb2.ApplyResponse(
                            tx_id=outcome.tx_id, outcome=_outcome_to_proto(outcome)
                        )
                    )
                if answers:
                    yield answers
                if outcomes:
                    async with self._applied_changed:  # waiting reads: once per batch
                        self._applied_changed.notify_all()
                if out_of_order is not None:
                    where = self.applied.position
                    failure = ServiceError(
                        grpc.StatusCode.FAILED_PRECONDITION, f"{out_of_order} (applied: {where})"
                    )
                if failure is not None:
                    await abort(context, failure)
                    return
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    def _record_applied(self, outcome: Outcome) -> None:
        if outcome.position > self.applied.position:
            self.applied = Applied(outcome.position, outcome.tx_id, outcome.state_digest)
            self._recent[outcome.tx_id] = outcome.position
            self._applied_ids.add(outcome.tx_id)
            if len(self._recent) > RECENT_TX_IDS_MAX:
                self._recent.popitem(last=False)

    def _trace_apply(
        self, request: worker_pb2.ApplyRequest, outcome: Outcome, started_ns: int
    ) -> None:
        """One span in the transaction's trace (its context came with the request: one
        Apply stream carries many transactions, so gRPC metadata cannot)."""
        context = context_of(request.traceparent)
        if context is None:
            return
        span = tracer().start_span(
            "txsync.tx apply",
            context=context,
            start_time=started_ns,
            attributes={
                "txsync.worker": self.worker_id,
                "txsync.tx_id": outcome.tx_id,
                "txsync.position": outcome.position,
                "txsync.outcome": "OK" if outcome.ok else "FAILED",
                "txsync.skipped": request.skip,
            },
        )
        if not outcome.ok:
            span.set_status(StatusCode.ERROR, outcome.error[:256])
        span.end()

    @answers_errors
    async def Query(
        self,
        request: worker_pb2.WorkerServiceQueryRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> worker_pb2.WorkerServiceQueryResponse:
        timeout_s = QUERY_TIMEOUT_DEFAULT_S
        if request.HasField("timeout"):
            timeout_s = request.timeout.ToTimedelta().total_seconds()
        if not 0 < timeout_s <= QUERY_TIMEOUT_MAX_S:
            raise _invalid(f"timeout: must be above 0 and at most {QUERY_TIMEOUT_MAX_S:.0f} s")
        max_rows = request.max_rows or QUERY_ROWS_DEFAULT
        if max_rows > QUERY_ROWS_MAX:
            raise _invalid(f"max_rows: at most {QUERY_ROWS_MAX}")
        if not request.statement.sql.strip():
            raise _invalid("statement.sql: empty")
        caller = caller_of(context)
        self.reads.take(caller)
        try:
            # Both, when both are given: a client's session position and a transaction
            # of its that this DC had not heard of when the read came.
            waited_until = time.monotonic() + timeout_s
            if request.after_tx_id:
                await self._wait_applied_tx(request.after_tx_id, timeout_s)
            await self._wait_applied(
                request.after_position, max(waited_until - time.monotonic(), 0.001)
            )
            result = await work.in_pool(
                self._read_threads,
                self.backend.query,
                statement_from_proto(request.statement),
                max_rows,
            )
        except QueryRefused as error:
            raise _invalid(f"statement refused (reads only): {error}") from None
        finally:
            self.reads.give_back(caller)
        return worker_pb2.WorkerServiceQueryResponse(
            columns=list(result.columns),
            rows=[
                worker_pb2.WorkerRow(values=[param_to_proto(value) for value in row])
                for row in result.rows
            ],
            truncated=result.truncated,
            position=result.position,
        )

    async def _wait_applied(self, position: int, timeout_s: float) -> None:
        await self._wait_until(
            lambda: self.applied.position >= position,
            f"not applied up to position {position}",
            timeout_s,
        )

    async def _wait_until(self, condition: Callable[[], bool], what: str, timeout_s: float) -> None:
        """Wait for ``condition`` (checked at every apply), or DEADLINE_EXCEEDED."""

        async def reached() -> None:
            async with self._applied_changed:
                await self._applied_changed.wait_for(condition)

        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: see coordinator._run
                await reached()
        except TimeoutError:
            raise ServiceError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{what} within {timeout_s:g} s (applied: {self.applied.position})",
            ) from None

    def _snapshots(self) -> tuple[SnapshotBackend, Path]:
        backend, scratch = self.backend, self.scratch
        if scratch is None or not hasattr(backend, "export_snapshot"):
            raise ServiceError(
                grpc.StatusCode.UNIMPLEMENTED,
                f"snapshots of {backend.name} workers are not implemented yet",
            )
        return cast(SnapshotBackend, backend), scratch

    async def ExportSnapshot(
        self,
        request: worker_pb2.ExportSnapshotRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[worker_pb2.ExportSnapshotResponse]:
        """A consistent copy in chunks; ``resume_offset`` continues the last export."""
        try:
            check_request(request)
            backend, scratch = self._snapshots()
        except ServiceError as error:
            await abort(context, error)
            return
        path = scratch / "export.snapshot"
        if request.resume_offset == 0 or self._exported is None or not path.exists():
            try:
                self._exported = await work.in_thread(backend.export_snapshot, path)
            except OSError as error:
                await abort(context, ServiceError(grpc.StatusCode.INTERNAL, str(error)))
                return
        applied = self._exported
        ok = await work.in_thread(backend.applied_ok, applied.position)
        final_state = (
            common_pb2.TX_STATE_UNSPECIFIED
            if ok is None
            else common_pb2.TX_STATE_OK
            if ok
            else common_pb2.TX_STATE_FAILED
        )
        total = path.stat().st_size
        if request.resume_offset > total:
            await abort(context, _invalid(f"resume_offset {request.resume_offset} > {total}"))
            return
        whole = hashlib.sha256()
        with path.open("rb") as source:
            offset = 0
            while True:
                data = await work.in_thread(source.read, SNAPSHOT_CHUNK_BYTES)
                whole.update(data)
                last = offset + len(data) >= total
                if offset + len(data) > request.resume_offset or last:
                    skip = max(0, request.resume_offset - offset)
                    yield worker_pb2.ExportSnapshotResponse(
                        position=applied.position,
                        state_digest=applied.state_digest,
                        offset=offset + skip,
                        data=data[skip:],
                        total_bytes=total,
                        snapshot_digest=whole.digest() if last else b"",
                        tx_id=applied.tx_id,
                        final_state=final_state,
                    )
                offset += len(data)
                if last:
                    return

    async def ImportSnapshot(
        self,
        requests: AsyncIterator[worker_pb2.ImportSnapshotRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> worker_pb2.ImportSnapshotResponse:
        """Replace the database with a streamed snapshot. Chunks go to a staging file; the
        database is replaced only once the whole snapshot is in and its digest checks, so
        an interrupted import leaves the old database in place (a later import may resume
        at the staging file's length)."""
        try:
            backend, scratch = self._snapshots()
        except ServiceError as error:
            await abort(context, error)
            raise AssertionError("abort raises") from None
        staging = scratch / "import.partial"
        chunk: worker_pb2.ExportSnapshotResponse | None = None
        async for request in requests:
            chunk = request.chunk
            held = staging.stat().st_size if staging.exists() else 0
            if chunk.offset == 0:
                staging.unlink(missing_ok=True)
                held = 0
            if chunk.offset != held:
                await abort(
                    context,
                    ServiceError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"chunk at offset {chunk.offset}, but {held} bytes are staged "
                        "(resume from there, or start at 0)",
                    ),
                )
            with staging.open("ab") as target:
                target.write(chunk.data)
        if chunk is None or not chunk.snapshot_digest:
            await abort(context, _invalid("the snapshot ended before its last chunk"))
            raise AssertionError("abort raises")
        digest = await work.in_thread(_file_digest, staging)
        if digest != chunk.snapshot_digest:
            staging.unlink(missing_ok=True)
            await abort(
                context,
                ServiceError(grpc.StatusCode.DATA_LOSS, "snapshot digest mismatch: discarded"),
            )
        try:
            applied = await work.in_thread(backend.replace_with, staging)
        except OSError as error:
            self.applied = await work.in_thread(backend.applied)
            await abort(context, ServiceError(grpc.StatusCode.INTERNAL, str(error)))
            raise AssertionError("abort raises") from None
        self.applied = applied
        log.warning(
            "database replaced by a snapshot at position %d (%s)", applied.position, applied.tx_id
        )
        return worker_pb2.ImportSnapshotResponse(
            position=applied.position, state_digest=applied.state_digest
        )

    async def _wait_applied_tx(self, tx_id: str, timeout_s: float) -> None:
        if tx_id in self._recent or tx_id in self._applied_ids:
            return
        if await work.in_thread(self.backend.position_of, tx_id) is not None:
            return  # applied before this process started
        await self._wait_until(
            lambda: tx_id in self._recent, f"{tx_id} not applied here", timeout_s
        )

    @answers_errors
    async def Heartbeat(
        self, request: worker_pb2.HeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.HeartbeatResponse:
        self.last_heartbeat_s = time.monotonic()
        # From the database itself: an apply whose stream was cancelled may still have
        # committed. A worker whose database is blocked cannot answer, and so looks dead.
        applied = await work.in_thread(self.backend.applied)
        if applied.position > self.applied.position:
            self.applied = applied
            async with self._applied_changed:
                self._applied_changed.notify_all()
        now = time.monotonic()
        if self._storage is None or now - self._storage_at >= STORAGE_EVERY_S:
            self._storage_at = now
            self._storage = await work.in_thread(self.backend.storage)
        storage = self._storage
        return worker_pb2.HeartbeatResponse(
            worker_id=self.worker_id,
            position=applied.position,
            tx_id=applied.tx_id,
            state_digest=applied.state_digest,
            backend=self.backend.name,
            draining=self.draining,
            database_bytes=storage.database_bytes,
            disk_free_bytes=storage.disk_free_bytes,
            disk_total_bytes=storage.disk_total_bytes,
        )


def _file_digest(path: Path) -> bytes:
    whole = hashlib.sha256()
    with path.open("rb") as source:
        while data := source.read(SNAPSHOT_CHUNK_BYTES):
            whole.update(data)
    return whole.digest()


def _outcome_to_proto(outcome: Outcome) -> common_pb2.Outcome:
    return common_pb2.Outcome(
        state=common_pb2.TX_STATE_OK if outcome.ok else common_pb2.TX_STATE_FAILED,
        rows_affected=list(outcome.rows_affected),
        state_digest=outcome.state_digest,
        error=outcome.error,
        position=outcome.position,
        duplicate_of=outcome.duplicate_of,
        touched_digest=outcome.touched_digest,
    )


def _invalid(reason: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, reason)
