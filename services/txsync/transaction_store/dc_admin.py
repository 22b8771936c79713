"""The DC's admin front door: the transaction-store answers for the whole DC, and for the
cluster, so operators need one address per DC.

The store knows the admin addresses of its DC's sync-coordinator and worker-dispatch and
the client addresses of the other DCs' stores (``--coordinator``, ``--dispatch``,
``--peer-store``). ``GetStatus`` merges the three services' parts; with ``cluster`` it
adds every other DC's (asked with ``cluster`` unset, so a call never fans out twice) and
recomputes each DC's lag against the most advanced synced length reported. A part that
does not answer within ``TIMEOUT_S`` becomes an alarm and makes its DC unhealthy; it
never fails the call. ``ListWorkers`` goes to the dispatch, ``ListRounds``,
``PauseSync`` and ``ResumeSync`` to the coordinator; ``GetTransaction`` gathers the
transaction's state and history at every DC. Client reads (``Query``) go to the most
advanced healthy worker the dispatch lists.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import Message

from txsync.rpc import ServiceError, new_channel
from txsync.tls import channel_credentials
from txsync.v1 import admin_pb2, admin_pb2_grpc, client_pb2, worker_pb2, worker_pb2_grpc

TIMEOUT_S = 2.0
Credentials = tuple[tuple[str, str], ...]
"""The caller's bearer token, passed on with every call made for it (``access``)."""
QUERY_TIMEOUT_MAX_S = 65.0
"""A read may wait up to 60 s for its position (the worker's limit), plus the read."""


@dataclass
class DcServices:
    """Where the rest of the DC, and the other DCs, answer (None/empty: not configured)."""

    coordinator: str | None = None
    dispatch: str | None = None
    peer_stores: dict[str, str] = field(default_factory=dict)
    peer_ca: bytes | None = None
    """CA of the other DCs' stores: asked over TLS, each checked under its node id."""


