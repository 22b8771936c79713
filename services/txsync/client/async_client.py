"""``AsyncClient``: the client library on asyncio (``Client`` is the blocking face of it).

Failover. The client talks to one DC at a time, the preferred one first. When that DC
does not answer (UNAVAILABLE, a deadline, a restart), refuses in a way another DC may
not (FAILED_PRECONDITION, ...), or holds a submit ``attempt_s`` without ordering it while
reporting that it is cut off from a majority, the client moves to the next DC and sends
the same submit again with the same idempotency key, backing off between rounds of all
DCs, until the call's ``timeout``. It then stays with the DC that answered.

Idempotency. Every submit carries a key (a random one unless given). A retry at the same
DC is answered from the first submit; one at another DC is ordered too but runs nothing:
the first transaction with a key in the agreed order is the one that counts, at every DC,
and a later one answers with its id and outcome (docs/client.md, "Idempotency").
"""

from __future__ import annotations

import asyncio
import builtins
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import grpc
from google.protobuf import duration_pb2
from google.protobuf.message import Message

from txsync.client.batching import (
    BATCH_MAX_DEFAULT,
    IN_FLIGHT_MAX_DEFAULT,
    Refused,
    SubmitBatcher,
)
from txsync.client.endpoints import Endpoint, resolve
from txsync.client.errors import (
    RETRIED_ELSEWHERE,
    Backpressure,
    NotFound,
    Timeout,
    TransactionFailed,
    TxSyncError,
    Unavailable,
    from_status,
)
from txsync.client.results import (
    QueryResult,
    SqlValue,
    State,
    Statement,
    Submitted,
    TxInfo,
    body_of,
    outcome_of,
    query_result_of,
    state_of,
    tx_info_of,
    value_to_proto,
)
from txsync.v1 import admin_pb2, admin_pb2_grpc, client_pb2, client_pb2_grpc, common_pb2

TIMEOUT_S_DEFAULT = 30.0
"""A call's whole deadline, failovers included."""
TIMEOUT_S_MOST = 600.0
"""What a DC waits for at most in one call."""
ATTEMPT_S_DEFAULT = 5.0
"""How long a submit waits at one DC before the client asks whether that DC can still
order anything (and moves on if it cannot), and how long a DC may take to answer beyond
what it was asked to wait for before the client takes it for down."""
BACKOFF_FIRST_S = 0.05
BACKOFF_MOST_S = 2.0
MESSAGE_BYTES_MAX = 8 * 1024 * 1024
TOKEN_ENV = "TXSYNC_TOKEN"

Submittable = str | Sequence[Statement] | tuple[str, Sequence[SqlValue]]
"""One transaction for ``submit_many``: SQL text, (SQL, parameters), or statements."""
Wait = str | State | None


