"""Gathering concurrent submits to one DC into ``SubmitBatch`` calls (as Kafka's producer
gathers records), each caller answered on its own.

A submit goes out at once when fewer than ``in_flight_max`` calls to the DC are under
way, so a lone caller never waits for company; submits that arrive while that many are
under way queue, and the next call carries all of them (at most ``batch_max``). Under
load that makes one call, one fsync and one ordering step serve many callers.

``SubmitBatcher`` does it for tasks on an event loop (with ``linger_s``, the first queued
submit also waits that long for others); ``ThreadBatcher`` for threads, with no thread of
its own: a caller that finds a call free makes it, carrying whatever is queued, in its
own thread (flat combining), and the others wait for their answers.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future

import grpc

from txsync.v1 import client_pb2

BATCH_MAX_DEFAULT = 256
BATCH_MAX_MOST = 1_000
"""What a DC takes in one ``SubmitBatch``."""
IN_FLIGHT_MAX_DEFAULT = 4
RESPONSE_GRACE_S_DEFAULT = 5.0
"""A call's deadline beyond the longest wait it asks the DC for: past it, the DC is
taken as not answering."""


class Refused(Exception):
    """One call's refusal, as the DC (or the channel) gave it."""

    def __init__(self, code: grpc.StatusCode, details: str, retry_after_s: float = 0.0) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code, self.details, self.retry_after_s = code, details, retry_after_s


SendOne = Callable[[client_pb2.SubmitRequest, float], Awaitable[client_pb2.SubmitResponse]]
SendMany = Callable[
    [client_pb2.SubmitBatchRequest, float], Awaitable[client_pb2.SubmitBatchResponse]
]
_Queued = tuple[client_pb2.SubmitRequest, "asyncio.Future[client_pb2.SubmitResponse]"]
"""A submit waiting to be sent, and where its caller waits for the answer."""


class SubmitBatcher:
    def __init__(
        self,
        send_one: SendOne,
        send_many: SendMany,
        *,
        batch_max: int = BATCH_MAX_DEFAULT,
        in_flight_max: int = IN_FLIGHT_MAX_DEFAULT,
        linger_s: float = 0.0,
        grace_s: float = RESPONSE_GRACE_S_DEFAULT,
    ) -> None:
        _check_settings(batch_max, in_flight_max)
        if linger_s < 0:
            raise ValueError("linger_s must not be negative")
        self._send_one, self._send_many = send_one, send_many
        self.batch_max, self.in_flight_max, self.linger_s = batch_max, in_flight_max, linger_s
        self.grace_s = grace_s
        self._queued: deque[_Queued] = deque()
        self._in_flight = 0
        self._lingering: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0
        """Calls made (for tests and benchmarks: submits per call is what batching buys)."""

    async def submit(self, request: client_pb2.SubmitRequest) -> client_pb2.SubmitResponse:
        """The DC's answer to ``request``; raises ``Refused``."""
        answer: asyncio.Future[client_pb2.SubmitResponse] = (
            asyncio.get_running_loop().create_future()
        )
        self._queued.append((request, answer))
        if self.linger_s and self._in_flight and len(self._queued) < self.batch_max:
            if self._lingering is None:
                self._lingering = asyncio.get_running_loop().call_later(self.linger_s, self._pump)
        else:
            self._pump()
        return await answer

    def _pump(self) -> None:
        if self._lingering is not None:
            self._lingering.cancel()
            self._lingering = None
        while self._queued and self._in_flight < self.in_flight_max:
            batch = [self._queued.popleft() for _ in range(min(self.batch_max, len(self._queued)))]
            batch = [(r, f) for r, f in batch if not f.done()]  # callers that gave up
            if not batch:
                continue
            self._in_flight += 1
            self.calls += 1
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Queued]) -> None:
        timeout = self.grace_s + max(r.wait_timeout.ToNanoseconds() / 1e9 for r, _ in batch)
        try:
            if len(batch) == 1:
                (request, answer), = batch  # fmt: skip
                settle(answer, await self._send_one(request, timeout))
                return
            answered = await self._send_many(
                client_pb2.SubmitBatchRequest(submits=[r for r, _ in batch]), timeout
            )
            for (_, answer), result in zip(batch, answered.results, strict=True):
                settle(answer, answer_of(result))
        except Refused as refused:
            for _, answer in batch:
                settle(answer, refused)
        except BaseException as error:  # the loop is closing: no caller may hang
            for _, answer in batch:
                settle(answer, Refused(grpc.StatusCode.CANCELLED, str(error) or "cancelled"))
            raise
        finally:
            self._in_flight -= 1
            self._pump()


