"""Access control for the client and admin APIs: who may call what.

Off unless a service is given ``--access-file``: the dev cluster runs open on loopback.
The file (TOML) names callers and their role::

    [[token]]                       # a bearer token ("authorization: Bearer <token>")
    name = "ops"
    role = "admin"
    sha256 = "9f86d0..."            # SHA-256 of the token, hex: the file holds no secret

    [[identity]]                    # a verified mTLS client certificate
    common_name = "ops.dc1"
    role = "reader"

Roles: ``client`` may use the client API; ``reader`` may read (client reads, admin
status and lookups); ``admin`` may do everything, including the admin calls that change
the cluster (membership, pause and resume, log truncation). ``service`` is a DC's own
services calling each other, and only it may call ``StoreInternalService`` (protocol
steps, bodies, states), ``WorkerService`` (apply, snapshots; its reads are open to every
role) and ``DispatchService`` (worker registration): anyone who could reach those could
read every body or make a transaction that never ran show OK. The services send the
token of ``TXSYNC_SERVICE_TOKEN`` on those calls (``rpc.new_channel(as_service=True)``).
A call without credentials is answered UNAUTHENTICATED, one whose role is too weak
PERMISSION_DENIED; every refusal is logged and counted (``txsync.access.refused``).
Calls between DCs (``PeerService``, guarded by mutual TLS) and health checks are not
governed here.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

import grpc

from txsync.shares import CALLER
from txsync.telemetry import Metrics, ServiceTelemetry
from txsync.telemetry.logs import event as log_event
from txsync.tls import is_loopback, is_secure

log = logging.getLogger("txsync.access")


class Role(IntEnum):
    CLIENT = 1
    READER = 2
    ADMIN = 3
    SERVICE = 4


ADMIN_WRITES = {"ChangeMembership", "PauseSync", "ResumeSync", "TruncateLog"}
CLIENT_WRITES = {"Submit", "SubmitBatch", "SubmitStream", "SubmitEach"}
INTERNAL_SERVICES = {
    "txsync.v1.StoreInternalService",
    "txsync.v1.WorkerService",
    "txsync.v1.DispatchService",
}


def required(method: str) -> set[Role] | None:
    """Roles allowed to call ``/package.Service/Method``; None if not governed."""
    service, _, name = method.lstrip("/").partition("/")
    if service == "txsync.v1.ClientService":
        if name in CLIENT_WRITES:
            return {Role.CLIENT, Role.ADMIN}
        return {Role.CLIENT, Role.READER, Role.ADMIN}
    if service == "txsync.v1.AdminService":
        return {Role.ADMIN} if name in ADMIN_WRITES else {Role.READER, Role.ADMIN}
    if service == "txsync.v1.WorkerService" and name == "Query":
        return {Role.CLIENT, Role.READER, Role.ADMIN, Role.SERVICE}  # forwarded reads
    if service in INTERNAL_SERVICES:
        return {Role.SERVICE}
    return None


class AccessFileError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Caller:
    name: str
    role: Role


class AccessPolicy:
    def __init__(self, tokens: dict[bytes, Caller], identities: dict[str, Caller]) -> None:
        self._tokens = tokens
        self._identities = identities

    @classmethod
    def load(cls, path: Path) -> AccessPolicy:
        try:
            document = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise AccessFileError(f"{path}: {error}") from None
        tokens: dict[bytes, Caller] = {}
        identities: dict[str, Caller] = {}
        for kind, key in (("token", "sha256"), ("identity", "common_name")):
            for index, entry in enumerate(document.get(kind, [])):
                where = f"{path}: {kind}[{index}]"
                if not isinstance(entry, dict) or not isinstance(entry.get(key), str):
                    raise AccessFileError(f'{where}: needs {key} = "..."')
                role = str(entry.get("role", "")).upper()
                if role not in Role.__members__:
                    raise AccessFileError(f"{where}: role must be client, reader, admin or service")
                caller = Caller(str(entry.get("name", entry[key])), Role[role])
                if kind == "token":
                    try:
                        digest = bytes.fromhex(entry[key])
                    except ValueError:
                        digest = b""
                    if len(digest) != 32:
                        raise AccessFileError(f"{where}: sha256 must be 64 hex digits")
                    tokens[digest] = caller
                else:
                    identities[entry[key]] = caller
        if not tokens and not identities:
            raise AccessFileError(f"{path}: names no [[token]] and no [[identity]]")
        return cls(tokens, identities)

    def caller_of_token(self, token: str) -> Caller | None:
        digest = hashlib.sha256(token.encode()).digest()
        for known, caller in self._tokens.items():
            if hmac.compare_digest(known, digest):
                return caller
        return None

    def caller(self, context: grpc.aio.ServicerContext[Any, Any]) -> Caller | None:
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str):
                scheme, _, token = value.partition(" ")
                if scheme.lower() == "bearer" and token:
                    caller = self.caller_of_token(token)
                    if caller is not None:
                        return caller
        for name in context.auth_context().get("x509_common_name") or []:
            identified = self._identities.get(name.decode())
            if identified is not None:
                return identified
        return None


class AccessInterceptor(grpc.aio.ServerInterceptor):
    """Checks every governed call before its handler runs."""

    def __init__(
        self,
        policy: AccessPolicy,
        metrics: Metrics | None = None,
        *,
        refuse_plaintext_tokens: bool = False,
    ) -> None:
        self._policy = policy
        self._refuse_plaintext_tokens = refuse_plaintext_tokens
        self._refused = (
            metrics.counter("txsync.access.refused", "calls refused by access control")
            if metrics is not None
            else None
        )

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        allowed = required(method)
        if handler is None or allowed is None:
            return handler
        return _guarded(handler, lambda context: self._check(context, method, allowed))

    async def _check(
        self, context: grpc.aio.ServicerContext[Any, Any], method: str, allowed: set[Role]
    ) -> None:
        caller = self._policy.caller(context)
        in_clear = (
            self._refuse_plaintext_tokens
            and any(key == "authorization" for key, _ in context.invocation_metadata() or ())
            and not is_secure(context)
            and not is_loopback(context.peer())
        )
        if caller is not None and caller.role in allowed and not in_clear:
            CALLER.set(caller.name)  # the handler runs in this task: its limits' shares
            return
        if in_clear:
            code = grpc.StatusCode.UNAUTHENTICATED
            reason = (
                "a bearer token over plaintext from another machine is refused (anyone on "
                "the path could read it): call over TLS, or start the store with "
                "--allow-plaintext-tokens on a trusted network"
            )
            label = "plaintext"
        elif caller is None:
            code, reason = grpc.StatusCode.UNAUTHENTICATED, "no valid bearer token or client "
            reason += "certificate (pass --token, or set TXSYNC_TOKEN)"
            label = "unauthenticated"
        else:
            need = " or ".join(sorted(role.name.lower() for role in allowed))
            code = grpc.StatusCode.PERMISSION_DENIED
            reason = f"{caller.name} ({caller.role.name.lower()}) may not call {method}: {need}"
            label = "forbidden"
        log.warning(
            "refused %s from %s: %s", method, context.peer(), reason,
            extra=log_event("access.refused", method=method, reason=label),
        )  # fmt: skip
        if self._refused is not None:
            self._refused.add(1, {"reason": label})
        await context.abort(code, reason)


Check = Callable[[grpc.aio.ServicerContext[Any, Any]], Awaitable[None]]


def _guarded(
    handler: grpc.RpcMethodHandler[Any, Any], check: Check
) -> grpc.RpcMethodHandler[Any, Any]:
    """The same handler, running ``check`` first (it aborts the call to refuse it)."""
    options = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        unary = handler.unary_unary

        async def unary_unary(request: Any, context: Any) -> Any:
            await check(context)
            return await unary(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **options)
    if handler.unary_stream is not None:
        streaming: Any = handler.unary_stream

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            await check(context)
            async for answer in streaming(request, context):
                yield answer

        return grpc.unary_stream_rpc_method_handler(unary_stream, **options)
    if handler.stream_unary is not None:
        collecting = handler.stream_unary

        async def stream_unary(requests: Any, context: Any) -> Any:
            await check(context)
            return await collecting(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **options)
    both: Any = handler.stream_stream
    assert both is not None

    async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
        await check(context)
        async for answer in both(requests, context):
            yield answer

    return grpc.stream_stream_rpc_method_handler(stream_stream, **options)


def add_access_argument(parser: Any) -> None:
    parser.add_argument(
        "--access-file",
        type=Path,
        metavar="TOML",
        help="require a bearer token or client certificate named in this file for the "
        "client, admin and internal APIs (default: open; see docs/operations.md); the "
        "DC's services send TXSYNC_SERVICE_TOKEN, which the file must give role service",
    )


def access_interceptors(
    access_file: Path | None, metrics: Metrics | None, *, refuse_plaintext_tokens: bool = False
) -> list[grpc.aio.ServerInterceptor]:
    """The interceptors a server needs for ``--access-file`` (none without it).
    Raises AccessFileError for a file that cannot be used."""
    if access_file is None:
        return []
    policy = AccessPolicy.load(access_file)
    return [AccessInterceptor(policy, metrics, refuse_plaintext_tokens=refuse_plaintext_tokens)]


def guarded_serving(
    telemetry: ServiceTelemetry,
    metrics_listen: str | None,
    access_file: Path | None,
    *,
    refuse_plaintext_tokens: bool = False,
) -> list[grpc.aio.ServerInterceptor] | None:
    """What every service does before it serves: start its metrics endpoint and load its
    access file. The interceptors to serve with, or None (said in the log) if either
    cannot be done, and the service must exit 2."""
    try:
        telemetry.serve_metrics(metrics_listen)
    except OSError as error:
        log.critical("cannot serve metrics on %s: %s", metrics_listen, error)
        return None
    try:
        return access_interceptors(
            access_file, telemetry.metrics, refuse_plaintext_tokens=refuse_plaintext_tokens
        )
    except AccessFileError as error:
        log.critical("%s", error)
        return None


def forwarded_credentials(
    context: grpc.aio.ServicerContext[Any, Any],
) -> tuple[tuple[str, str], ...]:
    """The caller's bearer token, to pass on when a call is forwarded to another service
    (the DC's front door asks the coordinator, the dispatch and other DCs for the caller)."""
    return tuple(
        (key, value)
        for key, value in context.invocation_metadata() or ()
        if key == "authorization" and isinstance(value, str)
    )
