"""gRPC plumbing shared by every TxSync service.

* ``ServiceError``: a refused request, with its gRPC status and an optional retry hint;
  a ``Refusal`` (``txsync.refusals``: the rules' own, by kind) is answered with the
  status ``STATUS_OF_REFUSED`` gives it.
* ``add_service``: registers a servicer from its proto service descriptor, like the
  generated ``add_*_to_server`` helpers, except that a request whose bytes do not decode
  reaches the handler as ``MalformedRequest`` instead of failing inside gRPC (which answers
  UNKNOWN with a Python traceback in the log). Handlers answer it INVALID_ARGUMENT.
  A method named ``undecoded`` gets its request's bytes instead, and decodes them itself
  (``decode_request``) once it has room: a call waiting for its turn then holds one
  buffer, not thousands of small objects.
* ``answers_errors``: decorator for unary handlers that turns both into statuses.
* Every call a served method handles is measured (``grpc_server_handling_seconds`` and
  ``grpc_server_handled_total`` by type, service, method and status code, the names of
  the grpc-ecosystem middleware): one wrapper per method, not a gRPC interceptor, whose
  path through grpc.aio is slow (see ``_tracing_server_interceptors``).
* Serving helpers every service process shares: ``new_server`` (message limits, a span
  per call), ``new_channel`` (the same for calls out), ``add_health_and_reflection``,
  ``mark_serving``, ``announce`` (port file) and ``until_stopped`` (signals or a failure).
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import gc
import os
import signal
import sys
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Coroutine,
    Mapping,
    Sequence,
)
from pathlib import Path
from typing import Any, TypeVar, cast

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from txsync.refusals import Refusal, Refused
from txsync.telemetry import work
from txsync.telemetry.histograms import SECONDS_BUCKETS, PlainHistogram, process_wide
from txsync.telemetry.tracing import tracing_configured


class ServiceError(Exception):
    """A refused request: the gRPC status to answer with, and why."""

    def __init__(
        self, code: grpc.StatusCode, message: str, *, retry_after_ms: int | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_ms = retry_after_ms


DecodedMessage = TypeVar("DecodedMessage", bound=Message)


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


def _safe_deserializer(message_class: type[Message], method: str) -> Callable[[bytes], object]:
    name = message_class.DESCRIPTOR.full_name
    received, received_bytes = work.received, work.received_bytes
    kinds = message_class.DESCRIPTOR.oneofs_by_name.get("message")
    # Message fields set beside the kind (``ExchangeRequest.bodies_ahead``).
    beside = [
        f.name
        for f in message_class.DESCRIPTOR.fields
        if kinds is not None and f.containing_oneof is None and f.message_type is not None
    ]

    def deserialize(data: bytes) -> object:
        received[method] += 1
        try:
            message = message_class.FromString(data)
        except DecodeError as error:
            received_bytes[method] += len(data)
            return MalformedRequest(name, str(error))
        if kinds is None:
            received_bytes[method] += len(data)
            return message
        # A stream of several kinds of message: its bytes by kind (what crosses the WAN).
        kind = message.WhichOneof("message")
        extra = next((name for name in beside if message.HasField(name)), None)
        if kind is None or extra is None:
            received_bytes[f"{method}.{kind}" if kind else method] += len(data)
            return message
        # With a field beside the kind, the rest of the message is counted under that
        # field's name: the kind's part (a post) is encoded again to size it, not the
        # part beside it (up to 3 MiB of bodies).
        kind_bytes = getattr(message, kind).ByteSize()
        received_bytes[f"{method}.{kind}"] += kind_bytes
        received_bytes[f"{method}.{extra}"] += len(data) - kind_bytes
        return message

    return deserialize


def _undecoded(method: str) -> Callable[[bytes], bytes]:
    """A request's bytes, counted as ``_safe_deserializer`` counts a message."""
    received, received_bytes = work.received, work.received_bytes

    def deserialize(data: bytes) -> bytes:
        received[method] += 1
        received_bytes[method] += len(data)
        return data

    return deserialize


