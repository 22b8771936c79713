"""``DispatchService``: workers register when they start and drain when they stop."""

from __future__ import annotations

from typing import Any

import grpc

from txsync.codec import WireError, check_url
from txsync.rpc import ServiceError, answers_errors
from txsync.v1 import worker_pb2
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
