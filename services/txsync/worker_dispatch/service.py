"""``DispatchService``: workers register when they start and drain when they stop; the
DC's coordinator carries copies of the testing worker to and from other DCs
(``dc_copies``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from txsync.codec import WireError, check_url
from txsync.rpc import REFUSALS, ServiceError, abort, answers_errors, check_request
from txsync.v1 import worker_pb2
from txsync.worker_dispatch import dc_copies
from txsync.worker_dispatch.dispatch import Dispatch, TooManyWorkers

WORKER_ID_CHARS_MAX = 63


def _check_worker_id(worker_id: str) -> None:
    if not worker_id or len(worker_id) > WORKER_ID_CHARS_MAX or not worker_id.isprintable():
        raise ServiceError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"worker_id: 1 to {WORKER_ID_CHARS_MAX} printable characters",
        )


class DispatchServicer:
    def __init__(self, dispatch: Dispatch) -> None:
        self._dispatch = dispatch

    @answers_errors
    async def RegisterWorker(
        self, request: worker_pb2.RegisterWorkerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.RegisterWorkerResponse:
        _check_worker_id(request.worker_id)
        try:
            if not request.url:
                raise WireError("url: the worker's host:port is needed")
            check_url(request.url, "url")
        except WireError as error:
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, str(error)) from None
        try:
            await self._dispatch.register(request.worker_id, request.url)
        except TooManyWorkers as error:
            raise ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error)) from None
        # Fed from the log from its own position on (1 for an empty database).
        return worker_pb2.RegisterWorkerResponse(start_position=1)

    @answers_errors
    async def DrainWorker(
        self, request: worker_pb2.DrainWorkerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.DrainWorkerResponse:
        _check_worker_id(request.worker_id)
        if not await self._dispatch.drain(request.worker_id):
            raise ServiceError(grpc.StatusCode.NOT_FOUND, f"no worker {request.worker_id} here")
        return worker_pb2.DrainWorkerResponse()

    async def ExportDcCopy(
        self, request: worker_pb2.ExportDcCopyRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[worker_pb2.ExportDcCopyResponse]:
        try:
            check_request(request)
            async for chunk in dc_copies.export(self._dispatch, request):
                yield chunk
        except REFUSALS as error:
            await abort(context, error)
        except grpc.aio.AioRpcError as error:
            await abort(context, ServiceError(error.code(), error.details() or "refused"))

    @answers_errors
    async def ImportDcCopy(
        self,
        request_iterator: AsyncIterator[worker_pb2.ImportDcCopyRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> worker_pb2.ImportDcCopyResponse:
        try:
            return await dc_copies.import_copy(self._dispatch, request_iterator)
        except grpc.aio.AioRpcError as error:
            raise ServiceError(error.code(), error.details() or "refused") from None
