"""``AsyncClient``: the client library on asyncio. What it does (failover, retries,
idempotency) is ``core.Core``; this is its face and its transport on grpc.aio."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from typing import Any, Literal, TypeVar, overload

import grpc
from google.protobuf.message import Message

from txsync.client.batching import BATCH_MAX_DEFAULT, IN_FLIGHT_MAX_DEFAULT, SubmitBatcher
from txsync.client.connection import (
    Tls,
    channel_options,
    located,
    token_metadata,
)
from txsync.client.core import (
    ATTEMPT_S_DEFAULT,
    TIMEOUT_S_DEFAULT,
    Core,
    Reached,
    Submittable,
    Wait,
    bodies_of,
    raising_failed,
    refused_by,
    statements_of,
)
from txsync.client.endpoints import Endpoint
from txsync.client.errors import TxSyncError
from txsync.client.results import (
    QueryResult,
    SqlValue,
    State,
    Statement,
    Submitted,
    TxInfo,
    body_of,
)
from txsync.client.submit_each import AioSubmitEachStream, NotServed
from txsync.v1 import admin_pb2_grpc, client_pb2, client_pb2_grpc

_T = TypeVar("_T")


class AsyncClient:
    """A client for the whole cluster, on asyncio. Use as ``async with``, or ``await
    close()``; its calls belong to the event loop that made its first one.

    ``endpoints``: a cluster.json, ``HOST:PORT[,...]``, a DNS name, or a list of those
    (default ``$TXSYNC_ENDPOINTS``, else ``data/cluster.json``); ``dc`` picks the DC to
    prefer. ``token`` (default ``$TXSYNC_TOKEN``) is sent as a bearer token; ``tls``
    turns TLS on (default: from ``$TXSYNC_TLS_CA`` and its siblings, as the CLI reads
    them: ``Tls.from_environment``). ``timeout`` is every call's default deadline
    (failovers included); ``attempt_s`` how long one DC is given
    (``core.ATTEMPT_S_DEFAULT``). Batching:
    ``batch_max`` submits per call, ``in_flight_max`` calls at once per DC, ``linger_ms``
    of waiting for company (0: none, so a lone caller is never delayed). A submit that
    travels alone is a message on one ``SubmitEach`` stream per DC, shared by every
    caller (``client/submit_each.py``); ``submit_stream=False`` sends it as a unary
    ``Submit`` call instead, as against a DC that has no such stream.

    ``idempotent=False`` sends a submit without a key (unless one is given) and never
    sends it again: an error is raised as the first DC gave it, and a submit whose answer
    was lost may or may not have been taken. For callers that retry themselves, and for
    measuring the cluster without keys (the benchmark, beside systems that have none).
    """

    def __init__(
        self,
        endpoints: str | Sequence[str] | None = None,
        *,
        dc: str | None = None,
        token: str | None = None,
        tls: Tls | None = None,
        timeout: float = TIMEOUT_S_DEFAULT,
        attempt_s: float = ATTEMPT_S_DEFAULT,
        batch_max: int = BATCH_MAX_DEFAULT,
        in_flight_max: int = IN_FLIGHT_MAX_DEFAULT,
        linger_ms: float = 0.0,
        idempotent: bool = True,
        submit_stream: bool = True,
    ) -> None:
        tls = tls if tls is not None else Tls.from_environment()
        self.endpoints: list[Endpoint] = located(endpoints, dc, tls)
        self._transport = AioTransport(
            self.endpoints, token_metadata(token), tls, submit_stream=submit_stream,
            batching={"batch_max": batch_max, "in_flight_max": in_flight_max,
                      "linger_s": linger_ms / 1000, "grace_s": attempt_s},
        )  # fmt: skip
        self._core = Core(
            self.endpoints, self._transport, timeout=timeout, attempt_s=attempt_s,
            idempotent=idempotent, batch_max=batch_max,
            locate=lambda: located(endpoints, dc, tls),
        )  # fmt: skip

    @property
    def current(self) -> Endpoint:
        """The DC in use: the one that answered last."""
        return self.endpoints[self._core.current]

    @property
    def calls(self) -> int:
        """Submit calls made through the batching so far (submits per call is what it
        buys)."""
        batched = sum(b.calls for b in self._transport.batchers.values())
        return batched + self._core.batch_calls

    @property
    def seen_position(self) -> int:
        """The furthest place in the agreed order this client has seen in an answer: its
        reads see at least there (session consistency). Another client, or another
        process, continues the session with ``query(..., after_position=this)``."""
        return self._core.seen_position

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._transport.close()

    async def submit(
        self,
        sql: str | Sequence[Statement],
        *params: SqlValue,
        key: str | None = None,
        wait: Wait = "accepted",
        timeout: float | None = None,
        label: str = "",
    ) -> Submitted:
        """Submit one transaction: one statement (``sql`` with ``?`` placeholders filled
        from ``params``), or several (a sequence of ``Statement``), applied atomically.

        Answers once the transaction reached ``wait`` at the DC that took it: None once
        it is durable there (INCOMING), ``"accepted"`` once its place in the agreed order
        is fixed, ``"ok"`` once applied (raises ``TransactionFailed`` if the database
        refused it). ``key`` makes retries safe across DCs (one is generated if not
        given). Raises ``Timeout``, ``Unavailable``, ``Backpressure``, ``InvalidRequest``,
        ``KeyConflict``, ``AccessDenied``."""
        body = body_of(statements_of(sql, params), label)
        return await self._core.submit(body, key, wait, timeout)

    @overload
    async def submit_many(
        self, transactions: Iterable[Submittable], *, keys: Sequence[str] | None = None,
        wait: Wait = "accepted", timeout: float | None = None, raise_errors: Literal[True] = True,
    ) -> builtins.list[Submitted]: ...  # fmt: skip

    @overload
    async def submit_many(
        self, transactions: Iterable[Submittable], *, keys: Sequence[str] | None = None,
        wait: Wait = "accepted", timeout: float | None = None, raise_errors: bool,
    ) -> builtins.list[Submitted | TxSyncError]: ...  # fmt: skip

    async def submit_many(
        self,
        transactions: Iterable[Submittable],
        *,
        keys: Sequence[str] | None = None,
        wait: Wait = "accepted",
        timeout: float | None = None,
        raise_errors: bool = True,
    ) -> builtins.list[Any]:
        """Submit each of ``transactions`` (SQL text, (SQL, params), or statements) in one
        ``SubmitBatch`` call per ``batch_max``; ``keys``: one per transaction (default: a
        new one each). Each is answered on its own (one the call did not settle goes on
        alone, as ``submit`` would). Once all are answered, any error raises
        ``BatchFailed``, which holds every transaction's answer and key, so that the
        whole batch can be retried with ``keys=error.keys`` without running any twice; or
        (``raise_errors=False``) every error is returned in its transaction's place,
        carrying its key."""
        results = await self._core.submit_many(bodies_of(list(transactions)), keys, wait, timeout)
        return raising_failed(results) if raise_errors else results

    async def get(
        self, tx_id: str = "", *, key: str = "", body: bool = False, timeout: float | None = None
    ) -> TxInfo:
        """The transaction ``tx_id`` (or the one submitted with idempotency ``key``) as
        the DC in use holds it, asking the others if it has not heard of it (a key is
        known at the DC that took the submit); ``body`` adds its statements. Raises
        ``NotFound``."""
        return await self._core.get(tx_id, key, body, timeout)

    async def wait(
        self, tx_id: str, state: str | State = "ok", *, timeout: float | None = None
    ) -> Reached:
        """Wait until ``tx_id`` reaches ``state`` (or a later one) at the DC in use.
        Raises ``Timeout`` if it does not in time, ``TransactionFailed`` if it FAILED
        while ``state`` is OK."""
        return await self._core.wait(tx_id, state, timeout)

    async def list(
        self, state: str | State | None = None, *, page_size: int = 1_000
    ) -> AsyncIterator[TxInfo]:
        """Every transaction the DC in use knows (in one state, if given), in the order
        it learned of them, fetched a page at a time."""
        token = ""
        while True:
            page, token = await self.list_page(state, token, page_size=page_size)
            for info in page:
                yield info
            if not token:
                return

    async def list_page(
        self, state: str | State | None = None, page_token: str = "", *, page_size: int = 1_000
    ) -> tuple[builtins.list[TxInfo], str]:
        """One page of ``list`` and the token of the next ('' after the last)."""
        return await self._core.list_page(state, page_token, page_size)

    async def query(
        self,
        sql: str,
        *params: SqlValue,
        after: str | Submitted | None = None,
        after_position: int = 0,
        max_rows: int = 1_000,
        timeout: float | None = None,
        worker: str = "",
        session: bool = True,
    ) -> QueryResult:
        """A read-only statement on the DC's most advanced healthy worker (or the one
        ``worker`` names, healthy or not). It never reads older than what this client
        has seen (``session``, the default): the worker waits until it has applied the
        furthest place in the order this client saw in any answer, and its newest submit
        answered before it was ordered, at whichever DC it runs. ``after`` (a
        transaction, or its id) and ``after_position`` ask for more: until that
        transaction, submitted anywhere, is applied. ``session=False`` reads what the
        worker has now, which may be older. ``timeout`` (default: the client's) bounds
        the whole read, the worker's wait included."""
        return await self._core.query(
            sql, params, after=after, after_position=after_position, max_rows=max_rows,
            timeout=timeout, worker=worker, session=session,
        )  # fmt: skip


class AioTransport:
    """``core.Transport`` on grpc.aio: a channel and a ``SubmitBatcher`` per DC."""

    def __init__(
        self,
        endpoints: builtins.list[Endpoint],
        metadata: tuple[tuple[str, str], ...],
        tls: Tls | None,
        batching: dict[str, Any],
        *,
        submit_stream: bool = True,
    ) -> None:
        self.endpoints, self.metadata, self.tls, self.batching = endpoints, metadata, tls, batching
        self.submit_stream = submit_stream
        SubmitBatcher(_never, _never, **batching)  # checks the settings now
        self.channels: dict[int, grpc.aio.Channel] = {}
        self.stubs: dict[tuple[int, str], Any] = {}
        self.batchers: dict[int, SubmitBatcher] = {}
        self.submit_streams: dict[int, AioSubmitEachStream] = {}

    async def submit(
        self, index: int, request: client_pb2.SubmitRequest
    ) -> client_pb2.SubmitResponse:
        batcher = self.batchers.get(index)
        if batcher is None:
            stream = None
            if self.submit_stream:
                stream = self.submit_streams[index] = AioSubmitEachStream(
                    functools.partial(self.open_submit_each, index)
                )

            async def send_one(
                request: client_pb2.SubmitRequest, timeout: float
            ) -> client_pb2.SubmitResponse:
                if stream is not None:
                    with contextlib.suppress(NotServed):
                        return await stream.submit(request, timeout)
                answer: client_pb2.SubmitResponse = await self.call(
                    index, "client", "Submit", request, timeout
                )
                return answer

            async def send_many(
                request: client_pb2.SubmitBatchRequest, timeout: float
            ) -> client_pb2.SubmitBatchResponse:
                answer: client_pb2.SubmitBatchResponse = await self.call(
                    index, "client", "SubmitBatch", request, timeout
                )
                return answer

            batcher = self.batchers[index] = SubmitBatcher(send_one, send_many, **self.batching)
        return await batcher.submit(request)

    async def open_submit_each(
        self, index: int, requests: AsyncIterator[client_pb2.SubmitEachRequest]
    ) -> AsyncGenerator[client_pb2.SubmitEachResponse]:
        """A ``SubmitEach`` call to the DC at ``index``, its errors as ``Refused``."""
        call = self._stub(index, "client").SubmitEach(requests, metadata=self.metadata)
        try:
            async for answer in call:
                yield answer
        except grpc.aio.AioRpcError as error:
            raise refused_by(error) from None
        finally:
            call.cancel()

    async def call(
        self, index: int, service: str, method: str, request: Message, timeout: float
    ) -> Any:
        stub = self._stub(index, service)
        try:
            return await getattr(stub, method)(request, timeout=timeout, metadata=self.metadata)
        except grpc.aio.AioRpcError as error:
            raise refused_by(error) from None

    def _stub(self, index: int, service: str) -> Any:
        channel = self.channels.get(index)
        if channel is None:
            endpoint = self.endpoints[index]
            options = channel_options(endpoint, self.tls)
            channel = self.channels[index] = (
                grpc.aio.insecure_channel(endpoint.address, options=options)
                if self.tls is None
                else grpc.aio.secure_channel(
                    endpoint.address, self.tls.credentials(), options=options
                )
            )
        stub = self.stubs.get((index, service))
        if stub is None:
            stub = self.stubs[(index, service)] = (
                client_pb2_grpc.ClientServiceStub(channel)
                if service == "client"
                else admin_pb2_grpc.AdminServiceStub(channel)
            )
        return stub

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def blocking(self, work: Callable[[], _T]) -> _T:
        return await asyncio.to_thread(work)

    async def reconnect(self) -> None:
        await self.close()

    async def close(self) -> None:
        channels, self.channels = builtins.list(self.channels.values()), {}
        self.stubs.clear()
        self.batchers.clear()
        streams, self.submit_streams = builtins.list(self.submit_streams.values()), {}
        for stream in streams:
            await stream.close()
        for channel in channels:
            await channel.close()


async def _never(request: Message, timeout: float) -> Any:
    raise AssertionError("a batcher made only to check its settings")