@dataclass(frozen=True, slots=True)
class Tls:
    """TLS to the DCs' stores: the CA that signed their certificates, and optionally a
    certificate of the caller's own (PEM, as bytes or a path)."""

    ca: bytes | Path
    cert: bytes | Path | None = None
    key: bytes | Path | None = None
    server_name: str | None = None
    """The name the stores' certificates carry, when it is not their address's host (the
    chart's certificates name the DC: ``dc1``)."""

    def credentials(self) -> grpc.ChannelCredentials:
        def pem(value: bytes | Path | None) -> bytes | None:
            return value.read_bytes() if isinstance(value, Path) else value

        if (self.cert is None) != (self.key is None):
            raise ValueError("give both a client certificate and its key, or neither")
        return grpc.ssl_channel_credentials(
            root_certificates=pem(self.ca), private_key=pem(self.key),
            certificate_chain=pem(self.cert),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Reached:
    """Where a transaction got to (``wait``)."""

    tx_id: str
    state: State
    outcome: common_pb2.Outcome | None


class AsyncClient:
    """A client for the whole cluster (module docstring). Use as ``async with``, or
    ``await close()``.

    ``endpoints``: a cluster.json, ``HOST:PORT[,...]``, a DNS name, or a list of those
    (default ``$TXSYNC_ENDPOINTS``, else ``data/cluster.json``); ``dc`` picks the DC to
    prefer. ``token`` (default ``$TXSYNC_TOKEN``) is sent as a bearer token; ``tls``
    turns TLS on. ``timeout`` is every call's default deadline. Batching: ``batch_max``
    submits per call, ``in_flight_max`` calls at once per DC, ``linger_ms`` of waiting
    for company (0: none, so a lone caller is never delayed).
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
    ) -> None:
        self.endpoints: list[Endpoint] = resolve(endpoints, dc)
        token = os.environ.get(TOKEN_ENV, "") if token is None else token
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._tls = tls
        self.timeout = _checked_timeout(timeout)
        self.attempt_s = attempt_s
        self._batching = (batch_max, in_flight_max, linger_ms / 1000)
        SubmitBatcher(_never, _never, batch_max=batch_max, in_flight_max=in_flight_max,
                      linger_s=linger_ms / 1000)  # fmt: skip  # checks the settings now
        self._channels: dict[int, grpc.aio.Channel] = {}
        self._batchers: dict[int, SubmitBatcher] = {}
        self.current = 0
        """Index in ``endpoints`` of the DC in use."""

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        self._batchers.clear()
        for channel in channels:
            await channel.close()

    # -- writing ------------------------------------------------------------------------

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
        statements = _statements(sql, params)
        return await self._submit(body_of(statements, label), key, wait, timeout)

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
        """Submit each of ``transactions`` (SQL text, (SQL, params), or statements),
        concurrently: they travel in as few calls as the batching allows. ``keys``: one
        per transaction (default: a new one each). Each is answered on its own; the
        first error is raised once all are answered, or (``raise_errors=False``) every
        error is returned in its transaction's place."""
        bodies = [body_of(_submittable(t)) for t in transactions]
        if keys is not None and len(keys) != len(bodies):
            raise ValueError(f"{len(keys)} keys for {len(bodies)} transactions")
        answers = await asyncio.gather(
            *(
                self._submit(body, keys[n] if keys is not None else None, wait, timeout)
                for n, body in enumerate(bodies)
            ),
            return_exceptions=True,
        )
        results: builtins.list[Submitted | TxSyncError] = []
        for answer in answers:
            if isinstance(answer, TxSyncError) and not raise_errors:
                results.append(answer)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                results.append(answer)
        return results

    async def _submit(
        self, body: common_pb2.TxBody, key: str | None, wait: Wait, timeout: float | None
    ) -> Submitted:
        wanted = None if wait is None else State.named(wait)
        key = key or str(uuid.uuid4())
        deadline = time.monotonic() + _checked_timeout(self.timeout if timeout is None else timeout)
        request = client_pb2.SubmitRequest(body=body, idempotency_key=key)
        if wanted is not None:
            request.wait_for = common_pb2.TxState.ValueType(wanted.value)
        last: Exception | None = None
        async for index in self._failover_order(deadline):
            endpoint = self.endpoints[index]
            attempt = min(self.attempt_s, deadline - time.monotonic())
            if wanted is not None:
                request.wait_timeout.CopyFrom(_duration(max(attempt, 0.001)))
            try:
                answer = await self._batcher(index).submit(request)
            except Refused as refused:
                last = self._refusal(refused)
                if isinstance(last, Backpressure):
                    await _sleep_until(deadline, max(last.retry_after_s, BACKOFF_FIRST_S))
                continue
            self.current = index
            if wanted is None or answer.reached:
                return _submitted(answer, endpoint, key)
            reached = await self._wait_while_ordering(index, answer.tx_id, wanted, deadline)
            if reached is not None:
                answer.state = common_pb2.TxState.ValueType(reached.state.value)
                if reached.outcome is not None:
                    answer.outcome.CopyFrom(reached.outcome)
                return _submitted(answer, endpoint, key)
            last = Timeout(
                f"{endpoint} did not order transaction {answer.tx_id} in time", answer.tx_id,
                State(answer.state).name,
            )  # fmt: skip
        raise _exhausted(last, "submit")

    async def _wait_while_ordering(
        self, index: int, tx_id: str, wanted: State, deadline: float
    ) -> Reached | None:
        """Wait at DC ``index`` for ``tx_id`` to reach ``wanted`` while that DC can order
        (a majority); None when it cannot, or does not answer, or the deadline passed."""
        while (left := deadline - time.monotonic()) > 0:
            if not await self._orders(index, left):
                return None
            try:
                answer = await self._wait_once(index, tx_id, wanted, min(self.attempt_s, left))
            except Refused:
                return None
            if answer.reached:
                return Reached(tx_id, State(answer.state), _outcome_or_none(answer))
        return None

    async def _orders(self, index: int, left: float) -> bool:
        """Whether DC ``index`` says it is in a view with a majority (or cannot say: a
        caller whose role may not read the status keeps waiting there)."""
        stub = admin_pb2_grpc.AdminServiceStub(self._channel(index))
        try:
            status = await stub.GetStatus(
                admin_pb2.GetStatusRequest(), timeout=min(left, 5.0), metadata=self._metadata
            )
        except grpc.aio.AioRpcError as error:
            return error.code() == grpc.StatusCode.PERMISSION_DENIED
        return bool(status.local.quorum != admin_pb2.QUORUM_STATE_MINORITY)

    # -- reading ------------------------------------------------------------------------

    async def get(
        self, tx_id: str = "", *, key: str = "", body: bool = False, timeout: float | None = None
    ) -> TxInfo:
        """The transaction ``tx_id`` (or the one submitted with idempotency ``key``) as
        the DC in use holds it, asking the others if it has not heard of it (a key is
        known at the DC that took the submit); ``body`` adds its statements. Raises
        ``NotFound``."""
        if not tx_id and not key:
            raise ValueError("give a transaction id or an idempotency key")
        request = client_pb2.GetRequest(tx_id=tx_id, idempotency_key=key, include_body=body)
        answer: client_pb2.GetResponse = await self._call(
            "Get", request, timeout, others_on_not_found=True
        )
        return tx_info_of(answer)

    async def wait(
        self, tx_id: str, state: str | State = "ok", *, timeout: float | None = None
    ) -> Reached:
        """Wait until ``tx_id`` reaches ``state`` (or a later one) at the DC in use.
        Raises ``Timeout`` if it does not in time, ``TransactionFailed`` if it FAILED
        while ``state`` is OK."""
        wanted = State.named(state)
        deadline = time.monotonic() + _checked_timeout(self.timeout if timeout is None else timeout)
        last: Exception | None = None
        async for index in self._failover_order(deadline):
            try:
                answer = await self._wait_once(index, tx_id, wanted, deadline - time.monotonic())
            except Refused as refused:
                last = self._refusal(refused)
                continue
            self.current = index
            if not answer.reached:
                raise Timeout(
                    f"transaction {tx_id} is {_name(answer.state)}, not {wanted.name}, after the "
                    "timeout", tx_id, _name(answer.state),
                )  # fmt: skip
            outcome = _outcome_or_none(answer)
            if wanted is State.OK and answer.state == common_pb2.TX_STATE_FAILED:
                raise TransactionFailed(tx_id, outcome_of(answer.outcome))
            return Reached(outcome.duplicate_of if outcome and outcome.duplicate_of else tx_id,
                           State(answer.state), outcome)  # fmt: skip
        raise _exhausted(last, "wait")

    async def _wait_once(
        self, index: int, tx_id: str, wanted: State, seconds: float
    ) -> client_pb2.WaitResponse:
        stub = client_pb2_grpc.ClientServiceStub(self._channel(index))
        request = client_pb2.WaitRequest(
            tx_id=tx_id, state=common_pb2.TxState.ValueType(wanted.value),
            timeout=_duration(max(seconds, 0.001)),
        )  # fmt: skip
        try:
            answer: client_pb2.WaitResponse = await stub.Wait(
                request, timeout=seconds + self.attempt_s, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as error:
            raise _refused(error) from None
        return answer

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
        request = client_pb2.ListRequest(
            state=common_pb2.TxState.ValueType(State.named(state).value if state else 0),
            page_size=page_size, page_token=page_token,
        )  # fmt: skip
        # A page token is one DC's: only the first page may go elsewhere.
        answer: client_pb2.ListResponse = await self._call(
            "List", request, None, failover=not page_token
        )
        return [tx_info_of(t) for t in answer.transactions], answer.next_page_token

    async def query(
        self,
        sql: str,
        *params: SqlValue,
        after: str | Submitted | None = None,
        after_position: int = 0,
        max_rows: int = 1_000,
        timeout: float = 10.0,
        worker: str = "",
    ) -> QueryResult:
        """A read-only statement on the DC's most advanced healthy worker (or the one
        ``worker`` names, healthy or not). ``after`` (a transaction, or its id) reads
        your writes: the worker waits until it has applied that transaction (up to
        ``timeout``), wherever it was submitted."""
        request = client_pb2.QueryRequest(
            statement=common_pb2.Statement(sql=sql, params=[value_to_proto(p) for p in params]),
            after_tx_id=after.tx_id if isinstance(after, Submitted) else (after or ""),
            after_position=after_position, max_rows=max_rows, timeout=_duration(timeout),
            worker_id=worker,
        )  # fmt: skip
        answer: client_pb2.QueryResponse = await self._call(
            "Query", request, timeout + self.attempt_s, attempt_s=timeout + self.attempt_s
        )
        return query_result_of(answer)

    # -- plumbing -----------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        request: Message,
        timeout: float | None,
        *,
        failover: bool = True,
        others_on_not_found: bool = False,
        attempt_s: float | None = None,
    ) -> Any:
        """``ClientService.<method>`` at the DC in use, then at the next ones while they
        do not answer (and, ``others_on_not_found``, while they have not heard of it)."""
        deadline = time.monotonic() + _checked_timeout(self.timeout if timeout is None else timeout)
        last: Exception | None = None
        order = self._failover_order(deadline) if failover else _once(self.current)
        tried: set[int] = set()
        async for index in order:
            if isinstance(last, NotFound) and index in tried:
                raise last  # every DC was asked
            tried.add(index)
            call = getattr(client_pb2_grpc.ClientServiceStub(self._channel(index)), method)
            left = max(min(deadline - time.monotonic(), attempt_s or self.attempt_s), 0.001)
            try:
                answer = await call(request, timeout=left, metadata=self._metadata)
            except grpc.aio.AioRpcError as error:
                last = self._refusal(_refused(error))
                if isinstance(last, NotFound) and not others_on_not_found:
                    raise last from None
                if isinstance(last, Backpressure):
                    await _sleep_until(deadline, last.retry_after_s)
                continue
            self.current = index
            return answer
        raise _exhausted(last, method)

    def _refusal(self, refused: Refused) -> Exception:
        """The error ``refused`` stands for; raises it at once unless another DC (or a
        later try) may answer otherwise."""
        error = from_status(refused.code, refused.details, refused.retry_after_s)
        retried = refused.code in RETRIED_ELSEWHERE or isinstance(error, Backpressure | NotFound)
        if not retried:
            raise error
        return error

    async def _failover_order(self, deadline: float) -> AsyncIterator[int]:
        """DC indexes to try until ``deadline``: the one in use, then the others in turn,
        with a growing, jittered pause after each round of all of them."""
        count, start, rounds = len(self.endpoints), self.current, 0
        while True:
            for step in range(count):
                if time.monotonic() >= deadline:
                    return
                yield (start + step) % count
            pause = min(BACKOFF_FIRST_S * 2**rounds, BACKOFF_MOST_S) * random.uniform(0.5, 1)
            rounds += 1
            await _sleep_until(deadline, pause)

    def _channel(self, index: int) -> grpc.aio.Channel:
        channel = self._channels.get(index)
        if channel is None:
            endpoint = self.endpoints[index]
            options: list[tuple[str, int | str]] = [
                ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
                ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
            ]
            if self._tls is None:
                channel = grpc.aio.insecure_channel(endpoint.address, options=options)
            else:
                name = self._tls.server_name or endpoint.server_name
                if name:
                    options.append(("grpc.ssl_target_name_override", name))
                channel = grpc.aio.secure_channel(
                    endpoint.address, self._tls.credentials(), options=options
                )
            self._channels[index] = channel
        return channel

    def _batcher(self, index: int) -> SubmitBatcher:
        batcher = self._batchers.get(index)
        if batcher is None:
            stub = client_pb2_grpc.ClientServiceStub(self._channel(index))
            metadata = self._metadata

            async def send_one(
                request: client_pb2.SubmitRequest, timeout: float
            ) -> client_pb2.SubmitResponse:
                try:
                    answer: client_pb2.SubmitResponse = await stub.Submit(
                        request, timeout=timeout, metadata=metadata
                    )
                except grpc.aio.AioRpcError as error:
                    raise _refused(error) from None
                return answer

            async def send_many(
                request: client_pb2.SubmitBatchRequest, timeout: float
            ) -> client_pb2.SubmitBatchResponse:
                try:
                    answer: client_pb2.SubmitBatchResponse = await stub.SubmitBatch(
                        request, timeout=timeout, metadata=metadata
                    )
                except grpc.aio.AioRpcError as error:
                    raise _refused(error) from None
                return answer

            batch_max, in_flight_max, linger_s = self._batching
            batcher = SubmitBatcher(
                send_one, send_many, batch_max=batch_max, in_flight_max=in_flight_max,
                linger_s=linger_s, grace_s=self.attempt_s,
            )  # fmt: skip
            self._batchers[index] = batcher
        return batcher


async def _once(index: int) -> AsyncIterator[int]:
    yield index


async def _never(request: Message, timeout: float) -> Any:
    raise AssertionError("a batcher made only to check its settings")


async def _sleep_until(deadline: float, seconds: float) -> None:
    await asyncio.sleep(max(0.0, min(seconds, deadline - time.monotonic())))


def _checked_timeout(seconds: float) -> float:
    if not 0 < seconds <= TIMEOUT_S_MOST:
        raise ValueError(f"timeout {seconds} s is outside (0, {TIMEOUT_S_MOST:g}]")
    return seconds


def _duration(seconds: float) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(int(seconds * 1e9))
    return duration


def _statements(sql: str | Sequence[Statement], params: Sequence[SqlValue]) -> list[Statement]:
    if isinstance(sql, str):
        return [Statement(sql, tuple(params))]
    if params:
        raise ValueError("parameters go inside each Statement when submitting several")
    statements = list(sql)
    if not all(isinstance(s, Statement) for s in statements):
        raise TypeError("submit takes SQL text and parameters, or a sequence of Statement")
    return statements


def _submittable(transaction: Submittable) -> list[Statement]:
    if isinstance(transaction, str):
        return [Statement(transaction)]
    if isinstance(transaction, tuple) and transaction and isinstance(transaction[0], str):
        sql, params = transaction
        return [Statement(sql, tuple(params))]
    return _statements(transaction, ())  # type: ignore[arg-type]


def _refused(error: grpc.aio.AioRpcError) -> Refused:
    hint = dict(error.trailing_metadata() or ()).get("retry-after-ms", "0")
    try:
        retry_after_s = int(hint) / 1000
    except (TypeError, ValueError):
        retry_after_s = 0.0
    return Refused(error.code(), error.details() or "", retry_after_s)


def _exhausted(last: Exception | None, what: str) -> TxSyncError:
    """What to raise when the deadline passed: the last DC's reason, if it had one."""
    if isinstance(last, TxSyncError):
        return last
    return Unavailable(f"{what}: no DC answered before the deadline")


def _outcome_or_none(
    answer: client_pb2.WaitResponse | client_pb2.SubmitResponse,
) -> common_pb2.Outcome | None:
    return answer.outcome if answer.HasField("outcome") else None


def _name(state: int) -> str:
    return found.name if (found := state_of(state)) is not None else "UNKNOWN"


def _submitted(answer: client_pb2.SubmitResponse, endpoint: Endpoint, key: str) -> Submitted:
    outcome = outcome_of(answer.outcome) if answer.HasField("outcome") else None
    if outcome is not None and answer.state == common_pb2.TX_STATE_FAILED:
        raise TransactionFailed(outcome.duplicate_of or answer.tx_id, outcome)
    duplicate = outcome is not None and bool(outcome.duplicate_of)
    return Submitted(
        tx_id=outcome.duplicate_of if outcome is not None and duplicate else answer.tx_id,
        state=State(answer.state),
        created=answer.created and not duplicate,
        duplicate=duplicate,
        outcome=outcome,
        dc=endpoint.dc or endpoint.address,
        key=key,
    )
