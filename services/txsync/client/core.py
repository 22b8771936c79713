"""What the client does, written once for both faces: ``Core`` holds the failover,
retry and idempotency rules and builds every request; a ``Transport`` does the I/O.

``AsyncClient`` gives ``Core`` a transport on grpc.aio. ``Client`` gives it one whose
``async`` methods block (synchronous gRPC in the caller's own thread, ``time.sleep``)
and so never suspend: a ``Core`` coroutine then runs to its end in one ``send`` (``run``
below), with no event loop and no thread hop between the caller and its call. So
``Core`` awaits nothing but its transport.

Failover. A call goes to the DC in use, the preferred one first. When that DC does not
answer (UNAVAILABLE, a deadline, a restart), refuses in a way another DC may not
(FAILED_PRECONDITION, ...), or holds a submit ``attempt_s`` without ordering it while
reporting that it is cut off from a majority, the call goes to the next DC, the same
submit with the same idempotency key, with a growing pause after each round of all DCs,
until the call's ``timeout``. The client then stays with the DC that answered. After a
round in which none answered, the endpoints are found again (``Core.locate``), so that a
DC that moved to another address is followed.

Idempotency. Every submit carries a key (a random one unless given). A retry at the same
DC is answered from the first submit; one at another DC is ordered too but runs nothing:
the first transaction with a key in the agreed order is the one that counts, at every DC,
and a later one answers with its id and outcome (docs/client.md, "Idempotency").
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf import duration_pb2
from google.protobuf.message import Message

from txsync.client.batching import Refused
from txsync.client.endpoints import Endpoint
from txsync.client.errors import (
    RETRIED_ELSEWHERE,
    Backpressure,
    BatchFailed,
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
from txsync.v1 import admin_pb2, client_pb2, common_pb2

TIMEOUT_S_DEFAULT = 30.0
"""A call's whole deadline, failovers included."""
TIMEOUT_S_MOST = 600.0
"""What a DC waits for at most in one call."""
WAIT_BATCH_MOST = 1_000
"""Transactions per ``WaitBatch`` call (what a store takes)."""
QUERY_WAIT_S_MOST = 60.0
"""The longest a DC's worker waits for what a read must see (``QueryRequest.timeout``)."""
ATTEMPT_S_DEFAULT = 5.0
"""How long a submit waits at one DC before the client asks whether that DC can still
order anything (and moves on if it cannot), and how long a DC may take to answer beyond
what it was asked to wait for before the client takes it for down."""
BACKOFF_FIRST_S = 0.05
BACKOFF_MOST_S = 2.0
LOAD_PAUSE_FIRST_S = 0.25
"""The first pause before a batch's submits refused for load go again (the stores'
retry hint), doubling up to BACKOFF_MOST_S."""

Submittable = str | Sequence[Statement] | tuple[str, Sequence[SqlValue]]
"""One transaction for ``submit_many``: SQL text, (SQL, parameters), or statements."""
Wait = str | State | None
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Reached:
    """Where a transaction got to (``wait``)."""

    tx_id: str
    """The transaction that counts (the first with its key, for a duplicate)."""
    state: State
    outcome: common_pb2.Outcome | None


