"""Copies of a DC's database for another DC (docs/dc-snapshots.md): this DC's testing
worker exported with what its store says of the copy (``export``), and another DC's copy
imported into this DC's testing worker (``import_copy``). The sync-coordinators carry
them across DCs (``sync_coordinator/dc_copies.py``); the store adopts an imported copy's
base when the coordinator asks it to.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc

from txsync.rpc import ServiceError
from txsync.v1 import common_pb2, store_pb2, worker_pb2
from txsync.worker_dispatch.dispatch import (
    RECOVERY_TIMEOUT_S,
    DcCopyImport,
    Dispatch,
    WorkerLink,
)

log = logging.getLogger(__name__)

STOPPED_FEEDING_S = 30.0
"""How long an import waits for the pipeline to stop feeding the worker it replaces."""
CHUNK_BYTES_MAX = 4 * 1024 * 1024
"""A chunk of a copy from another DC (workers send 1 MiB ones)."""


def _tester(dispatch: Dispatch) -> WorkerLink:
    tester = dispatch.workers.get(dispatch.tester or "")
    if tester is None or not tester.fed:
        raise ServiceError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "no testing worker in sync here to copy (asked again later)",
        )
    return tester


async def export(
    dispatch: Dispatch, request: worker_pb2.ExportDcCopyRequest
) -> AsyncIterator[worker_pb2.ExportDcCopyResponse]:
    """The testing worker's snapshot in chunks, the first with the store's description
    of it for ``request.adopter``. Raises ``ServiceError`` before the first chunk."""
    if dispatch.exports.locked():
        raise ServiceError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "a snapshot is being exported here already (asked again later)",
        )
    tester = _tester(dispatch)
    async with dispatch.exports:
        chunks = tester.stub.ExportSnapshot(
            worker_pb2.ExportSnapshotRequest(), timeout=RECOVERY_TIMEOUT_S
        )
        try:
            first = True
            async for chunk in chunks:
                if not first:
                    yield worker_pb2.ExportDcCopyResponse(chunk=chunk)
                    continue
                first = False
                if chunk.final_state not in (common_pb2.TX_STATE_OK, common_pb2.TX_STATE_FAILED):
                    raise ServiceError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"worker {tester.worker_id} has no outcome recorded at position "
                        f"{chunk.position}: nothing to copy from yet",
                    )
                described = await dispatch.store.ExportBase(
                    store_pb2.ExportBaseRequest(
                        position=chunk.position,
                        final_state=chunk.final_state,
                        adopter=request.adopter,
                        adopter_len=request.adopter_len,
                    )
                )
                adoption = described.adoption
                if adoption.meta.tx_id != chunk.tx_id:
                    raise ServiceError(
                        grpc.StatusCode.INTERNAL,
                        f"worker {tester.worker_id} holds {chunk.tx_id} at position "
                        f"{chunk.position}, the store {adoption.meta.tx_id}",
                    )
                log.warning(
                    "DC COPY: exporting %s at position %d for %s (%d bytes)",
                    tester.worker_id, chunk.position, request.adopter, chunk.total_bytes,
                )  # fmt: skip
                yield worker_pb2.ExportDcCopyResponse(chunk=chunk, adoption=adoption)
        finally:
            chunks.cancel()


def _import_target(dispatch: Dispatch) -> WorkerLink:
    """The testing worker, or a worker waiting for an earlier copy's adoption, or the
    first healthy one."""
    tester = dispatch.workers.get(dispatch.tester or "")
    if tester is not None and tester.healthy:
        return tester
    for link in dispatch.workers.values():
        if link.healthy and link.dc_copy:
            return link
    for link in dispatch.workers.values():
        if link.healthy:
            return link
    raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION, "no healthy worker here to copy into")


async def import_copy(
    dispatch: Dispatch, chunks: AsyncIterator[worker_pb2.ImportDcCopyRequest]
) -> worker_pb2.ImportDcCopyResponse:
    """Import another DC's copy into this DC's testing worker, which the pipeline stops
    feeding first, and keeps out of it until the store adopted the copy's base
    (``Dispatch._copies_adopted``). Raises ``ServiceError``."""
    if dispatch.dc_import is not None:
        raise ServiceError(
            grpc.StatusCode.RESOURCE_EXHAUSTED, "another DC's copy is being imported here"
        )
    target = _import_target(dispatch)
    progress = dispatch.dc_import = DcCopyImport(target.worker_id, time.monotonic())
    try:
        target.dc_copy = "importing another DC's copy"
        dispatch.changed()
        await _stopped_feeding(dispatch, target)
        described: list[common_pb2.BaseAdoption] = []
        problems: list[ServiceError] = []

        async def requests() -> AsyncIterator[worker_pb2.ImportSnapshotRequest]:
            # A problem ends the stream early (the worker keeps its database: an import
            # completes only with the whole snapshot and its digest) and is raised below.
            async for message in chunks:
                chunk = message.chunk
                try:
                    if len(chunk.data) > CHUNK_BYTES_MAX:
                        raise ServiceError(
                            grpc.StatusCode.INVALID_ARGUMENT,
                            f"a chunk over {CHUNK_BYTES_MAX} bytes",
                        )
                    if not described:
                        if not message.HasField("adoption"):
                            raise ServiceError(
                                grpc.StatusCode.INVALID_ARGUMENT,
                                "the first chunk must describe the copy (adoption)",
                            )
                        _check_described(message.adoption, chunk)
                        described.append(message.adoption)
                except ServiceError as problem:
                    problems.append(problem)
                    return
                progress.bytes_done = chunk.offset + len(chunk.data)
                progress.bytes_total = chunk.total_bytes
                yield worker_pb2.ImportSnapshotRequest(chunk=chunk)

        async with dispatch.exports:  # the worker keeps one snapshot file at a time
            try:
                imported = await target.stub.ImportSnapshot(requests(), timeout=RECOVERY_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                if problems:
                    raise problems[0] from None
                raise ServiceError(error.code(), f"{target.worker_id}: {error.details()}") from None
        if problems:
            raise problems[0]
        if not described or imported.position != described[0].before.synced_len + 1:
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the copy imported holds position {imported.position}, not the one it "
                "was described at",
            )
    except BaseException:
        if target.dc_copy == "importing another DC's copy":
            target.dc_copy = ""
            dispatch.changed()
        raise
    finally:
        dispatch.dc_import = None
    target.position, target.state_digest = imported.position, imported.state_digest
    target.needs_snapshot = target.out_of_sync = ""
    target.dc_copy = f"holds another DC's copy at position {imported.position}"
    log.warning(
        "DC COPY: %s holds another DC's copy at position %d (%d bytes in %.0f s); fed again "
        "once the store adopts it",
        target.worker_id, imported.position, progress.bytes_total,
        time.monotonic() - progress.started_s,
    )  # fmt: skip
    dispatch.changed()
    return worker_pb2.ImportDcCopyResponse(
        position=imported.position, state_digest=imported.state_digest
    )


def _check_described(
    adoption: common_pb2.BaseAdoption, chunk: worker_pb2.ExportSnapshotResponse
) -> None:
    """The copy is what its description says: the entry at its position."""
    position = adoption.before.synced_len + 1
    if chunk.position != position or chunk.tx_id != adoption.meta.tx_id:
        raise ServiceError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the copy holds {chunk.tx_id or 'nothing'} at position {chunk.position}; its "
            f"description names {adoption.meta.tx_id} at {position}",
        )
    if chunk.final_state != adoption.final_state:
        raise ServiceError(
            grpc.StatusCode.INVALID_ARGUMENT,
            "the copy applied its last transaction otherwise than its description says",
        )


async def _stopped_feeding(dispatch: Dispatch, target: WorkerLink) -> None:
    """Wait until no pipeline feeds ``target`` (the next one leaves it out)."""
    deadline = time.monotonic() + STOPPED_FEEDING_S
    while dispatch.feeds(target.worker_id):
        if time.monotonic() > deadline:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                f"the pipeline still feeds {target.worker_id} (asked again later)",
            )
        await asyncio.sleep(0.05)
