"""``Client``: the library for code that does not run an event loop.

What it does (failover, retries, idempotency) is ``core.Core``, the same as
``AsyncClient``'s; its transport makes synchronous gRPC calls in the caller's own thread
(``core.run``), so a call costs no thread hop. Submits from many threads at once meet in
a ``ThreadBatcher``: whoever finds a call free makes it, carrying what the others queued.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Any, Literal, TypeVar, overload

import grpc
from google.protobuf.message import Message

from txsync.client.batching import BATCH_MAX_DEFAULT, IN_FLIGHT_MAX_DEFAULT, ThreadBatcher
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
    run,
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
from txsync.client.submit_each import NotServed, SubmitEachStream
from txsync.v1 import admin_pb2_grpc, client_pb2, client_pb2_grpc

_T = TypeVar("_T")


class Client:
    """A blocking client for the whole cluster; safe to share between threads. Takes
    ``AsyncClient``'s arguments (but ``linger_ms``). Use as ``with Client(...) as
    client:``, or ``close()``.

    >>> with Client("data/cluster.json") as client:  # doctest: +SKIP
    ...     done = client.submit("INSERT INTO t VALUES (?, ?)", 1, "one", wait="ok")
    ...     client.query("SELECT * FROM t", after=done).rows
    ((1, 'one'),)
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
        idempotent: bool = True,
        submit_stream: bool = True,
    ) -> None:
        tls = tls if tls is not None else Tls.from_environment()
        self.endpoints: builtins.list[Endpoint] = located(endpoints, dc, tls)
        self._transport = SyncTransport(
            self.endpoints, token_metadata(token), tls, submit_stream=submit_stream,
            batching={"batch_max": batch_max, "in_flight_max": in_flight_max,
                      "grace_s": attempt_s},
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
        """Submit calls made through the batching so far."""
        batched = sum(b.calls for b in self._transport.batchers.values())
        return batched + self._core.batch_calls

    @property
    def seen_position(self) -> int:
        """The furthest place in the agreed order this client has seen in an answer: its
        reads see at least there (session consistency). Another client, or another
        process, continues the session with ``query(..., after_position=this)``."""
        return self._core.seen_position

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._transport.close()

    def submit(
        self,
        sql: str | Sequence[Statement],
        *params: SqlValue,
        key: str | None = None,
        wait: Wait = "accepted",
        timeout: float | None = None,
        label: str = "",
    ) -> Submitted:
        """As ``AsyncClient.submit``."""
        body = body_of(statements_of(sql, params), label)
        return run(self._core.submit(body, key, wait, timeout))

    @overload
    def submit_many(
        self, transactions: Iterable[Submittable], *, keys: Sequence[str] | None = None,
        wait: Wait = "accepted", timeout: float | None = None, raise_errors: Literal[True] = True,
    ) -> builtins.list[Submitted]: ...  # fmt: skip

    @overload
    def submit_many(
        self, transactions: Iterable[Submittable], *, keys: Sequence[str] | None = None,
        wait: Wait = "accepted", timeout: float | None = None, raise_errors: bool,
    ) -> builtins.list[Submitted | TxSyncError]: ...  # fmt: skip

    def submit_many(
        self, transactions: Iterable[Submittable], *, keys: Sequence[str] | None = None,
        wait: Wait = "accepted", timeout: float | None = None, raise_errors: bool = True,
    ) -> builtins.list[Any]:  # fmt: skip
        """As ``AsyncClient.submit_many``."""
        bodies = bodies_of(builtins.list(transactions))
        results = run(self._core.submit_many(bodies, keys, wait, timeout))
        return raising_failed(results) if raise_errors else results

    def get(
        self, tx_id: str = "", *, key: str = "", body: bool = False, timeout: float | None = None
    ) -> TxInfo:
        """As ``AsyncClient.get``."""
        return run(self._core.get(tx_id, key, body, timeout))

    def wait(
        self, tx_id: str, state: str | State = "ok", *, timeout: float | None = None
    ) -> Reached:
        """As ``AsyncClient.wait``."""
        return run(self._core.wait(tx_id, state, timeout))

    def list(self, state: str | State | None = None, *, page_size: int = 1_000) -> Iterator[TxInfo]:
        """As ``AsyncClient.list``: every transaction, a page fetched as it is needed."""
        token = ""
        while True:
            page, token = self.list_page(state, token, page_size=page_size)
            yield from page
            if not token:
                return

    def list_page(
        self, state: str | State | None = None, page_token: str = "", *, page_size: int = 1_000
    ) -> tuple[builtins.list[TxInfo], str]:
        """As ``AsyncClient.list_page``."""
        return run(self._core.list_page(state, page_token, page_size))

    def query(
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
        """As ``AsyncClient.query``."""
        return run(
            self._core.query(
                sql, params, after=after, after_position=after_position, max_rows=max_rows,
                timeout=timeout, worker=worker, session=session,
            )
        )  # fmt: skip


class SyncTransport:
    """``core.Transport`` whose coroutines block and never suspend (``core.run``): a
    channel and a ``ThreadBatcher`` per DC."""

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
        ThreadBatcher(_never, _never, **batching)  # checks the settings now
        self.channels: dict[int, grpc.Channel] = {}
        self.stubs: dict[tuple[int, str], Any] = {}
        self.batchers: dict[int, ThreadBatcher] = {}
        self.submit_streams: dict[int, SubmitEachStream] = {}
        # Callers' threads and streams' reader threads may reach a DC for the first time
        # at once: one of them makes its channel, stub, batcher and stream, so none is
        # made twice and left unclosed.
        self._making = threading.Lock()

    async def submit(
        self, index: int, request: client_pb2.SubmitRequest
    ) -> client_pb2.SubmitResponse:
        batcher = self.batchers.get(index)
        if batcher is None:
            batcher = self._batcher(index)
        return batcher.submit(request)

    def _batcher(self, index: int) -> ThreadBatcher:
        with self._making:
            if (made := self.batchers.get(index)) is not None:
                return made
            stream = None
            if self.submit_stream:
                stream = self.submit_streams[index] = SubmitEachStream(
                    functools.partial(self.open_submit_each, index)
                )

            def send_one(
                request: client_pb2.SubmitRequest, timeout: float
            ) -> client_pb2.SubmitResponse:
                if stream is not None:
                    with contextlib.suppress(NotServed):
                        return stream.submit(request, timeout)
                answer: client_pb2.SubmitResponse = self.call_now(
                    index, "client", "Submit", request, timeout
                )
                return answer

            def send_many(
                request: client_pb2.SubmitBatchRequest, timeout: float
            ) -> client_pb2.SubmitBatchResponse:
                answer: client_pb2.SubmitBatchResponse = self.call_now(
                    index, "client", "SubmitBatch", request, timeout
                )
                return answer

            batcher = self.batchers[index] = ThreadBatcher(send_one, send_many, **self.batching)
            return batcher

    async def call(
        self, index: int, service: str, method: str, request: Message, timeout: float
    ) -> Any:
        return self.call_now(index, service, method, request, timeout)

    def open_submit_each(
        self, index: int, requests: Iterator[client_pb2.SubmitEachRequest]
    ) -> Generator[client_pb2.SubmitEachResponse]:
        """A ``SubmitEach`` call to the DC at ``index``, its errors as ``Refused``."""
        answers = self._stub(index, "client").SubmitEach(requests, metadata=self.metadata)
        try:
            yield from answers
        except grpc.RpcError as error:
            if not isinstance(error, grpc.Call):
                raise
            raise refused_by(error) from None
        finally:
            answers.cancel()

    def call_now(
        self, index: int, service: str, method: str, request: Message, timeout: float
    ) -> Any:
        stub = self._stub(index, service)
        try:
            return getattr(stub, method)(request, timeout=timeout, metadata=self.metadata)
        except grpc.RpcError as error:
            if not isinstance(error, grpc.Call):
                raise
            raise refused_by(error) from None

    def _stub(self, index: int, service: str) -> Any:
        stub = self.stubs.get((index, service))
        if stub is not None:
            return stub
        with self._making:
            if (stub := self.stubs.get((index, service))) is not None:
                return stub
            channel = self.channels.get(index)
            if channel is None:
                endpoint = self.endpoints[index % len(self.endpoints)]
                options = channel_options(endpoint, self.tls)
                channel = self.channels[index] = (
                    grpc.insecure_channel(endpoint.address, options=options)
                    if self.tls is None
                    else grpc.secure_channel(
                        endpoint.address, self.tls.credentials(), options=options
                    )
                )
            kind = client_pb2_grpc.ClientServiceStub if service == "client" else None
            stub = self.stubs[(index, service)] = (
                kind(channel) if kind else admin_pb2_grpc.AdminServiceStub(channel)
            )
            return stub

    async def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    async def blocking(self, work: Callable[[], _T]) -> _T:
        return work()

    async def reconnect(self) -> None:
        self.close()

    def close(self) -> None:
        with self._making:
            channels, self.channels = builtins.list(self.channels.values()), {}
            self.stubs.clear()
            self.batchers.clear()
            streams, self.submit_streams = builtins.list(self.submit_streams.values()), {}
        # Outside the lock: a stream's reader thread may be waiting for it to open a call.
        for stream in streams:
            stream.close()
        for channel in channels:
            channel.close()


def _never(request: Message, timeout: float) -> Any:
    raise AssertionError("a batcher made only to check its settings")