class Transport(Protocol):
    """The I/O ``Core`` needs; every method raises ``Refused`` for a refusal."""

    async def submit(
        self, index: int, request: client_pb2.SubmitRequest
    ) -> client_pb2.SubmitResponse:
        """One submit to DC ``index``, through its batching."""
        ...

    async def call(
        self, index: int, service: str, method: str, request: Message, timeout: float
    ) -> Any:
        """``<service>.<method>`` at DC ``index`` (service "client" or "admin")."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    async def blocking(self, work: Callable[[], _T]) -> _T:
        """``work()`` (a DNS lookup, a file read) without holding up other calls."""
        ...

    async def reconnect(self) -> None:
        """Close every channel: the endpoints changed (``Core.locate``)."""
        ...


def caller_traceparent() -> str:
    """The W3C traceparent of the caller's current span, when the application traces
    with OpenTelemetry; "" otherwise (the client does not depend on it)."""
    try:
        from opentelemetry import trace  # noqa: PLC0415 - optional, and cached once imported
    except ImportError:
        return ""
    span = trace.get_current_span().get_span_context()
    if not span.is_valid:
        return ""
    return f"00-{span.trace_id:032x}-{span.span_id:016x}-{int(span.trace_flags):02x}"


def run(call: Coroutine[Any, Any, _T]) -> _T:
    """``call``'s result, for a ``Core`` coroutine on a blocking transport (it never
    suspends: the module docstring)."""
    try:
        call.send(None)
    except StopIteration as done:
        result: _T = done.value
        return result
    call.close()
    raise RuntimeError("a blocking client's call suspended: its transport must not await")


class Core:
    def __init__(
        self,
        endpoints: list[Endpoint],
        transport: Transport,
        *,
        timeout: float,
        attempt_s: float,
        idempotent: bool,
        batch_max: int,
        locate: Callable[[], list[Endpoint]] | None = None,
    ) -> None:
        self.endpoints, self.transport = endpoints, transport
        self.timeout, self.attempt_s = checked_timeout(timeout), attempt_s
        self.idempotent, self.batch_max = idempotent, batch_max
        self.locate = locate
        """Finds the DCs again from what the client was given (a cluster file read
        again, a DNS name looked up again), after a round in which none answered: a
        long-lived client follows a DC whose address changed (a rescheduled pod)."""
        self.current = 0
        """Index in ``endpoints`` of the DC in use."""
        self.batch_calls = 0
        """``SubmitBatch`` calls ``submit_many`` made."""
        self.seen_position = 0
        """The furthest place in the agreed order this client has seen, in the answers to
        its submits, waits, gets and reads: its reads ask for at least there (session
        consistency, docs/client.md), whichever DC answers them."""
        self.unplaced = ""
        """The newest submit answered before its place was known (``wait=None``): the
        next read also waits for it, and forgets it once one did."""

    def saw(self, position: int) -> None:
        self.seen_position = max(self.seen_position, position)

    def _saw_submitted(self, answer: Submitted) -> Submitted:
        if answer.position:
            self.saw(answer.position)
        else:
            self.unplaced = answer.tx_id
        return answer

    # -- writing ------------------------------------------------------------------------

    async def submit(
        self, body: common_pb2.TxBody, key: str | None, wait: Wait, timeout: float | None
    ) -> Submitted:
        """One submit, with failover; an error it raises carries the key the submit
        carried (``TxSyncError.key``), so that the caller can retry it safely."""
        retried = self.idempotent or bool(key)
        key = key or (new_key() if self.idempotent else "")
        try:
            return self._saw_submitted(await self._submit(body, key, retried, wait, timeout))
        except TxSyncError as error:
            error.key = key
            raise

    async def _submit(
        self, body: common_pb2.TxBody, key: str, retried: bool, wait: Wait, timeout: float | None
    ) -> Submitted:
        wanted = None if wait is None else State.named(wait)
        deadline = self._deadline(timeout)
        # The caller's own trace, carried by the submit itself: concurrent submits of
        # several callers, batched into one call, each stay in their caller's trace.
        request = client_pb2.SubmitRequest(
            body=body, idempotency_key=key, traceparent=caller_traceparent()
        )
        if wanted is not None:
            request.wait_for = common_pb2.TxState.ValueType(wanted.value)
        last: Exception | None = None
        async for index in self._failover_order(deadline):
            endpoint = self._endpoint(index)
            if wanted is not None:
                attempt = min(self.attempt_s, deadline - time.monotonic())
                request.wait_timeout.CopyFrom(duration(max(attempt, 0.001)))
            try:
                answer = await self.transport.submit(index, request)
            except Refused as refused:
                last = self._refusal(refused)
                if isinstance(last, Backpressure):
                    # Refused for load, the DC stored nothing: sent again after the pause
                    # it asks for, key or no key (as ``submit_many`` does). Raised at once,
                    # an unkeyed submit failed every caller of a burst the DCs' flow
                    # control slowed for a moment (``--unpassed-max``; bench.soak).
                    await self._sleep_until(deadline, max(last.retry_after_s, BACKOFF_FIRST_S))
                    continue
                if not retried:
                    raise last from None
                continue
            self.current = index
            if wanted is None or answer.reached:
                return submitted(answer, endpoint, key)
            reached = await self._wait_while_ordering(index, answer.tx_id, wanted, deadline)
            if reached is not None:
                answer.state = common_pb2.TxState.ValueType(reached.state.value)
                if reached.outcome is not None:
                    answer.outcome.CopyFrom(reached.outcome)
                return submitted(answer, endpoint, key)
            last = Timeout(
                f"{endpoint} did not order transaction {answer.tx_id} in time", answer.tx_id,
                State(answer.state).name,
            )  # fmt: skip
            if not retried:
                raise last
        raise _exhausted(last, "submit")

    async def submit_many(
        self,
        bodies: Sequence[common_pb2.TxBody],
        keys: Sequence[str] | None,
        wait: Wait,
        timeout: float | None,
    ) -> list[Submitted | TxSyncError]:
        """Each body in one ``SubmitBatch`` call per ``batch_max``, at the DC in use. A
        submit the DC took but did not order in time is waited for there while it can
        order; one it refused in a way another DC may not, or did not answer, goes on
        alone with its key, as ``submit`` would (without a key it is not sent again)."""
        if keys is not None and len(keys) != len(bodies):
            raise ValueError(f"{len(keys)} keys for {len(bodies)} transactions")
        wanted = None if wait is None else State.named(wait)
        chosen = [k for k in keys] if keys is not None else [""] * len(bodies)
        chosen = [k or (new_key() if self.idempotent else "") for k in chosen]
        requests = [
            client_pb2.SubmitRequest(body=body, idempotency_key=key)
            for body, key in zip(bodies, chosen, strict=True)
        ]
        deadline = self._deadline(timeout)
        seconds = min(self.attempt_s, deadline - time.monotonic())
        for request in requests:
            if wanted is not None:
                request.wait_for = common_pb2.TxState.ValueType(wanted.value)
                request.wait_timeout.CopyFrom(duration(max(seconds, 0.001)))
        index = self.current
        results: list[Submitted | TxSyncError | None] = [None] * len(requests)
        # Submits the DC took but did not order in time: waited for, not sent again.
        taken: dict[int, client_pb2.SubmitResponse] = {}
        to_send, pause = list(range(len(requests))), LOAD_PAUSE_FIRST_S
        while to_send:
            # Refused for load: the DC stored nothing of them, so they go again after a
            # pause, key or no key. Sent again at once, a loaded DC spent its time
            # refusing them (the 1M soak's dc1 never caught up).
            held_back: dict[int, Backpressure] = {}
            for start in range(0, len(to_send), self.batch_max):
                numbers = to_send[start : start + self.batch_max]
                self.batch_calls += 1
                try:
                    answer: client_pb2.SubmitBatchResponse = await self.transport.call(
                        index, "client", "SubmitBatch",
                        client_pb2.SubmitBatchRequest(submits=[requests[n] for n in numbers]),
                        seconds + self.attempt_s,
                    )  # fmt: skip
                except Refused:
                    continue  # each goes on alone below
                self.current = index
                for n, settled in zip(numbers, answer.results, strict=True):
                    if (refused := _refused_for_load(settled)) is not None:
                        held_back[n] = refused
                        continue
                    results[n] = self._settled(settled, index, chosen[n], wanted)
                    if results[n] is None and settled.WhichOneof("result") == "accepted":
                        taken[n] = settled.accepted
            if held_back and deadline - time.monotonic() > pause:
                await self._sleep_until(deadline, pause)
                pause = min(2 * pause, BACKOFF_MOST_S)
                to_send = sorted(held_back)
                seconds = min(self.attempt_s, deadline - time.monotonic())
                for n in to_send:
                    requests[n].wait_timeout.CopyFrom(duration(max(seconds, 0.001)))
                continue
            for n, refused in held_back.items():
                results[n] = refused
            break
        waited = await self._wait_all_while_ordering(index, taken, wanted, deadline)
        for n, accepted in taken.items():
            reached = waited.get(n)
            if reached is None and (self.idempotent or chosen[n]):
                continue  # its DC cannot order it now: sent again elsewhere, below
            if reached is None:
                results[n] = Timeout(
                    f"{self._endpoint(index)} did not order transaction {accepted.tx_id} in time",
                    accepted.tx_id, State(accepted.state).name,
                )  # fmt: skip
                continue
            accepted.state = common_pb2.TxState.ValueType(reached.state.value)
            if reached.outcome is not None:
                accepted.outcome.CopyFrom(reached.outcome)
            try:
                results[n] = submitted(accepted, self._endpoint(index), chosen[n])
            except TransactionFailed as failed:
                results[n] = failed
        for n, result in enumerate(results):
            if result is None and (self.idempotent or chosen[n]):
                # Within the batch's deadline: ``timeout`` is the whole call's.
                left = max(deadline - time.monotonic(), 0.001)
                try:
                    results[n] = await self.submit(bodies[n], chosen[n], wait, left)
                except TxSyncError as error:
                    results[n] = error
            elif result is None:  # refused or unanswered, and not to be sent twice
                results[n] = Unavailable(
                    f"{self._endpoint(index)} did not answer the submit (sent once: no key)"
                )
        answered = [r for r in results if r is not None]
        for result, key in zip(answered, chosen, strict=True):
            if isinstance(result, TxSyncError):
                result.key = key  # what a safe retry of this one sends again
            else:
                self._saw_submitted(result)
        return answered

    def _settled(
        self, result: client_pb2.SubmitResult, index: int, key: str, wanted: State | None
    ) -> Submitted | TxSyncError | None:
        """One submit of a batch, if the batch's answer settles it."""
        if (refusal := _batch_refusal(result)) is not None:
            code, error = refusal
            elsewhere = code in RETRIED_ELSEWHERE or isinstance(error, Backpressure)
            return None if elsewhere else error
        if wanted is not None and not result.accepted.reached:
            return None  # not ordered in time: it waits on alone, as submit would
        try:
            return submitted(result.accepted, self._endpoint(index), key)
        except TransactionFailed as failed:
            return failed

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
            if answer.reached and answer.state:  # a state, whatever a server sends
                return Reached(tx_id, State(answer.state), _outcome_or_none(answer))
        return None

    async def _wait_all_while_ordering(
        self,
        index: int,
        taken: dict[int, client_pb2.SubmitResponse],
        wanted: State | None,
        deadline: float,
    ) -> dict[int, Reached]:
        """``_wait_while_ordering`` for every submit of ``taken`` at once: ``WaitBatch``
        calls of up to WAIT_BATCH_MOST while DC ``index`` can order. Waiting for them one
        after another let the last ones be truncated (and their verdicts forgotten)
        before they were asked about: the soak's loaders then waited to their timeout.
        Those reached, by their index; a DC without ``WaitBatch`` (an older release) is
        asked one by one."""
        reached: dict[int, Reached] = {}
        pending = dict(taken)
        while wanted is not None and pending and (left := deadline - time.monotonic()) > 0:
            if not await self._orders(index, left):
                break
            items = list(pending.items())
            for start in range(0, len(items), WAIT_BATCH_MOST):
                chunk = items[start : start + WAIT_BATCH_MOST]
                seconds = max(min(self.attempt_s, deadline - time.monotonic()), 0.001)
                request = client_pb2.WaitBatchRequest(
                    tx_ids=[accepted.tx_id for _, accepted in chunk],
                    state=common_pb2.TxState.ValueType(wanted.value),
                    timeout=duration(seconds),
                )
                try:
                    answer: client_pb2.WaitBatchResponse = await self.transport.call(
                        index, "client", "WaitBatch", request, seconds + self.attempt_s
                    )
                except Refused as refused:
                    if refused.code == grpc.StatusCode.UNIMPLEMENTED:
                        return reached | await self._wait_each(index, pending, wanted, deadline)
                    # Busy or slow to answer: asked again while the DC says it orders.
                    await self._sleep_until(deadline, BACKOFF_FIRST_S)
                    break
                for (n, accepted), one in zip(chunk, answer.results, strict=True):
                    if one.reached and one.state:  # a state, whatever a server sends
                        reached[n] = Reached(
                            accepted.tx_id, State(one.state), _outcome_or_none(one)
                        )
                        del pending[n]
        return reached

    async def _wait_each(
        self,
        index: int,
        pending: dict[int, client_pb2.SubmitResponse],
        wanted: State,
        deadline: float,
    ) -> dict[int, Reached]:
        reached = {}
        for n, accepted in pending.items():
            one = await self._wait_while_ordering(index, accepted.tx_id, wanted, deadline)
            if one is not None:
                reached[n] = one
        return reached

    async def _orders(self, index: int, left: float) -> bool:
        """Whether DC ``index`` says it is in a view with a majority (or cannot say: a
        caller whose role may not read the status keeps waiting there)."""
        try:
            status: admin_pb2.GetStatusResponse = await self.transport.call(
                index, "admin", "GetStatus", admin_pb2.GetStatusRequest(), min(left, 5.0)
            )
        except Refused as refused:
            return refused.code == grpc.StatusCode.PERMISSION_DENIED
        return bool(status.local.quorum != admin_pb2.QUORUM_STATE_MINORITY)

    # -- reading ------------------------------------------------------------------------

    async def get(self, tx_id: str, key: str, body: bool, timeout: float | None) -> TxInfo:
        if not tx_id and not key:
            raise ValueError("give a transaction id or an idempotency key")
        request = client_pb2.GetRequest(tx_id=tx_id, idempotency_key=key, include_body=body)
        answer: client_pb2.GetResponse = await self.call(
            "Get", request, timeout, others_on_not_found=True
        )
        self.saw(answer.position)
        return tx_info_of(answer)

    async def wait(self, tx_id: str, state: str | State, timeout: float | None) -> Reached:
        wanted = State.named(state)
        deadline = self._deadline(timeout)
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
            if outcome is not None:
                self.saw(outcome.position)
            if wanted is State.OK and answer.state == common_pb2.TX_STATE_FAILED:
                raise TransactionFailed(tx_id, outcome_of(answer.outcome))
            return Reached(outcome.duplicate_of if outcome and outcome.duplicate_of else tx_id,
                           State(answer.state), outcome)  # fmt: skip
        raise _exhausted(last, "wait")

    async def _wait_once(
        self, index: int, tx_id: str, wanted: State, seconds: float
    ) -> client_pb2.WaitResponse:
        request = client_pb2.WaitRequest(
            tx_id=tx_id, state=common_pb2.TxState.ValueType(wanted.value),
            timeout=duration(max(seconds, 0.001)),
        )  # fmt: skip
        answer: client_pb2.WaitResponse = await self.transport.call(
            index, "client", "Wait", request, seconds + self.attempt_s
        )
        return answer

    async def list_page(
        self, state: str | State | None, page_token: str, page_size: int
    ) -> tuple[list[TxInfo], str]:
        request = client_pb2.ListRequest(
            state=common_pb2.TxState.ValueType(State.named(state).value if state else 0),
            page_size=page_size, page_token=page_token,
        )  # fmt: skip
        # A page token is one DC's: only the first page may go elsewhere.
        answer: client_pb2.ListResponse = await self.call(
            "List", request, None, failover=not page_token
        )
        return [tx_info_of(t) for t in answer.transactions], answer.next_page_token

    async def query(
        self,
        sql: str,
        params: Sequence[SqlValue],
        *,
        after: str | Submitted | None,
        after_position: int,
        max_rows: int,
        timeout: float | None,
        worker: str,
        session: bool,
    ) -> QueryResult:
        """A read at the DC in use (failing over); ``session``: at least where this
        client has seen the order reach, and after its newest unplaced submit."""
        timeout = checked_timeout(self.timeout if timeout is None else timeout)
        after_tx = after.tx_id if isinstance(after, Submitted) else (after or "")
        waited_unplaced = ""
        if session:
            after_position = max(after_position, self.seen_position)
            if not after_tx and self.unplaced:
                after_tx = waited_unplaced = self.unplaced
        # One timeout rule, as for every call: ``timeout`` is the whole read. The worker
        # at each DC waits up to ``attempt_s`` for what the read must see; one that
        # does not get there in time hands the read to the next DC, until the deadline.
        waited_s = min(self.attempt_s, timeout, QUERY_WAIT_S_MOST)
        request = client_pb2.QueryRequest(
            statement=common_pb2.Statement(sql=sql, params=[value_to_proto(p) for p in params]),
            after_tx_id=after_tx, after_position=after_position, max_rows=max_rows,
            timeout=duration(waited_s), worker_id=worker,
        )  # fmt: skip
        answer: client_pb2.QueryResponse = await self.call(
            "Query", request, timeout, attempt_s=waited_s + self.attempt_s
        )
        if waited_unplaced and self.unplaced == waited_unplaced:
            self.unplaced = ""  # applied where the read ran: its place is within answer.position
        self.saw(answer.position)
        return query_result_of(answer)

    # -- plumbing -----------------------------------------------------------------------

    async def call(
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
        deadline = self._deadline(timeout)
        last: Exception | None = None
        order = self._failover_order(deadline) if failover else _once(self.current)
        tried: set[int] = set()
        async for index in order:
            if isinstance(last, NotFound) and index in tried:
                raise last  # every DC was asked
            tried.add(index)
            left = max(min(deadline - time.monotonic(), attempt_s or self.attempt_s), 0.001)
            try:
                answer = await self.transport.call(index, "client", method, request, left)
            except Refused as refused:
                last = self._refusal(refused)
                if isinstance(last, NotFound) and not others_on_not_found:
                    raise last from None
                if isinstance(last, Backpressure):
                    await self._sleep_until(deadline, last.retry_after_s)
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
            if await self._locate_again():
                count, start = len(self.endpoints), self.current
            await self._sleep_until(deadline, pause)

    def _endpoint(self, index: int) -> Endpoint:
        """DC ``index`` of those in use. Modulo their number: another task's call may
        have found the DCs again (``_locate_again``) since ``index`` was chosen."""
        return self.endpoints[index % len(self.endpoints)]

    async def _locate_again(self) -> bool:
        """True if ``locate`` found other endpoints, now in use (the preferred first)."""
        if self.locate is None:
            return False
        try:
            found = await self.transport.blocking(self.locate)
        except ValueError:  # EndpointError, a TLS name it cannot make: keep those known
            return False
        if not found or found == self.endpoints:
            return False
        await self.transport.reconnect()
        self.endpoints[:] = found  # the list the client and its transport share
        self.current = 0
        return True

    async def _sleep_until(self, deadline: float, seconds: float) -> None:
        left = min(seconds, deadline - time.monotonic())
        if left > 0:
            await self.transport.sleep(left)

    def _deadline(self, timeout: float | None) -> float:
        return time.monotonic() + checked_timeout(self.timeout if timeout is None else timeout)


def new_key() -> str:
    """A key no other submit has: 128 random bits (``uuid`` would cost every CLI call the
    import of ``platform``)."""
    return os.urandom(16).hex()


async def _once(index: int) -> AsyncIterator[int]:
    yield index


def checked_timeout(seconds: float) -> float:
    if not 0 < seconds <= TIMEOUT_S_MOST:
        raise ValueError(f"timeout {seconds} s is outside (0, {TIMEOUT_S_MOST:g}]")
    return seconds


def duration(seconds: float) -> duration_pb2.Duration:
    value = duration_pb2.Duration()
    value.FromNanoseconds(int(seconds * 1e9))
    return value


def statements_of(sql: str | Sequence[Statement], params: Sequence[SqlValue]) -> list[Statement]:
    """``submit``'s transaction: SQL text and its parameters, or statements."""
    if isinstance(sql, str):
        return [Statement(sql, tuple(params))]
    if params:
        raise ValueError("parameters go inside each Statement when submitting several")
    statements = list(sql)
    if not all(isinstance(s, Statement) for s in statements):
        raise TypeError("submit takes SQL text and parameters, or a sequence of Statement")
    return statements


def bodies_of(transactions: Sequence[Submittable]) -> list[common_pb2.TxBody]:
    """``submit_many``'s transactions as bodies."""
    bodies = []
    for transaction in transactions:
        if isinstance(transaction, str):
            statements = [Statement(transaction)]
        elif isinstance(transaction, tuple) and transaction and isinstance(transaction[0], str):
            sql, params = transaction
            statements = [Statement(sql, tuple(params))]
        else:
            statements = statements_of(transaction, ())  # type: ignore[arg-type]
        bodies.append(body_of(statements))
    return bodies


def refused_by(error: grpc.Call | grpc.aio.AioRpcError) -> Refused:
    """A failed call (blocking or asyncio) as ``Refused``, with the DC's
    ``retry-after-ms`` hint."""
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


def submitted(answer: client_pb2.SubmitResponse, endpoint: Endpoint, key: str) -> Submitted:
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
        position=answer.position or (outcome.position if outcome is not None else 0),
    )


def _batch_refusal(result: client_pb2.SubmitResult) -> tuple[grpc.StatusCode, TxSyncError] | None:
    """The code and error of a submit a batch's answer refused ("NAME: details"), or
    None if the DC took it."""
    if result.WhichOneof("result") == "accepted":
        return None
    name, _, details = result.error.partition(": ")
    code = grpc.StatusCode.__members__.get(name, grpc.StatusCode.UNKNOWN)
    return code, from_status(code, details or result.error, LOAD_PAUSE_FIRST_S)


def _refused_for_load(result: client_pb2.SubmitResult) -> Backpressure | None:
    """The ``Backpressure`` a batch's answer gives one submit, if the DC refused it for
    load (it stored nothing of it)."""
    refusal = _batch_refusal(result)
    return refusal[1] if refusal is not None and isinstance(refusal[1], Backpressure) else None


def raising_failed(results: list[Submitted | TxSyncError]) -> list[Submitted]:
    """``results`` if every one is a ``Submitted``; else ``BatchFailed`` holding all."""
    answered = [r for r in results if isinstance(r, Submitted)]
    if len(answered) < len(results):
        raise BatchFailed(results)
    return answered
