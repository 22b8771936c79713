"""The sync-coordinator's part of the admin API: this DC's view of the protocol.

``GetStatus`` answers from the coordinator's snapshot (``Coordinator.snapshot``, a copy
taken at the call): the installed view, the quorum state (a node in a minority
says so here, in its health and in its log), the round mode, the merge base and counter,
the lag behind the most advanced peer, and when each peer was last heard from and how
far along its last post was. ``ListRounds`` lists recent rounds; ``PauseSync`` and
``ResumeSync`` stop and restart this DC's part in the protocol. The DC's
transaction-store aggregates this with its own part and the worker-dispatch's, and asks
the other DCs' stores for the cluster view; other calls answer UNIMPLEMENTED here,
naming the service that owns them.
"""

from __future__ import annotations

import time
from typing import Any

import grpc

from txsync.codec import base_to_proto
from txsync.protocol import Mode, QuorumState, RoundOutcome
from txsync.rpc import ServiceError, answers_errors
from txsync.sync_coordinator.coordinator import Coordinator
from txsync.sync_coordinator.rounds import ROUNDS_KEPT
from txsync.v1 import admin_pb2, common_pb2, peer_pb2

QUORUM_STATES = {
    QuorumState.MAJORITY: admin_pb2.QUORUM_STATE_MAJORITY,
    QuorumState.MINORITY: admin_pb2.QUORUM_STATE_MINORITY,
    QuorumState.VIEW_CHANGE: admin_pb2.QUORUM_STATE_VIEW_CHANGE,
}
MODES = {Mode.BUSY: admin_pb2.SYNC_MODE_BUSY, Mode.IDLE: admin_pb2.SYNC_MODE_IDLE}


NOT_HERE = {
    "ListWorkers": "worker-dispatch",
    "GetTransaction": "transaction-store",
    "TruncateLog": "transaction-store",
    "ExportLog": "transaction-store",
    "ChangeMembership": "transaction-store",
}


class CoordinatorAdmin:
    """Served with ``add_service(..., elsewhere=NOT_HERE)``."""

    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator

    @answers_errors
    async def GetStatus(
        self, request: admin_pb2.GetStatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> admin_pb2.GetStatusResponse:
        snapshot = self._coordinator.snapshot()
        if snapshot is None:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, "still loading the protocol state")
        recent_ms = snapshot.now_ms - self._coordinator.config.timing.exclusion_timeout_ms
        wall_minus_core_ms = time.time_ns() // 1_000_000 - snapshot.now_ms
        quorum = snapshot.quorum
        local = admin_pb2.DcStatus(
            node_id=snapshot.node_id,
            view=common_pb2.View(view_no=snapshot.view_no, members=list(snapshot.members)),
            mode=admin_pb2.SYNC_MODE_PAUSED if snapshot.paused else MODES[snapshot.mode],
            quorum=QUORUM_STATES[quorum],
            merge_base=base_to_proto(snapshot.merge_base),
            counter=snapshot.counter,
            incoming_len=snapshot.incoming_len,
            lag=snapshot.lag,
            healthy=quorum is QuorumState.MAJORITY,
        )
        for peer in snapshot.peers:
            status = local.peers.add(
                member=peer_pb2.Member(node_id=peer.node_id, url=peer.address, weight=peer.weight),
                reachable=peer.heard_ms > recent_ms,
            )
            if peer.last_post is not None:
                status.last_counter = peer.last_post[0]
                status.last_merge_base.CopyFrom(base_to_proto(peer.last_post[1]))
            status.last_heard.FromMilliseconds(peer.heard_ms + wall_minus_core_ms)
        local.alarms.extend(snapshot.divergence_alarms)
        if snapshot.dc_copy is not None:
            local.warnings.append(snapshot.dc_copy.describe(time.monotonic()))
        if snapshot.divergence_alarm_count:
            local.healthy = False
        if snapshot.paused:
            local.healthy = False
            local.alarms.append("PAUSED: an operator paused sync at this DC (ResumeSync)")
        elif quorum is QuorumState.MINORITY:
            local.alarms.append(
                "MINORITY: this DC is not in a view that holds a weight majority; it adds "
                "nothing and its transactions stay INCOMING until it is back"
            )
        return admin_pb2.GetStatusResponse(local=local)

    @answers_errors
    async def ListRounds(
        self, request: admin_pb2.ListRoundsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> admin_pb2.ListRoundsResponse:
        limit = request.limit or 50
        if limit > ROUNDS_KEPT:
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, f"limit: at most {ROUNDS_KEPT}")
        answer = admin_pb2.ListRoundsResponse()
        recent = self._coordinator.rounds.recent
        for record in list(recent)[-limit:][::-1]:  # newest first
            info = answer.rounds.add(
                round_no=record.round_no,
                posts_sent=record.posts_sent,
                posts_received=record.posts_received,
                added=record.added,
                empty=record.outcome is RoundOutcome.DEADLINE,
                idle=record.idle,
                outcome=record.outcome.value,
            )
            info.started.FromNanoseconds(record.started_unix_ns)
            info.duration.FromNanoseconds(record.duration_ns)
        return answer

    @answers_errors
    async def PauseSync(
        self, request: admin_pb2.PauseSyncRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> admin_pb2.PauseSyncResponse:
        self._coordinator.set_paused(True)
        return admin_pb2.PauseSyncResponse()

    @answers_errors
    async def ResumeSync(
        self, request: admin_pb2.ResumeSyncRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> admin_pb2.ResumeSyncResponse:
        self._coordinator.set_paused(False)
        return admin_pb2.ResumeSyncResponse()
