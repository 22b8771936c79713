"""Single submits as messages on one long-lived ``SubmitEach`` call per DC, shared by a
client's callers, instead of a unary ``Submit`` call each.

A unary call costs about three times a stream message at each end (docs/benchmarks.md,
Tuning 20 and 41): its HTTP/2 stream is opened, its headers and trailers sent, and
grpc.aio wakes for each. On the stream a submit is one message each way, matched to its
answer by a call id the client chooses.

The stream is opened at the first submit and again after it broke; a submit already sent
on a stream that broke is answered with the stream's error (UNAVAILABLE when it just
ended), as a unary call that lost its connection would be, and the client's retry rules
apply to it as to any refusal. A DC that does not serve ``SubmitEach`` (a store of
0.1.0) answers UNIMPLEMENTED once; the DC is then sent unary calls for good. A DC with
no room for another stream answers its first message RESOURCE_EXHAUSTED naming
``STREAMS_LIMIT`` and ends it; the DC is then sent unary calls for
``REFUSED_PAUSE_S``, and asked again after. Either way nothing sent on the refused
stream was taken, and each of its submits goes again as a unary call.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import grpc

from txsync.client.batching import Refused, answer_of, settle
from txsync.v1 import client_pb2

OpenStream = Callable[
    [Iterator[client_pb2.SubmitEachRequest]], Generator[client_pb2.SubmitEachResponse]
]
"""Opens a ``SubmitEach`` call fed by the iterator; iterating the result reads answers
and raises ``Refused`` when the call ends in an error."""
OpenAioStream = Callable[
    [AsyncIterator[client_pb2.SubmitEachRequest]], AsyncGenerator[client_pb2.SubmitEachResponse]
]
"""``OpenStream`` for grpc.aio."""
_Answer = Future[client_pb2.SubmitResponse]

STREAMS_LIMIT = "SubmitEach streams"
"""What the DC's refusal of a whole stream names (client.proto): it took nothing of it."""
REFUSED_PAUSE_S = 10.0
"""How long a client sends unary calls to a DC that refused it a stream."""


class NotServed(Exception):
    """The DC has no ``SubmitEach``: nothing was taken; send it a unary ``Submit``."""


class _Call:
    """One opened ``SubmitEach`` call: what is queued to send, and who waits on it."""

    def __init__(self) -> None:
        self.sending: queue.SimpleQueue[client_pb2.SubmitEachRequest | None]
        self.sending = queue.SimpleQueue()
        self.waiting: dict[int, _Answer] = {}
        self.refused = False
        """The DC refused the whole call: nothing sent on it was taken."""


class SubmitEachStream:
    """One DC's ``SubmitEach`` call, for threads: ``submit`` blocks its caller until
    the answer (or ``timeout``); a reader thread per call hands the answers out."""

    def __init__(self, open_stream: OpenStream) -> None:
        self._open_stream = open_stream
        self._lock = threading.Lock()
        self._call_ids = itertools.count(1)
        self._call: _Call | None = None
        self.not_served = False
        """The DC answered UNIMPLEMENTED: it has no ``SubmitEach``."""
        self.unary_until = 0.0
        """``time.monotonic()`` until which the DC is sent unary calls (it refused one)."""
        self.opened = 0
        """Calls opened (for tests: one serves every submit while it lasts)."""

    def submit(
        self, request: client_pb2.SubmitRequest, timeout: float
    ) -> client_pb2.SubmitResponse:
        """The DC's answer; raises ``Refused``, or ``NotServed`` (nothing was taken)."""
        answer: _Answer = Future()
        with self._lock:
            if self.not_served or time.monotonic() < self.unary_until:
                raise NotServed
            call = self._call or self._open()
            call_id = next(self._call_ids)
            call.waiting[call_id] = answer
            call.sending.put(client_pb2.SubmitEachRequest(call_id=call_id, submit=request))
        try:
            return answer.result(timeout)
        except FutureTimeout:
            with self._lock:
                call.waiting.pop(call_id, None)
            raise Refused(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer within {timeout:.1f} s"
            ) from None
        except _NotServedRefusal:
            raise NotServed from None

    def close(self) -> None:
        """End the call: the DC answers what it has, then its reader ends."""
        with self._lock:
            if self._call is not None:
                self._call.sending.put(None)
                self._call = None

    def _open(self) -> _Call:
        call = self._call = _Call()
        answers = self._open_stream(iter(call.sending.get, None))
        self.opened += 1
        reader = threading.Thread(
            target=self._read, args=(call, answers), name="txsync-submit-each", daemon=True
        )
        reader.start()
        return call

    def _read(self, call: _Call, answers: Generator[client_pb2.SubmitEachResponse]) -> None:
        ended: Refused = Refused(grpc.StatusCode.UNAVAILABLE, "the DC ended the submit stream")
        try:
            for answer in answers:
                if _refuses_the_call(self, call, answer.result):
                    break
                with self._lock:
                    waiting = call.waiting.pop(answer.call_id, None)
                if waiting is not None:  # else its caller gave up
                    settle(waiting, answer_of(answer.result))
        except Refused as refused:
            ended = refused
        finally:
            answers.close()  # the gRPC call with it
            with self._lock:
                if self._call is call:
                    self._call = None
                call.sending.put(None)  # gRPC's sending thread ends with the call
                ended = _not_taken(self, call, ended)
                left, call.waiting = call.waiting, {}
            for waiting in left.values():
                waiting.set_exception(ended)