def decode_request(message_class: type[DecodedMessage], data: bytes) -> DecodedMessage:
    """The request of a method served ``undecoded``; INVALID_ARGUMENT when its bytes
    are not a valid ``message_class``."""
    work.count(work.REQUESTS_DECODED_LATE)
    try:
        return message_class.FromString(data)
    except DecodeError as error:
        raise MalformedRequest(message_class.DESCRIPTOR.full_name, str(error)).as_error() from None


def _counted_serializer(message_class: type[Message], method: str) -> Callable[[Any], bytes]:
    sent, sent_bytes = work.sent, work.sent_bytes
    serialize = message_class.SerializeToString

    def counted(message: Any) -> bytes:
        sent[method] += 1
        data: bytes = serialize(message)
        sent_bytes[method] += len(data)
        return data

    return counted


def add_service(
    server: grpc.aio.Server,
    servicer: object,
    service: ServiceDescriptor,
    elsewhere: Mapping[str, str] | None = None,
    undecoded: Collection[str] = (),
) -> None:
    """Serve ``service`` with ``servicer``'s methods of the same names. A method the
    servicer lacks answers UNIMPLEMENTED, naming who serves it (``elsewhere``: method
    name -> owner) so that a caller knows where to go. The methods named in
    ``undecoded`` get their request's bytes (``decode_request``)."""
    unknown = set(undecoded) - {method.name for method in service.methods}
    if unknown:
        raise ValueError(f"undecoded: {sorted(unknown)} are not methods of {service.full_name}")
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
        implementation = getattr(servicer, method.name, None)
        if implementation is None:
            owner = (elsewhere or {}).get(method.name)
            reason = (
                f"{method.name} is served by {owner}, not by this service"
                if owner
                else f"{method.name} is not served here"
            )
            implementation = _unimplemented(reason, streaming=method.server_streaming)
        labels = (CALL_TYPES[kind], service.full_name, method.name)
        handlers[method.name] = make(
            _measured_stream(implementation, labels)
            if method.server_streaming
            else _measured(implementation, labels),
            request_deserializer=(
                _undecoded(method.name)
                if method.name in undecoded
                else _safe_deserializer(request_class, method.name)
            ),
            response_serializer=_counted_serializer(response_class, method.name),
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )


CALL_TYPES = {
    (False, False): "unary",
    (True, False): "client_stream",
    (False, True): "server_stream",
    (True, True): "bidi_stream",
}
"""``grpc_type`` of a method, by (client streaming, server streaming)."""

CALLS_HANDLED = process_wide(PlainHistogram(
    "grpc.server.handling", "gRPC calls this process's servers handled, by status code: "
    "their time from the handler's start to its answer (a stream's whole life)",
    "s", SECONDS_BUCKETS, labels=("grpc_type", "grpc_service", "grpc_method", "grpc_code"),
    counted_as="grpc.server.handled",
))  # fmt: skip


def record_message_as_call(seconds: float, service: str, method: str, code: str) -> None:
    """One message of a stream that stands for a call of its own (each ``SubmitEach``
    message is a ``Submit``), recorded as a unary call of ``method``: rates and
    latencies by method count it as they count calls. The stream itself is recorded
    when it ends, as ``bidi_stream``."""
    CALLS_HANDLED.record(seconds, "unary", service, method, code)


