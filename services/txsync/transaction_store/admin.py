"""The transaction-store's part of the admin API (``AdminService``).

The store is the DC's admin front door (``dc_admin``): it serves its own part (the txlog's
alarms, such as a torn tail cut at start-up; membership changes, truncation, export),
merges in the sync-coordinator's and worker-dispatch's, forwards the calls they own, and
gathers the other DCs' answers for the cluster view and for transaction lookups.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from txsync.access import forwarded_credentials
from txsync.codec import base_to_proto, configuration_to_proto
from txsync.rpc import REFUSALS, ServiceError, abort, answers_errors, check_request
from txsync.shares import Shares, caller_of
from txsync.telemetry import work
from txsync.transaction_store.dc_admin import DcAdmin, DcServices, recompute_lag
from txsync.transaction_store.retention import TruncationHold
from txsync.transaction_store.service import record_to_get_response
from txsync.transaction_store.store import TransactionStore
from txsync.transaction_store.txlog.framing import HEADER, scan
from txsync.transaction_store.validation import check_tx_id
from txsync.v1 import admin_pb2, common_pb2

EXPORT_CHUNK_BYTES_MAX = 1024 * 1024
LOG_EXPORTS_MAX = 2
"""``ExportLog`` calls at once: each holds the current log file in memory (up to
``--log-file-bytes-max``, 16 MiB by default) while it streams it."""

ONWARD_CALLS_MAX = 32
"""Admin calls at once that wait on another service (this DC's coordinator or dispatch,
other DCs): each may wait up to ``dc_admin.TIMEOUT_S`` on a service that does not
answer, and a cluster status asks every DC. One caller may hold three quarters."""

NOT_HERE: dict[str, str] = {}


class AdminServicer:
    """Served with ``add_service(..., elsewhere=NOT_HERE)``: the calls other services own
    answer UNIMPLEMENTED naming the owner."""

    def __init__(self, store: TransactionStore, dc: DcAdmin | None = None) -> None:
        self._store = store
        self._dc = dc or DcAdmin(DcServices())
        self.exports = Shares("log exports", LOG_EXPORTS_MAX)
        self.onward = Shares("admin calls waiting on other services", ONWARD_CALLS_MAX)

    @answers_errors
    async def GetStatus(
        self, request: admin_pb2.GetStatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> admin_pb2.GetStatusResponse:
        store, state = self._store, self._store.state
        alarms = list(store.alarms)
        if store.broken is not None:
            alarms.append(store.broken)
        if missing_body := store.missing_body_alarm():
            alarms.append(missing_body)
        hold = store.truncation_hold()
        local = admin_pb2.DcStatus(
            node_id=state.node_id,
            merge_base=base_to_proto(state.merge_base),
            counter=state.counter,
            incoming_len=len(state.incoming) + len(state.pending_local),
            alarms=alarms,
            healthy=store.broken is None and not missing_body,
            retention=_retention(store, hold),
        )
        if state.view is not None:
            local.configuration.CopyFrom(configuration_to_proto(state.view.configuration))
        local.warnings.extend(_let_go(store, hold))
        credentials = forwarded_credentials(context)
        with self.onward.held(caller_of(context)):
            local = await self._dc.dc_status(local, credentials)
            answer = admin_pb2.GetStatusResponse(local=local)
            if request.cluster:
                answer.others.extend(await self._dc.others(credentials))
                recompute_lag([answer.local, *answer.others])
        return answer

    @answers_errors
    async def ListWorkers(
        self, request: admin_pb2.ListWorkersRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> admin_pb2.ListWorkersResponse:
        with self.onward.held(caller_of(context)):
            answer = await self._dc.call(
                "dispatch", "ListWorkers", request, forwarded_credentials(context)
            )
        assert isinstance(answer, admin_pb2.ListWorkersResponse)
        return answer

    @answers_errors
    async def ListRounds(
        self, request: admin_pb2.ListRoundsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> admin_pb2.ListRoundsResponse:
        with self.onward.held(caller_of(context)):
            answer = await self._dc.call(
                "coordinator", "ListRounds", request, forwarded_credentials(context)
            )
        assert isinstance(answer, admin_pb2.ListRoundsResponse)
        return answer

    @answers_errors
    async def PauseSync(
        self, request: admin_pb2.PauseSyncRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> admin_pb2.PauseSyncResponse:
        with self.onward.held(caller_of(context)):
            await self._dc.call("coordinator", "PauseSync", request, forwarded_credentials(context))
        return admin_pb2.PauseSyncResponse()

    @answers_errors
    async def ResumeSync(
        self, request: admin_pb2.ResumeSyncRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> admin_pb2.ResumeSyncResponse:
        with self.onward.held(caller_of(context)):
            await self._dc.call(
                "coordinator", "ResumeSync", request, forwarded_credentials(context)
            )
        return admin_pb2.ResumeSyncResponse()

    @answers_errors
    async def GetTransaction(
        self,
        request: admin_pb2.GetTransactionRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> admin_pb2.GetTransactionResponse:
        """The transaction at this DC and (unless ``local_only``) at every other DC, those
        that gave no answer listed with why; NOT_FOUND only if no DC knows it."""
        tx_id = check_tx_id(request.tx_id)
        answer = admin_pb2.GetTransactionResponse()
        record = self._store.state.txs.get(tx_id)
        if record is not None:
            local = record_to_get_response(record, self._store.config.node_id, None)
            answer.meta.CopyFrom(local.meta)
            answer.trace_id = _trace_id(record.traceparent)
            dc = answer.dcs.add(node_id=self._store.config.node_id, state=local.state)
            dc.history.extend(local.history)
            if local.HasField("outcome"):
                dc.outcome.CopyFrom(local.outcome)
        if not request.local_only:
            with self.onward.held(caller_of(context)):
                elsewhere = await self._dc.transaction_elsewhere(
                    tx_id, forwarded_credentials(context)
                )
            for other in elsewhere:
                answer.dcs.extend(other.dcs)
                if not answer.HasField("meta") and other.HasField("meta"):
                    answer.meta.CopyFrom(other.meta)
                answer.trace_id = answer.trace_id or other.trace_id
        if not any(not dc.unanswered for dc in answer.dcs):
            who = "this DC does not know" if request.local_only else "no DC knows"
            raise ServiceError(grpc.StatusCode.NOT_FOUND, f"{who} {tx_id}")
        return answer

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
        submitted = await self._store.change_membership(change, adds=kind == "add")
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
        caller = caller_of(context)
        try:
            check_request(request)
            self.exports.take(caller)
        except REFUSALS as error:
            await abort(context, error)
        try:
            async for answer in self._export():
                yield answer
        finally:
            self.exports.give_back(caller)

    async def _export(self) -> AsyncIterator[admin_pb2.ExportLogResponse]:
        data = await work.in_thread(self._store.files.current.read_bytes)
        chunk = bytearray()
        for offset, payload in scan(data).frames:
            frame = data[offset : offset + HEADER.size + len(payload)]
            if chunk and len(chunk) + len(frame) > EXPORT_CHUNK_BYTES_MAX:
                yield admin_pb2.ExportLogResponse(records=bytes(chunk))
                chunk = bytearray()
            chunk += frame
        if chunk:
            yield admin_pb2.ExportLogResponse(records=bytes(chunk))


def _retention(store: TransactionStore, hold: TruncationHold) -> admin_pb2.Retention:
    progress = store.progress
    retention = admin_pb2.Retention(
        history_from=store.state.history_len + 1,
        truncatable_below=hold.below,
        txs_held=len(store.state.txs),
        held_by=hold.held_by,
        truncated_total=progress.truncated_total,
    )
    if progress.last_rotation_ms:
        retention.last_rotation.FromMilliseconds(progress.last_rotation_ms)
    retention.idempotency_window.FromMilliseconds(store.config.idempotency_window_ms)
    return retention


def _let_go(store: TransactionStore, hold: TruncationHold) -> list[str]:
    """The peers truncation waits for no longer (``--peer-hold-max``)."""
    end, most = store.state.synced_len, store.config.peer_hold_max
    return [
        f"LET GO: {peer} is at {length}, {end - length} positions behind, past "
        f"--peer-hold-max ({most}): it starts from another DC's copy when back"
        for peer, length in hold.let_go
    ]


def _trace_id(traceparent: str) -> str:
    """The trace id (32 hex digits) of a W3C traceparent, "" if there is none."""
    parts = traceparent.split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else ""