def _check_settings(batch_max: int, in_flight_max: int) -> None:
    if not 1 <= batch_max <= BATCH_MAX_MOST:
        raise ValueError(f"batch_max {batch_max} is outside 1..{BATCH_MAX_MOST}")
    if in_flight_max < 1:
        raise ValueError(f"in_flight_max {in_flight_max} is below 1")


def settle(
    answer: asyncio.Future[client_pb2.SubmitResponse] | Future[client_pb2.SubmitResponse],
    result: client_pb2.SubmitResponse | Refused,
) -> None:
    """Give the caller waiting on ``answer`` its result (unless it has one already)."""
    if answer.done():
        return
    if isinstance(result, Refused):
        answer.set_exception(result)
    else:
        answer.set_result(result)


def answer_of(result: client_pb2.SubmitResult) -> client_pb2.SubmitResponse | Refused:
    """One submit's answer in a ``SubmitBatch`` (or a ``SubmitEach`` message)."""
    if result.WhichOneof("result") == "accepted":
        return result.accepted
    return refused_in_batch(result.error)


def refused_in_batch(error: str) -> Refused:
    """A batch answers a refused submit with ``"CODE_NAME: message"``."""
    name, _, details = error.partition(": ")
    code = grpc.StatusCode.__members__.get(name, grpc.StatusCode.UNKNOWN)
    return Refused(code, details or error)


SendOneNow = Callable[[client_pb2.SubmitRequest, float], client_pb2.SubmitResponse]
SendManyNow = Callable[[client_pb2.SubmitBatchRequest, float], client_pb2.SubmitBatchResponse]


class ThreadBatcher:
    """``SubmitBatcher`` for threads (module docstring); ``send_one`` and ``send_many``
    block and raise ``Refused``."""

    def __init__(
        self,
        send_one: SendOneNow,
        send_many: SendManyNow,
        *,
        batch_max: int = BATCH_MAX_DEFAULT,
        in_flight_max: int = IN_FLIGHT_MAX_DEFAULT,
        grace_s: float = RESPONSE_GRACE_S_DEFAULT,
    ) -> None:
        _check_settings(batch_max, in_flight_max)
        self._send_one, self._send_many = send_one, send_many
        self.batch_max, self.in_flight_max, self.grace_s = batch_max, in_flight_max, grace_s
        self._queued: deque[tuple[client_pb2.SubmitRequest, Future[client_pb2.SubmitResponse]]]
        self._queued = deque()
        self._in_flight = 0
        self._changed = threading.Condition()
        self.calls = 0

    def submit(self, request: client_pb2.SubmitRequest) -> client_pb2.SubmitResponse:
        answer: Future[client_pb2.SubmitResponse] = Future()
        with self._changed:
            self._queued.append((request, answer))
        while not answer.done():
            with self._changed:
                if answer.done():
                    break
                if self._in_flight >= self.in_flight_max or not self._queued:
                    self._changed.wait()  # a call ended: maybe ours was in it
                    continue
                size = min(self.batch_max, len(self._queued))
                batch = [self._queued.popleft() for _ in range(size)]
                self._in_flight += 1
                self.calls += 1
            try:
                self._send(batch)
            finally:
                with self._changed:
                    self._in_flight -= 1
                    self._changed.notify_all()
        return answer.result()

    def _send(
        self, batch: list[tuple[client_pb2.SubmitRequest, Future[client_pb2.SubmitResponse]]]
    ) -> None:
        timeout = self.grace_s + max(r.wait_timeout.ToNanoseconds() / 1e9 for r, _ in batch)
        try:
            if len(batch) == 1:
                (request, answer), = batch  # fmt: skip
                answer.set_result(self._send_one(request, timeout))
                return
            answered = self._send_many(
                client_pb2.SubmitBatchRequest(submits=[r for r, _ in batch]), timeout
            )
            for (_, answer), result in zip(batch, answered.results, strict=True):
                settle(answer, answer_of(result))
        except Refused as refused:
            for _, answer in batch:
                if not answer.done():
                    answer.set_exception(refused)
        except BaseException as error:  # no caller may wait for ever
            for _, answer in batch:
                if not answer.done():
                    answer.set_exception(Refused(grpc.StatusCode.CANCELLED, repr(error)))
            raise