def _status_name(context: grpc.aio.ServicerContext[Any, Any], error: BaseException | None) -> str:
    """The status a handler answered: what it set or aborted with, else OK when it
    returned, CANCELLED when the caller went away, UNKNOWN for anything it raised."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    if error is None:
        return "OK"
    return "CANCELLED" if isinstance(error, asyncio.CancelledError | GeneratorExit) else "UNKNOWN"


def _measured(handler: Callable[..., Any], labels: tuple[str, str, str]) -> Callable[..., Any]:
    """``handler`` (answering one message), its calls timed by status code."""
    record = CALLS_HANDLED.record

    async def measured(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        started = time.perf_counter()
        error: BaseException | None = None
        try:
            return await handler(request, context)
        except BaseException as raised:
            error = raised
            raise
        finally:
            record(time.perf_counter() - started, *labels, _status_name(context, error))

    return measured


def _measured_stream(
    handler: Callable[..., Any], labels: tuple[str, str, str]
) -> Callable[..., Any]:
    """``handler`` (answering a stream), its calls timed by status code."""
    record = CALLS_HANDLED.record

    async def measured(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        started = time.perf_counter()
        error: BaseException | None = None
        answers: AsyncGenerator[Any] = handler(request, context)
        try:
            async for answer in answers:
                yield answer
        except BaseException as raised:
            error = raised
            raise
        finally:
            # Closed by its caller, this wrapper closes the handler's stream now (its
            # clean-up, e.g. leaving a feed, would otherwise wait for the collector).
            await answers.aclose()
            record(time.perf_counter() - started, *labels, _status_name(context, error))

    return measured


def _unimplemented(reason: str, *, streaming: bool) -> Callable[..., Any]:
    async def unary(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, reason)

    async def stream(
        request: object, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[None]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, reason)
        yield None  # never reached: makes this an async generator like a streaming handler

    return stream if streaming else unary


STATUS_OF_REFUSED = {
    Refused.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    Refused.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Refused.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Refused.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Refused.CONFLICT: grpc.StatusCode.ALREADY_EXISTS,
    Refused.PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    Refused.TRUNCATED: grpc.StatusCode.FAILED_PRECONDITION,
    Refused.PAST_END: grpc.StatusCode.OUT_OF_RANGE,
    Refused.CORRUPT: grpc.StatusCode.DATA_LOSS,
}
"""The gRPC status each kind of ``Refusal`` is answered with."""

REFUSALS = (ServiceError, Refusal)
"""What a handler answers with a status instead of failing: ``except REFUSALS``."""


def service_error(error: ServiceError | Refusal) -> ServiceError:
    """A refusal as the status it is answered with (a ``ServiceError`` is one already)."""
    if isinstance(error, ServiceError):
        return error
    code = STATUS_OF_REFUSED[error.kind]
    return ServiceError(code, error.message, retry_after_ms=error.retry_after_ms)


def _answer_refused(
    context: grpc.aio.ServicerContext[Any, Any], refused: ServiceError | Refusal
) -> ServiceError:
    """Set the call's status (and retry hint) to what ``refused`` is answered with."""
    error = service_error(refused)
    if error.retry_after_ms is not None:
        context.set_trailing_metadata((("retry-after-ms", str(error.retry_after_ms)),))
    context.set_code(error.code)
    context.set_details(error.message)
    return error


async def abort(
    context: grpc.aio.ServicerContext[Any, Any], refused: ServiceError | Refusal
) -> None:
    error = _answer_refused(context, refused)
    await context.abort(error.code, error.message)


def check_request(request: object) -> None:
    """Raise INVALID_ARGUMENT for a request that did not decode."""
    if isinstance(request, MalformedRequest):
        raise request.as_error()


Request = TypeVar("Request")
Response = TypeVar("Response")
Result = TypeVar("Result")
Handler = Callable[[Any, Request, grpc.aio.ServicerContext[Any, Any]], Awaitable[Response]]


