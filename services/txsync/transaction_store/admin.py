"""The transaction-store's part of the admin API (``AdminService``).

Served here: this DC's status as the store sees it (merge base, counter, incoming queue,
alarms such as a torn tail cut at start-up), log truncation, and log export. The other
calls belong to services that aggregate into this one as they arrive; until then they
answer UNIMPLEMENTED and say which service will serve them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from txsync.codec import base_to_proto
from txsync.rpc import ServiceError, abort, answers_errors, check_request
from txsync.transaction_store.store import TransactionStore
from txsync.transaction_store.txlog.framing import HEADER, scan
from txsync.v1 import admin_pb2, admin_pb2_grpc

EXPORT_CHUNK_BYTES_MAX = 1024 * 1024

NOT_HERE = {
    "ListWorkers": "worker-dispatch",
    "ListRounds": "sync-coordinator",
    "GetTransaction": "the cluster-wide admin aggregation",
    "ChangeMembership": "sync-coordinator",
    "PauseSync": "sync-coordinator",
    "ResumeSync": "sync-coordinator",
}


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, store: TransactionStore) -> None:
        self._store = store

    @answers_errors
    async def GetStatus(
        self, request: admin_pb2.GetStatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> admin_pb2.GetStatusResponse:
        if request.cluster:
            raise ServiceError(
                grpc.StatusCode.UNIMPLEMENTED,
                "the cluster-wide status comes with the sync-coordinator; ask without cluster",
            )
        store, state = self._store, self._store.state
        alarms = list(store.alarms)
        if store.broken is not None:
            alarms.append(store.broken)
        local = admin_pb2.DcStatus(
            node_id=state.node_id,
            merge_base=base_to_proto(state.merge_base),
            counter=state.counter,
            incoming_len=len(state.incoming) + len(state.pending_local),
            alarms=alarms,
            healthy=store.broken is None,
        )
        return admin_pb2.GetStatusResponse(local=local)

    @answers_errors
    async def TruncateLog(
        self, request: admin_pb2.TruncateLogRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> admin_pb2.TruncateLogResponse:
        dropped, backups = await self._store.truncate(request.below_position)
        return admin_pb2.TruncateLogResponse(truncated=dropped, backup_file=", ".join(backups))

    async def ExportLog(
        self, request: admin_pb2.ExportLogRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[admin_pb2.ExportLogResponse]:
        """The current log's frames as they are on disk, in chunks of whole frames."""
        try:
            check_request(request)
        except ServiceError as error:
            await abort(context, error)
        data = await asyncio.to_thread(self._store.files.current.read_bytes)
        chunk = bytearray()
        for offset, payload in scan(data).frames:
            frame = data[offset : offset + HEADER.size + len(payload)]
            if chunk and len(chunk) + len(frame) > EXPORT_CHUNK_BYTES_MAX:
                yield admin_pb2.ExportLogResponse(records=bytes(chunk))
                chunk = bytearray()
            chunk += frame
        if chunk:
            yield admin_pb2.ExportLogResponse(records=bytes(chunk))

    # Calls other services own: an explicit refusal naming the owner.

    async def ListWorkers(
        self, request: admin_pb2.ListWorkersRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> admin_pb2.ListWorkersResponse:
        await _elsewhere(context, "ListWorkers")
        raise AssertionError("context.abort always raises")

    async def ListRounds(
        self, request: admin_pb2.ListRoundsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> admin_pb2.ListRoundsResponse:
        await _elsewhere(context, "ListRounds")
        raise AssertionError("context.abort always raises")

    async def GetTransaction(
        self,
        request: admin_pb2.GetTransactionRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> admin_pb2.GetTransactionResponse:
        await _elsewhere(context, "GetTransaction")
        raise AssertionError("context.abort always raises")

    async def ChangeMembership(
        self,
        request: admin_pb2.ChangeMembershipRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> admin_pb2.ChangeMembershipResponse:
        await _elsewhere(context, "ChangeMembership")
        raise AssertionError("context.abort always raises")

    async def PauseSync(
        self, request: admin_pb2.PauseSyncRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> admin_pb2.PauseSyncResponse:
        await _elsewhere(context, "PauseSync")
        raise AssertionError("context.abort always raises")

    async def ResumeSync(
        self, request: admin_pb2.ResumeSyncRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> admin_pb2.ResumeSyncResponse:
        await _elsewhere(context, "ResumeSync")
        raise AssertionError("context.abort always raises")


async def _elsewhere(context: grpc.aio.ServicerContext[Any, Any], name: str) -> None:
    await context.abort(
        grpc.StatusCode.UNIMPLEMENTED, f"{name} is served by {NOT_HERE[name]}, not by this service"
    )