class DcAdmin:
    def __init__(self, services: DcServices) -> None:
        self.services = services
        self._stubs: dict[str, admin_pb2_grpc.AdminServiceAsyncStub] = {}
        self._channels: list[grpc.aio.Channel] = []
        self._workers: dict[str, worker_pb2_grpc.WorkerServiceAsyncStub] = {}

    def _stub(self, address: str) -> admin_pb2_grpc.AdminServiceAsyncStub:
        if address not in self._stubs:
            peer = next((n for n, a in self.services.peer_stores.items() if a == address), None)
            if peer is not None and self.services.peer_ca is not None:
                channel = new_channel(
                    address,
                    channel_credentials(self.services.peer_ca),
                    options=[("grpc.ssl_target_name_override", peer)],
                )
            else:
                channel = new_channel(address)
            self._channels.append(channel)
            self._stubs[address] = admin_pb2_grpc.AdminServiceStub(channel)
        return self._stubs[address]

    async def query(
        self,
        request: client_pb2.QueryRequest,
        after_position: int,
        after_tx_id: str,
        credentials: Credentials = (),
    ) -> client_pb2.QueryResponse:
        """Run a read on the most advanced healthy, in-sync worker of this DC, or on the
        one ``request.worker_id`` names (whatever its health: an operator checking it),
        once it applied ``after_position`` and ``after_tx_id`` (one this store does not
        know yet)."""
        listed = await self.call(
            "dispatch", "ListWorkers", admin_pb2.ListWorkersRequest(), credentials
        )
        assert isinstance(listed, admin_pb2.ListWorkersResponse)
        if request.worker_id:
            named = [w for w in listed.workers if w.worker_id == request.worker_id and w.url]
            if not named:
                workers = ", ".join(w.worker_id for w in listed.workers) or "none"
                raise ServiceError(
                    grpc.StatusCode.NOT_FOUND,
                    f"no worker {request.worker_id!r} in this DC (it has {workers})",
                )
            worker = named[0]
        else:
            fit = [w for w in listed.workers if w.healthy and not w.out_of_sync and w.url]
            if not fit:
                raise ServiceError(
                    grpc.StatusCode.UNAVAILABLE, "no healthy worker in this DC to read from"
                )
            worker = max(fit, key=lambda w: w.position)
        if worker.url not in self._workers:
            channel = new_channel(worker.url)
            self._channels.append(channel)
            self._workers[worker.url] = worker_pb2_grpc.WorkerServiceStub(channel)
        asked = worker_pb2.WorkerServiceQueryRequest(
            statement=request.statement,
            after_position=after_position,
            after_tx_id=after_tx_id,
            max_rows=request.max_rows,
        )
        if request.HasField("timeout"):
            asked.timeout.CopyFrom(request.timeout)
        try:
            answer = await self._workers[worker.url].Query(
                asked, timeout=QUERY_TIMEOUT_MAX_S, metadata=credentials
            )
        except grpc.aio.AioRpcError as error:
            raise ServiceError(
                error.code(), f"worker {worker.worker_id}: {error.details()}"
            ) from None
        return client_pb2.QueryResponse(
            columns=answer.columns,
            rows=[client_pb2.QueryRow(values=row.values) for row in answer.rows],
            truncated=answer.truncated,
            position=answer.position,
            worker_id=worker.worker_id,
        )

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()

    def _required(self, what: str) -> str:
        address = getattr(self.services, what)
        if address is None:
            flag = "--" + what
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this transaction-store does not know its DC's {what} (start it with {flag})",
            )
        assert isinstance(address, str)
        return address

    async def call(
        self, what: str, method: str, request: Message, credentials: Credentials = ()
    ) -> Message:
        """Forward an admin call to the DC's ``what`` ("coordinator" or "dispatch"); its
        refusal comes back as it was given."""
        stub = self._stub(self._required(what))
        try:
            answer: Message = await getattr(stub, method)(
                request, timeout=TIMEOUT_S, metadata=credentials
            )
        except grpc.aio.AioRpcError as error:
            raise ServiceError(error.code(), f"{what}: {error.details()}") from None
        return answer

    async def dc_status(
        self, store_part: admin_pb2.DcStatus, credentials: Credentials = ()
    ) -> admin_pb2.DcStatus:
        """The store's part merged with the coordinator's and the dispatch's."""
        status = admin_pb2.DcStatus()
        status.CopyFrom(store_part)
        coordinator, workers = await asyncio.gather(
            self._ask(
                self.services.coordinator, "GetStatus", admin_pb2.GetStatusRequest(), credentials
            ),
            self._ask(
                self.services.dispatch, "ListWorkers", admin_pb2.ListWorkersRequest(), credentials
            ),
        )
        if isinstance(coordinator, admin_pb2.GetStatusResponse):
            part = coordinator.local
            status.view.CopyFrom(part.view)
            status.peers.extend(part.peers)
            status.mode = part.mode
            status.quorum = part.quorum
            status.merge_base.CopyFrom(part.merge_base)  # the live one, not the durable one
            status.counter = max(status.counter, part.counter)
            status.lag = part.lag
            status.alarms.extend(part.alarms)
            status.healthy = status.healthy and part.healthy
        elif isinstance(coordinator, str):
            status.alarms.append(f"sync-coordinator {coordinator}")
            status.healthy = False
        if isinstance(workers, admin_pb2.ListWorkersResponse):
            status.workers_total = len(workers.workers)
            status.workers_healthy = sum(
                1 for w in workers.workers if w.healthy and not w.out_of_sync
            )
            if status.workers_healthy < status.workers_total:
                status.healthy = False
                status.alarms.append(
                    f"{status.workers_total - status.workers_healthy} of "
                    f"{status.workers_total} workers unhealthy or out of sync"
                )
            if workers.alarms:
                status.healthy = False
                status.alarms.extend(f"worker-dispatch: {alarm}" for alarm in workers.alarms)
            status.warnings.extend(f"worker-dispatch: {warning}" for warning in workers.warnings)
        elif isinstance(workers, str):
            status.alarms.append(f"worker-dispatch {workers}")
            status.healthy = False
        return status

    async def others(self, credentials: Credentials = ()) -> list[admin_pb2.DcStatus]:
        """Every other DC's status, from its store; unreachable DCs as unhealthy entries."""
        peers = sorted(self.services.peer_stores.items())
        answers = await asyncio.gather(
            *(
                self._ask(address, "GetStatus", admin_pb2.GetStatusRequest(), credentials)
                for _, address in peers
            )
        )
        statuses = []
        for (node_id, address), answer in zip(peers, answers, strict=True):
            if isinstance(answer, admin_pb2.GetStatusResponse):
                statuses.append(answer.local)
            else:
                statuses.append(
                    admin_pb2.DcStatus(
                        node_id=node_id,
                        healthy=False,
                        alarms=[f"transaction-store at {address} {answer or 'not asked'}"],
                    )
                )
        return statuses

    async def transaction_elsewhere(
        self, tx_id: str, credentials: Credentials = ()
    ) -> list[admin_pb2.GetTransactionResponse]:
        """Each other DC's answer; one that gave none is listed with why (``unanswered``):
        a DC that refused the caller's token must show, not be left out."""
        request = admin_pb2.GetTransactionRequest(tx_id=tx_id, local_only=True)
        peers = self.services.peer_stores
        answers = await asyncio.gather(
            *(
                self._ask(address, "GetTransaction", request, credentials)
                for address in peers.values()
            )
        )
        found: list[admin_pb2.GetTransactionResponse] = []
        for node_id, answer in zip(peers, answers, strict=True):
            if isinstance(answer, admin_pb2.GetTransactionResponse):
                found.append(answer)
            else:
                why = answer if isinstance(answer, str) else "not asked"
                unanswered = admin_pb2.DcTransaction(node_id=node_id, unanswered=why)
                found.append(admin_pb2.GetTransactionResponse(dcs=[unanswered]))
        return found

    async def _ask(
        self, address: str | None, method: str, request: Message, credentials: Credentials = ()
    ) -> Message | str | None:
        """The answer, or why there is none (a string), or None if not configured."""
        if address is None:
            return None
        try:
            answer: Message = await getattr(self._stub(address), method)(
                request, timeout=TIMEOUT_S, metadata=credentials
            )
        except grpc.aio.AioRpcError as error:
            if error.code() in (
                grpc.StatusCode.UNAUTHENTICATED,
                grpc.StatusCode.PERMISSION_DENIED,
            ):
                return f"at {address} refused: {error.details()}"
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return f"at {address}: {error.details()}"
            return f"at {address} unreachable: {error.code().name}"
        return answer


def recompute_lag(statuses: list[admin_pb2.DcStatus]) -> None:
    """Each DC's lag behind the most advanced synced length any DC reported."""
    reported = [s.merge_base.synced_len for s in statuses if s.HasField("merge_base")]
    if not reported:
        return
    front = max(reported)
    for status in statuses:
        if status.HasField("merge_base"):
            status.lag = max(status.lag, front - status.merge_base.synced_len)