def answers_errors(handler: Handler[Request, Response]) -> Handler[Request, Response]:
    """For unary handlers: a malformed request, a ``ServiceError`` or a ``Refusal``
    becomes its status."""

    @functools.wraps(handler)
    async def wrapper(
        self: Any, request: Request, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Response:
        try:
            check_request(request)
            return await handler(self, request, context)
        except REFUSALS as error:
            refused = service_error(error).with_traceback(None)
        # Answered with a status, not raised: ``context.abort`` raises an AbortError that
        # gRPC's call state holds, a cycle that keeps the call's frames (its request and
        # body) until a full collection, which a busy service makes rarely: 50 refused
        # submits left 2,995 objects to collect. gRPC sends no message with a status
        # that is not OK.
        _answer_refused(context, refused)
        return cast(Response, None)

    return wrapper


# --- serving: what every service process does the same way ---------------------------

MESSAGE_BYTES_MAX = 8 * 1024 * 1024
"""Every gRPC message, in and out, on every service."""


def _traced() -> Any:
    """With tracing on, every call gets a span (the standard gRPC instrumentation) except
    health checks: probes' and worker-dispatch's heartbeats to its workers, each every
    second or so, would bury the calls worth reading. Reflection is left out too.

    The instrumentation is imported only when traces are exported (it costs every process
    about 40 ms of start-up otherwise)."""
    from opentelemetry.instrumentation.grpc import filters  # noqa: PLC0415

    return filters.negate(
        filters.any_of(
            filters.health_check(),
            filters.all_of(
                filters.service_name("txsync.v1.WorkerService"), filters.method_name("Heartbeat")
            ),
            filters.service_prefix("grpc.reflection."),
        )
    )


def new_server(*interceptors: grpc.aio.ServerInterceptor) -> grpc.aio.Server:
    """A server whose calls are traced; ``interceptors`` run after tracing (so a refused
    call still has its span)."""
    return grpc.aio.server(
        interceptors=[*_tracing_server_interceptors(), *interceptors],
        options=[
            ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
            ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
            # gRPC sets SO_REUSEPORT by default: a second process started on a port in use
            # would then share it silently, and the kernel would split the callers between
            # the two. Refusing the port makes that mistake a clear start-up error.
            ("grpc.so_reuseport", 0),
        ],
    )


def _tracing_server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    # Only when traces are exported: grpc.aio's interceptor path is slow, and the
    # instrumentation costs about 10 ms at p50 on agreement (submit -> ACCEPTED at 3 DCs,
    # 30 -> 45 ms on this 2-core machine) even with nothing to export.
    if not tracing_configured():
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor  # noqa: PLC0415

    return [aio_server_interceptor(filter_=_traced())]


RECONNECT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 3_000),
)
"""gRPC's reconnect backoff grows to 120 s by default: a peer, store or worker that was
down for a minute (a restart on a loaded machine) could then go unreached for another
two. Capped at 3 s, a restarted service is reached within seconds of listening."""


SERVICE_TOKEN_ENV = "TXSYNC_SERVICE_TOKEN"
"""The bearer token a DC's services present to each other (role ``service`` in the
access file; ``txsync.access``)."""


def _with_token(details: grpc.aio.ClientCallDetails, token: str) -> grpc.aio.ClientCallDetails:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    metadata.add("authorization", f"Bearer {token}")
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


# A channel files each interceptor under the first call kind it implements, so the four
# kinds need four objects.
class _TokenUnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self._token), request)


class _TokenUnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self._token), request)


class _TokenStreamUnary(grpc.aio.StreamUnaryClientInterceptor):
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_token(details, self._token), requests)


class _TokenStreamStream(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_token(details, self._token), requests)


def service_token_interceptors(token: str) -> list[grpc.aio.ClientInterceptor]:
    """Interceptors that add ``token`` as a bearer token to every call of a channel."""
    return [
        _TokenUnaryUnary(token),
        _TokenUnaryStream(token),
        _TokenStreamUnary(token),
        _TokenStreamStream(token),
    ]


def new_channel(
    address: str,
    credentials: grpc.ChannelCredentials | None = None,
    options: Sequence[tuple[str, Any]] = (),
    *,
    as_service: bool = False,
) -> grpc.aio.Channel:
    """A channel whose calls are traced and carry the current trace context in their
    metadata; TLS when ``credentials`` are given. ``as_service``: a call to another of
    the DC's own services, which carries the service token if one is set
    (``TXSYNC_SERVICE_TOKEN``)."""
    all_options = [
        ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
        ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
        *RECONNECT_OPTIONS,
        *options,
    ]
    interceptors: list[grpc.aio.ClientInterceptor] = []
    if tracing_configured():
        from opentelemetry.instrumentation.grpc import aio_client_interceptors  # noqa: PLC0415

        interceptors = aio_client_interceptors(filter_=_traced())
    token = os.environ.get(SERVICE_TOKEN_ENV, "") if as_service else ""
    if token:
        interceptors = [*interceptors, *service_token_interceptors(token)]
    if credentials is None:
        return grpc.aio.insecure_channel(address, all_options, interceptors=interceptors)
    return grpc.aio.secure_channel(address, credentials, all_options, interceptors=interceptors)


