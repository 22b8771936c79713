"""gRPC plumbing shared by every TxSync service.

* ``ServiceError``: a refused request, with its gRPC status and an optional retry hint.
* ``add_service``: registers a servicer from its proto service descriptor, like the
  generated ``add_*_to_server`` helpers, except that a request whose bytes do not decode
  reaches the handler as ``MalformedRequest`` instead of failing inside gRPC (which answers
  UNKNOWN with a Python traceback in the log). Handlers answer it INVALID_ARGUMENT.
* ``answers_errors``: decorator for unary handlers that turns both into statuses.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message


class ServiceError(Exception):
    """A refused request: the gRPC status to answer with, and why."""

    def __init__(
        self, code: grpc.StatusCode, message: str, *, retry_after_ms: int | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_ms = retry_after_ms


class MalformedRequest:
    """Stands in for a request whose bytes are not a valid message of its type."""

    def __init__(self, type_name: str, error: str) -> None:
        self.type_name = type_name
        self.error = error

    def as_error(self) -> ServiceError:
        return ServiceError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"malformed request: not a valid {self.type_name} ({self.error})",
        )


def _safe_deserializer(message_class: type[Message]) -> Callable[[bytes], object]:
    name = message_class.DESCRIPTOR.full_name

    def deserialize(data: bytes) -> object:
        try:
            return message_class.FromString(data)
        except DecodeError as error:
            return MalformedRequest(name, str(error))

    return deserialize


def add_service(server: grpc.aio.Server, servicer: object, service: ServiceDescriptor) -> None:
    handlers = {}
    for method in service.methods:
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        kind = (method.client_streaming, method.server_streaming)
        make = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[kind]
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=_safe_deserializer(request_class),
            response_serializer=response_class.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )


async def abort(context: grpc.aio.ServicerContext[Any, Any], error: ServiceError) -> None:
    if error.retry_after_ms is not None:
        context.set_trailing_metadata((("retry-after-ms", str(error.retry_after_ms)),))
    await context.abort(error.code, error.message)


def check_request(request: object) -> None:
    """Raise INVALID_ARGUMENT for a request that did not decode."""
    if isinstance(request, MalformedRequest):
        raise request.as_error()


Request = TypeVar("Request")
Response = TypeVar("Response")
Handler = Callable[[Any, Request, grpc.aio.ServicerContext[Any, Any]], Awaitable[Response]]


def answers_errors(handler: Handler[Request, Response]) -> Handler[Request, Response]:
    """For unary handlers: a malformed request or a ``ServiceError`` becomes its status."""

    @functools.wraps(handler)
    async def wrapper(
        self: Any, request: Request, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Response:
        try:
            check_request(request)
            return await handler(self, request, context)
        except ServiceError as error:
            await abort(context, error)
            raise AssertionError("context.abort always raises") from None

    return wrapper
