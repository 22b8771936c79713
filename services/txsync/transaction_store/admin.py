"""The transaction-store's part of the admin API (``AdminService``).

Served here: this DC's status as the store sees it (merge base, counter, incoming queue,
alarms such as a torn tail cut at start-up), log truncation, and log export. The other
calls belong to other services (``NOT_HERE``); asked here, they answer UNIMPLEMENTED and
name the service that serves them.
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
from txsync.v1 import admin_pb2, common_pb2

EXPORT_CHUNK_BYTES_MAX = 1024 * 1024

NOT_HERE = {
    "ListWorkers": "worker-dispatch",
    "ListRounds": "sync-coordinator",
    "GetTransaction": "the cluster-wide admin aggregation",
    "PauseSync": "sync-coordinator",
    "ResumeSync": "sync-coordinator",
}


class AdminServicer:
    """Served with ``add_service(..., elsewhere=NOT_HERE)``: the calls other services own
    answer UNIMPLEMENTED naming the owner."""

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
    async def ChangeMembership(
        self,
        request: admin_pb2.ChangeMembershipRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> admin_pb2.ChangeMembershipResponse:
        """Order a membership entry in the synced queue; the next view change applies it
        (PROTOCOL.md §3). Adding needs the node's PeerService address."""
        kind = request.WhichOneof("change")
        if kind == "add":
            member = request.add
            if not member.url:
                raise ServiceError(
                    grpc.StatusCode.INVALID_ARGUMENT, "add: the node's url is needed"
                )
            change = common_pb2.MembershipChange(
                node_id=member.node_id,
                weight=member.weight or 1,
                url=member.url,
                witness=member.witness,
            )
        elif kind == "remove_node_id":
            change = common_pb2.MembershipChange(node_id=request.remove_node_id, weight=0)
        elif kind == "set_weight":
            if request.set_weight.weight < 1:
                raise ServiceError(
                    grpc.StatusCode.INVALID_ARGUMENT, "set_weight: weight must be at least 1"
                )
            change = common_pb2.MembershipChange(
                node_id=request.set_weight.node_id,
                weight=request.set_weight.weight,
                url=request.set_weight.url,
            )
        else:
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT, "give one of add, remove_node_id, set_weight"
            )
        submitted = await self._store.change_membership(change)
        return admin_pb2.ChangeMembershipResponse(tx_id=submitted.tx_id)

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
