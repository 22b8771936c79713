"""worker-dispatch's part of the admin API: ``ListWorkers`` (position, role, health, out of
sync, last heartbeat). Other calls answer UNIMPLEMENTED, naming the service that owns them.
"""

from __future__ import annotations

import time
from typing import Any

import grpc

from txsync.rpc import answers_errors
from txsync.v1 import admin_pb2
from txsync.worker_dispatch.dispatch import Dispatch

NOT_HERE = {
    "GetStatus": "transaction-store and sync-coordinator",
    "ListRounds": "sync-coordinator",
    "GetTransaction": "transaction-store",
    "ChangeMembership": "transaction-store",
    "PauseSync": "sync-coordinator",
    "ResumeSync": "sync-coordinator",
    "TruncateLog": "transaction-store",
    "ExportLog": "transaction-store",
}


class DispatchAdmin:
    def __init__(self, dispatch: Dispatch) -> None:
        self._dispatch = dispatch

    @answers_errors
    async def ListWorkers(
        self, request: admin_pb2.ListWorkersRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> admin_pb2.ListWorkersResponse:
        response = admin_pb2.ListWorkersResponse(
            alarms=self._dispatch.alarms(), warnings=self._dispatch.warnings()
        )
        wall_minus_monotonic = time.time() - time.monotonic()
        for link in self._dispatch.workers.values():
            status = response.workers.add(
                worker_id=link.worker_id,
                url=link.address,
                testing=link.worker_id == self._dispatch.tester,
                healthy=link.healthy,
                out_of_sync=bool(link.out_of_sync),
                position=link.position,
                state_digest=link.state_digest,
                recovery_progress=link.recovery_progress,
            )
            copying = self._dispatch.dc_import
            if copying is not None and copying.worker_id == link.worker_id:
                status.recovery_progress = copying.bytes_done / max(1, copying.bytes_total)
            if link.storage is not None:
                status.database_bytes = link.storage.database_bytes
                status.disk_free_bytes = link.storage.disk_free_bytes
                status.disk_total_bytes = link.storage.disk_total_bytes
            if link.last_heartbeat_s:
                status.last_heartbeat.FromMilliseconds(
                    int((link.last_heartbeat_s + wall_minus_monotonic) * 1000)
                )
        return response