def _refuses_the_call(
    stream: SubmitEachStream | AioSubmitEachStream,
    call: _Call | _AioCall,
    result: client_pb2.SubmitResult,
) -> bool:
    """Whether ``result`` is the DC's refusal of the whole call (no room for another
    stream); if so the DC is sent unary calls for ``REFUSED_PAUSE_S``."""
    error = result.error
    if not (error.startswith("RESOURCE_EXHAUSTED") and STREAMS_LIMIT in error):
        return False
    call.refused = True
    stream.unary_until = time.monotonic() + REFUSED_PAUSE_S
    return True


def _not_taken(
    stream: SubmitEachStream | AioSubmitEachStream, call: _Call | _AioCall, ended: Refused
) -> Refused:
    """What the submits left on an ended call are answered: ``ended``, or, if the DC
    refused the whole call (no ``SubmitEach``, or no room for another), a refusal that
    sends them again as unary calls: it took none of them."""
    if ended.code is grpc.StatusCode.UNIMPLEMENTED:
        stream.not_served = True
    elif not call.refused:
        return ended
    return _NotServedRefusal()


class _NotServedRefusal(Refused):
    """A submit sent on a call the DC refused: it was not taken."""

    def __init__(self) -> None:
        super().__init__(grpc.StatusCode.UNIMPLEMENTED, "the DC has no SubmitEach")


class _AioCall:
    def __init__(self) -> None:
        self.sending: asyncio.Queue[client_pb2.SubmitEachRequest | None] = asyncio.Queue()
        self.waiting: dict[int, asyncio.Future[client_pb2.SubmitResponse]] = {}
        self.refused = False

    async def requests(self) -> AsyncIterator[client_pb2.SubmitEachRequest]:
        while (request := await self.sending.get()) is not None:
            yield request


class AioSubmitEachStream:
    """``SubmitEachStream`` for an event loop: a reader task per call."""

    def __init__(self, open_stream: OpenAioStream) -> None:
        self._open_stream = open_stream
        self._call_ids = itertools.count(1)
        self._call: _AioCall | None = None
        self._readers: set[asyncio.Task[None]] = set()
        self.not_served = False
        self.unary_until = 0.0
        self.opened = 0

    async def submit(
        self, request: client_pb2.SubmitRequest, timeout: float
    ) -> client_pb2.SubmitResponse:
        """The DC's answer; raises ``Refused``, or ``NotServed`` (nothing was taken)."""
        if self.not_served or time.monotonic() < self.unary_until:
            raise NotServed
        call = self._call or self._open()
        call_id = next(self._call_ids)
        answer: asyncio.Future[client_pb2.SubmitResponse]
        answer = call.waiting[call_id] = asyncio.get_running_loop().create_future()
        call.sending.put_nowait(client_pb2.SubmitEachRequest(call_id=call_id, submit=request))
        try:
            async with asyncio.timeout(timeout):
                return await answer
        except TimeoutError:
            raise Refused(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer within {timeout:.1f} s"
            ) from None
        except _NotServedRefusal:
            raise NotServed from None
        finally:
            call.waiting.pop(call_id, None)  # its caller gave up, or has it

    async def close(self) -> None:
        """End the call, and wait for its reader (the DC answers what it has)."""
        if self._call is not None:
            self._call.sending.put_nowait(None)
            self._call = None
        if self._readers:
            await asyncio.wait(set(self._readers))

    def _open(self) -> _AioCall:
        call = self._call = _AioCall()
        self.opened += 1
        reader = asyncio.get_running_loop().create_task(
            self._read(call, self._open_stream(call.requests()))
        )
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)
        return call

    async def _read(
        self, call: _AioCall, answers: AsyncGenerator[client_pb2.SubmitEachResponse]
    ) -> None:
        ended: Refused = Refused(grpc.StatusCode.UNAVAILABLE, "the DC ended the submit stream")
        try:
            async for answer in answers:
                if _refuses_the_call(self, call, answer.result):
                    break
                waiting = call.waiting.pop(answer.call_id, None)
                if waiting is not None:  # else its caller gave up
                    settle(waiting, answer_of(answer.result))
        except Refused as refused:
            ended = refused
        finally:
            await answers.aclose()  # the gRPC call with it
            if self._call is call:
                self._call = None
            call.sending.put_nowait(None)
            ended = _not_taken(self, call, ended)
            left, call.waiting = call.waiting, {}
            for waiting in left.values():
                if not waiting.done():
                    waiting.set_exception(ended)