def add_health_and_reflection(
    server: grpc.aio.Server, services: Sequence[ServiceDescriptor]
) -> health.aio.HealthServicer:
    """Standard health checking (overall and per service) and server reflection."""
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    names = [service.full_name for service in services]
    reflection.enable_server_reflection(
        (*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    return servicer


async def mark_serving(
    servicer: health.aio.HealthServicer, services: Sequence[ServiceDescriptor]
) -> None:
    for name in ("", *(service.full_name for service in services)):
        await servicer.set(name, health_pb2.HealthCheckResponse.SERVING)


def announce(listen: str, port: int, port_file: Path | None) -> str:
    """The address actually bound, also written (atomically) to ``port_file`` if given:
    tests and supervisors start services on port 0 and read where they landed."""
    address = f"{listen.rsplit(':', 1)[0]}:{port}"
    if port_file is not None:
        temporary = port_file.with_suffix(".tmp")
        temporary.write_text(address)
        temporary.replace(port_file)
    return address


async def until_stopped(*failures: asyncio.Future[Any]) -> None:
    """Wait for SIGTERM or SIGINT, or for any of ``failures`` to complete."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    ends: list[asyncio.Future[Any]] = [loop.create_task(stop.wait()), *failures]
    await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)


def health_status(channel: grpc.Channel, service: str = "", timeout_s: float = 1.0) -> int:
    """One standard gRPC health check (the published stubs lack a typed one)."""
    check = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    answer: health_pb2.HealthCheckResponse = check(
        health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
    )
    return answer.status


EVENT_LOOPS = ("uvloop", "asyncio")

GC_YOUNG_THRESHOLD = 10_000
"""Allocations of tracked objects between collections of the youngest generation (Python's
default: 700; 3.13's: 2,000). A store holds about nine tracked objects per transaction
it keeps (record, history list, a Step per transition, meta, outcome: 430,000 at 16
batching clients per DC), so every full collection walked them all, 65 ms each, ten
times in 30 s: 15% of the store's CPU and an event-loop pause each time. At 700, most of
the objects that reached the oldest generation were a request's, outliving two young
collections by a few milliseconds; at 10,000 they die first (docs/benchmarks.md, Tuning
19)."""


def tune_garbage_collector() -> None:
    """Fewer collections for a long-running service: the young generation's threshold
    raised. (Freezing what the imports made, 40,000 objects, would spare each full
    collection a tenth of its walk: not worth a collection at start-up, which freezing
    needs so as not to keep garbage for good.)"""
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, oldest)


MALLOC_ARENAS_MAX = 2
"""glibc malloc arenas a service may use (``limit_malloc_arenas``)."""
_M_ARENA_MAX = -8
"""``mallopt``'s parameter number for the arena limit (glibc's ``malloc.h``)."""


def limit_malloc_arenas() -> None:
    """At most ``MALLOC_ARENAS_MAX`` malloc arenas, unless ``$MALLOC_ARENA_MAX`` says.

    glibc gives each thread that finds the arenas busy a new one, up to 8 per core, and
    an arena keeps the pages its freed chunks sit among. gRPC's threads and the txlog's
    writer each filled their own under a batched load, and kept them: in the 150k soak
    (``bench.soak --history 150000 --steady-s 150 --probe-s 60``) the store's RSS at the
    long history was 1.60x its RSS at the small one, 1.31x with two arenas. The threads'
    allocations are few next to the event loop's, so they rarely wait for an arena.
    Called before any thread starts (gRPC's, the metrics server's); elsewhere than
    glibc it does nothing."""
    if os.environ.get("MALLOC_ARENA_MAX") or not sys.platform.startswith("linux"):
        return  # glibc read the variable itself at start-up
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt to call)
        return
    mallopt(_M_ARENA_MAX, MALLOC_ARENAS_MAX)


def run_service(main: Coroutine[Any, Any, Result]) -> Result:
    """Run a service's main coroutine on the event loop ``TXSYNC_EVENT_LOOP`` names:
    ``uvloop`` (the default when it is installed) or ``asyncio`` (the standard one),
    with the collector tuned (``tune_garbage_collector``) and malloc's arenas limited
    (``limit_malloc_arenas``)."""
    limit_malloc_arenas()
    choice = os.environ.get("TXSYNC_EVENT_LOOP", "uvloop")
    if choice not in EVENT_LOOPS:
        raise SystemExit(f"TXSYNC_EVENT_LOOP={choice!r}: choose one of {', '.join(EVENT_LOOPS)}")
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if choice == "uvloop":
        try:
            import uvloop  # noqa: PLC0415 - optional
        except ImportError:
            factory = None
        else:
            factory = uvloop.new_event_loop
    tune_garbage_collector()
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
