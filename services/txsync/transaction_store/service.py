"""gRPC servicers of the transaction-store: ``ClientService`` and ``StoreInternalService``.

Thin: decode and check the request, call ``TransactionStore``, encode the answer. A
``Refusal`` of the store's rules becomes its gRPC status (``rpc.STATUS_OF_REFUSED``);
RESOURCE_EXHAUSTED carries the retry hint in the ``retry-after-ms`` trailing metadata.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from txsync.access import forwarded_credentials
from txsync.codec import base_to_proto, meta_to_proto
from txsync.protocol import TxState
from txsync.refusals import Refusal, Refused
from txsync.rpc import (
    REFUSALS,
    MalformedRequest,
    ServiceError,
    abort,
    answers_errors,
    check_request,
    decode_request,
    record_message_as_call,
    service_error,
)
from txsync.shares import Shares, caller_of
from txsync.telemetry import current_traceparent, work
from txsync.telemetry.tracing import new_trace_linked_to, tracing_configured
from txsync.transaction_store.dc_admin import DcAdmin, DcServices
from txsync.transaction_store.retention import Verdict
from txsync.transaction_store.state import Outcome, TxRecord
from txsync.transaction_store.step_wire import (
    adoption_from_proto,
    adoption_to_proto,
    changes_from_proto,
    protocol_state_to_proto,
    step_from_proto,
)
from txsync.transaction_store.store import (
    StagedStep,
    Submitted,
    TransactionStore,
)
from txsync.transaction_store.validation import (
    BATCH_SUBMITS_MAX,
    BODY_BYTES_MAX,
    READ_BODIES_BYTES_DEFAULT,
    STREAM_SUBMITS_MAX,
    check_idempotency_key,
    check_node_id_field,
    check_page_size,
    check_state,
    check_traceparent,
    check_tx_id,
    check_wait_seconds,
    invalid,
)
from txsync.v1 import (
    client_pb2,
    client_pb2_grpc,
    common_pb2,
    store_pb2,
    store_pb2_grpc,
)

STREAM_CHUNK_BYTES_MAX = 16 * 1024 * 1024
"""Bodies a ``SubmitStream`` holds before it hands them to the store."""
SUBMIT_STREAMS_MAX = 32
"""``SubmitStream`` calls open at once (each holds up to STREAM_CHUNK_BYTES_MAX: 512 MiB
at most in all); one caller may hold 24."""
SERVICE = client_pb2.DESCRIPTOR.services_by_name["ClientService"].full_name
SUBMIT_EACH_STREAMS_MAX = 1024
"""``SubmitEach`` calls open at once: one per client process (and DC) while it is open,
each idle but for the submits under way; a client refused one sends unary calls."""
SUBMIT_EACH_UNDER_WAY_MAX = 256
"""Submits of one ``SubmitEach`` stream under way at once; its reader waits beyond it
(a client sends no more at once than it has callers)."""
FOLLOW_BODY_BYTES_MAX = 4 * 1024 * 1024
"""Bodies per FollowEnqueued message: a batch over it is split (a body alone may be
BODY_BYTES_MAX, which still fits gRPC's MESSAGE_BYTES_MAX)."""
SUBMIT_BATCHES_STAGED = 1
"""``SubmitBatch`` calls decoded and staged at once; the rest wait, each as the bytes it
came as. Parsed, a 1,000-transaction batch is thousands of small objects, held by gRPC
for the whole call (its wait for ACCEPTED included): a bulk load from many callers held
all of theirs at once. One at a time loaded a 150k history as fast (2,679 against 2,642
transactions a second); the load's peak RSS did not move (docs/benchmarks.md, "Runs of
2026-12-02 12:45-13:47"): what it bounds is the batches a store holds parsed, whatever
the callers."""
PERSIST_STEPS_AHEAD_MAX = 64
"""Steps of one PersistSteps stream staged but not yet answered; the stream's reader
waits beyond it (the coordinator keeps fewer than this in flight)."""


def _submitted(result: Submitted) -> client_pb2.SubmitResponse:
    return client_pb2.SubmitResponse(
        tx_id=result.tx_id,
        created=result.created,
        state=common_pb2.TxState.ValueType(result.state.value),
        reached=True,
    )


def _wait_args(submit: client_pb2.SubmitRequest) -> tuple[TxState, float] | None:
    """What a submit asks to wait for, checked before anything is stored."""
    if not submit.wait_for:
        return None
    wanted = check_state(submit.wait_for, "wait_for")
    return wanted, check_wait_seconds(submit.wait_timeout.ToNanoseconds() / 1e9)


async def _waited(
    store: TransactionStore,
    responses: Sequence[client_pb2.SubmitResponse],
    wait: tuple[TxState, float],
    caller: str,
) -> None:
    """Fill each response with where its transaction is once it reached the state asked
    for, or the timeout ended (all of them waited on as one)."""
    answers = await store.wait_many(
        [response.tx_id for response in responses], *wait, caller=caller
    )
    for response, (record, reached) in zip(responses, answers, strict=True):
        state, outcome = _where(store, response.tx_id, record)
        response.reached = reached and state is not None
        if record is not None and record.position:
            response.position = record.position
        elif outcome is not None:
            response.position = outcome.position
        if state is not None:
            response.state = common_pb2.TxState.ValueType(state.value)
        if outcome is not None:
            _answer_outcome(store, outcome, response.outcome)


def _where(
    store: TransactionStore, tx_id: str, record: TxRecord | None
) -> tuple[TxState | None, Outcome | Verdict | None]:
    """A waited transaction's state and outcome: its record's, or once it is truncated,
    the verdict the store keeps for a while (``truncated_verdicts``)."""
    if record is not None:
        return record.state, record.outcome
    verdict = store.truncated_verdicts.get(tx_id)
    return (verdict.state, verdict) if verdict is not None else (None, None)


def _wait_answer(
    store: TransactionStore, tx_id: str, record: TxRecord | None, reached: bool
) -> client_pb2.WaitResponse:
    """Where a waited transaction is. Unknown here within the timeout: state UNSPECIFIED,
    never reached without one."""
    state, outcome = _where(store, tx_id, record)
    response = client_pb2.WaitResponse(reached=reached and state is not None)
    if state is not None:
        response.state = common_pb2.TxState.ValueType(state.value)
    if outcome is not None:
        _answer_outcome(store, outcome, response.outcome)
    return response


def _answer_outcome(
    store: TransactionStore, outcome: Outcome | Verdict, answer: common_pb2.Outcome
) -> None:
    """Write into ``answer`` what a client is told of ``outcome``, straight from the
    fields the store holds (no message built and copied per answer): a duplicate (a
    retry whose key an earlier transaction held) answers with the first one's rows
    affected and error, which its submitter is after, when this DC still holds them."""
    outcome.into(answer)
    if not outcome.duplicate_of:
        return
    first = store.state.tx(outcome.duplicate_of)
    if first is not None and first.outcome is not None:
        answer.rows_affected[:] = first.outcome.rows_affected
        answer.error = first.outcome.error or outcome.error


def _submit_args(
    submit: client_pb2.SubmitRequest, traceparent: str, *, one_of_many: bool = False
) -> tuple[common_pb2.TxBody, str, str]:
    """``traceparent``: the call's. The submit's own, if it has one, wins; else one of
    many submits of a call (``one_of_many``) gets a trace of its own, linked to the
    call's (when tracing is on): Jaeger shows each transaction, not a batch."""
    work.count(work.BODY_DECODES)  # gRPC parsed the body with its request
    key = check_idempotency_key(submit.idempotency_key)
    if submit.traceparent:
        traceparent = check_traceparent(submit.traceparent)
    elif one_of_many and traceparent and tracing_configured():
        traceparent = new_trace_linked_to("txsync.submit", traceparent)
    return (submit.body, key, traceparent)


def _refused_result(refused: ServiceError | Refusal) -> client_pb2.SubmitResult:
    """A submit refused in a call of many: ``"CODE_NAME: message"``."""
    error = service_error(refused)
    return client_pb2.SubmitResult(error=f"{error.code.name}: {error.message}")


def _results(results: list[Submitted | Refusal]) -> list[client_pb2.SubmitResult]:
    out = []
    for result in results:
        if isinstance(result, Refusal):
            out.append(_refused_result(result))
        else:
            out.append(client_pb2.SubmitResult(accepted=_submitted(result)))
    return out


def record_to_get_response(
    record: TxRecord, node_id: str, body: common_pb2.TxBody | None
) -> client_pb2.GetResponse:
    response = client_pb2.GetResponse(
        tx_id=record.tx_id,
        position=record.position,
        traceparent=record.traceparent,
    )
    if record.state is not None:
        response.state = common_pb2.TxState.ValueType(record.state.value)
    if record.meta is not None:
        response.meta.CopyFrom(meta_to_proto(record.meta))
    add, as_state = response.history.add, common_pb2.TxState.ValueType
    for state, at_unix_ms, service in record.history.fields():
        transition = add(state=as_state(state), service=service, node_id=node_id)
        transition.at.FromMilliseconds(at_unix_ms)
    if record.outcome is not None:
        record.outcome.into(response.outcome)
    if body is not None:
        response.body.CopyFrom(body)
    response.idempotency_key = record.idempotency_key or response.body.idempotency_key
    return response


def _page_token(seq: int) -> str:
    return base64.urlsafe_b64encode(f"seq:{seq}".encode()).decode()


def _after_seq(token: str) -> int:
    if not token:
        return 0
    try:
        text = base64.urlsafe_b64decode(token.encode()).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise invalid("page_token: not a token this service issued") from None
    prefix, _, number = text.partition(":")
    if prefix != "seq" or not number.isdigit():
        raise invalid("page_token: not a token this service issued")
    return int(number)


class ClientServicer(client_pb2_grpc.ClientServiceServicer):
    def __init__(self, store: TransactionStore, dc: DcAdmin | None = None) -> None:
        self._store = store
        self._dc = dc or DcAdmin(DcServices())
        self._staging = asyncio.Semaphore(SUBMIT_BATCHES_STAGED)
        self.streams = Shares(
            "submit streams", SUBMIT_STREAMS_MAX, retry_after_ms=store.config.retry_after_ms
        )
        self.each_streams = Shares(
            "SubmitEach streams", SUBMIT_EACH_STREAMS_MAX,
            retry_after_ms=store.config.retry_after_ms,
        )  # fmt: skip

    @answers_errors
    async def Submit(
        self, request: client_pb2.SubmitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> client_pb2.SubmitResponse:
        return await self._submit_one(
            _submit_args(request, _traceparent(context)), _wait_args(request), caller_of(context)
        )

    async def _submit_one(
        self,
        args: tuple[common_pb2.TxBody, str, str],
        wait: tuple[TxState, float] | None,
        caller: str,
    ) -> client_pb2.SubmitResponse:
        response = _submitted(await self._store.submit(*args))
        if wait is not None:
            await _waited(self._store, [response], wait, caller)
        return response

    async def SubmitEach(
        self,
        request_iterator: AsyncIterator[client_pb2.SubmitEachRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[client_pb2.SubmitEachResponse]:
        # A message is one Submit without a call of its own (docs/benchmarks.md, Tuning
        # 41). A client holds one such stream per DC for as long as it is open, so they
        # have a limit of their own, far above SubmitStream's bulk loads.
        caller = caller_of(context)
        try:
            self.each_streams.take(caller)
        except REFUSALS as refused:
            # Refused in the first message's answer, then ended: aborted at once, the
            # call raced the client's first write, and the client could see INTERNAL
            # instead, not knowing whether anything was taken.
            async for request in request_iterator:
                call_id = 0 if isinstance(request, MalformedRequest) else request.call_id
                yield client_pb2.SubmitEachResponse(
                    call_id=call_id, result=_refused_result(refused)
                )
                return
            return
        try:
            async for answer in self._answer_each(request_iterator, context, caller):
                yield answer
        finally:
            self.each_streams.give_back(caller)

    async def _answer_each(
        self,
        request_iterator: AsyncIterator[client_pb2.SubmitEachRequest],
        context: grpc.aio.ServicerContext[Any, Any],
        caller: str,
    ) -> AsyncIterator[client_pb2.SubmitEachResponse]:
        """Each submit runs as a task of its own, answered when it ends; the reader
        waits while ``SUBMIT_EACH_UNDER_WAY_MAX`` of them are under way. A malformed
        message ends the stream (INVALID_ARGUMENT): its call id cannot be trusted."""
        traceparent = _traceparent(context)
        answers: asyncio.Queue[client_pb2.SubmitEachResponse | None] = asyncio.Queue()
        room = asyncio.Semaphore(SUBMIT_EACH_UNDER_WAY_MAX)
        under_way: set[asyncio.Task[None]] = set()

        async def one(request: client_pb2.SubmitEachRequest) -> None:
            started = time.perf_counter()
            try:
                args = _submit_args(request.submit, traceparent, one_of_many=True)
                accepted = await self._submit_one(args, _wait_args(request.submit), caller)
                result, code = client_pb2.SubmitResult(accepted=accepted), "OK"
            except REFUSALS as refused:
                result, code = _refused_result(refused), service_error(refused).code.name
            finally:
                room.release()
            record_message_as_call(time.perf_counter() - started, SERVICE, "SubmitEach", code)
            answer = client_pb2.SubmitEachResponse(call_id=request.call_id, result=result)
            answers.put_nowait(answer)

        async def read() -> None:
            try:
                async for request in request_iterator:
                    check_request(request)
                    await room.acquire()
                    task = asyncio.create_task(one(request))
                    under_way.add(task)
                    task.add_done_callback(under_way.discard)
                if under_way:
                    await asyncio.wait(set(under_way))
            finally:
                answers.put_nowait(None)

        reading = asyncio.create_task(read())
        try:
            while (answer := await answers.get()) is not None:
                yield answer
            await reading  # a malformed message: its error
        except REFUSALS as error:
            await abort(context, error)
        finally:
            # The caller went away: its submits under way still end (each as a unary
            # Submit whose caller left: durable or refused), answered to no one.
            reading.cancel()

    @answers_errors
    async def SubmitBatch(
        self,
        request: client_pb2.SubmitBatchRequest | bytes,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> client_pb2.SubmitBatchResponse:
        # Served undecoded (``serve``): a batch waiting for its turn is one buffer, and
        # its bodies exist as objects only while it is staged, not while it waits for
        # ACCEPTED either.
        if self._staging.locked():
            work.count(work.SUBMIT_BATCHES_QUEUED)
        async with self._staging:
            if isinstance(request, bytes):
                request = decode_request(client_pb2.SubmitBatchRequest, request)
            if not 1 <= len(request.submits) <= BATCH_SUBMITS_MAX:
                raise invalid(f"submits: {len(request.submits)} is outside 1..{BATCH_SUBMITS_MAX}")
            traceparent = _traceparent(context)
            many = len(request.submits) > 1
            args = [_submit_args(s, traceparent, one_of_many=many) for s in request.submits]
            waits = [_wait_args(submit) for submit in request.submits]
            answer = client_pb2.SubmitBatchResponse(
                results=_results(await self._store.submit_many(args))
            )
            del request, args
        waiting: dict[tuple[TxState, float], list[client_pb2.SubmitResponse]] = {}
        for result, wait in zip(answer.results, waits, strict=True):
            if wait is not None and result.WhichOneof("result") == "accepted":
                waiting.setdefault(wait, []).append(result.accepted)
        # Submits of one batch ask alike as a rule: one wait for them all.
        await asyncio.gather(
            *(
                _waited(self._store, responses, wait, caller_of(context))
                for wait, responses in waiting.items()
            )
        )
        return answer

    async def SubmitStream(
        self,
        request_iterator: AsyncIterator[client_pb2.SubmitStreamRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> client_pb2.SubmitStreamResponse:
        # A stream holds at most STREAM_CHUNK_BYTES_MAX of bodies: a chunk goes to the
        # store once it has that many bytes (or BATCH_SUBMITS_MAX submits), and a body
        # too big to submit is answered at once and not kept. A chunk of 1,000 refused
        # 7.5 MB bodies once grew the store by 2.35 GB (issue 48).
        caller = caller_of(context)
        try:
            self.streams.take(caller)
        except REFUSALS as error:
            await abort(context, error)
        try:
            return await self._take_stream(request_iterator, context)
        finally:
            self.streams.give_back(caller)

    async def _take_stream(
        self,
        request_iterator: AsyncIterator[client_pb2.SubmitStreamRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> client_pb2.SubmitStreamResponse:
        results: list[Submitted | Refusal] = []
        chunk: list[tuple[common_pb2.TxBody, str, str]] = []
        chunk_bytes = count = 0
        traceparent = _traceparent(context)
        try:
            async for request in request_iterator:
                check_request(request)
                count += 1
                if count > STREAM_SUBMITS_MAX:
                    raise invalid(f"a stream carries at most {STREAM_SUBMITS_MAX} submits")
                if request.submit.wait_for:
                    raise invalid("submit.wait_for: a stream is answered once; Wait for a state")
                body_bytes = request.submit.body.ByteSize()
                too_big = body_bytes > BODY_BYTES_MAX
                if chunk and (too_big or chunk_bytes + body_bytes > STREAM_CHUNK_BYTES_MAX):
                    results.extend(await self._store.submit_many(chunk))  # in order
                    chunk, chunk_bytes = [], 0
                if too_big:
                    results.append(
                        invalid(f"body: {body_bytes} bytes encoded, more than {BODY_BYTES_MAX}")
                    )
                    continue
                chunk.append(_submit_args(request.submit, traceparent, one_of_many=True))
                chunk_bytes += body_bytes
                if len(chunk) == BATCH_SUBMITS_MAX:
                    results.extend(await self._store.submit_many(chunk))
                    chunk, chunk_bytes = [], 0
            if chunk:
                results.extend(await self._store.submit_many(chunk))
        except REFUSALS as error:
            await abort(context, error)
        return client_pb2.SubmitStreamResponse(results=_results(results))

    @answers_errors
    async def Get(
        self, request: client_pb2.GetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> client_pb2.GetResponse:
        if request.tx_id or not request.idempotency_key:
            record = self._store.get(request.tx_id)
        else:
            record = self._store.get_by_key(check_idempotency_key(request.idempotency_key))
        body = await self._store.read_body(record.tx_id) if request.include_body else None
        return record_to_get_response(record, self._store.config.node_id, body)

    @answers_errors
    async def Wait(
        self, request: client_pb2.WaitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> client_pb2.WaitResponse:
        check_tx_id(request.tx_id)
        wanted = check_state(request.state)
        seconds = check_wait_seconds(request.timeout.ToNanoseconds() / 1e9)
        ((record, reached),) = await self._store.wait_many(
            [request.tx_id], wanted, seconds, caller_of(context)
        )
        return _wait_answer(self._store, request.tx_id, record, reached)

    @answers_errors
    async def WaitBatch(
        self, request: client_pb2.WaitBatchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> client_pb2.WaitBatchResponse:
        if not 1 <= len(request.tx_ids) <= BATCH_SUBMITS_MAX:
            raise invalid(f"tx_ids: {len(request.tx_ids)} is outside 1..{BATCH_SUBMITS_MAX}")
        wanted = check_state(request.state)
        seconds = check_wait_seconds(request.timeout.ToNanoseconds() / 1e9)
        answers = await self._store.wait_many(request.tx_ids, wanted, seconds, caller_of(context))
        return client_pb2.WaitBatchResponse(
            results=[
                _wait_answer(self._store, tx_id, record, reached)
                for tx_id, (record, reached) in zip(request.tx_ids, answers, strict=True)
            ]
        )

    @answers_errors
    async def List(
        self, request: client_pb2.ListRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> client_pb2.ListResponse:
        state = check_state(request.state) if request.state else None
        page, last = self._store.list_page(
            state, check_page_size(request.page_size), _after_seq(request.page_token)
        )
        node_id = self._store.config.node_id
        return client_pb2.ListResponse(
            transactions=[record_to_get_response(r, node_id, None) for r in page],
            next_page_token=_page_token(last) if last is not None else "",
        )

    @answers_errors
    async def Query(
        self, request: client_pb2.QueryRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> client_pb2.QueryResponse:
        """A read on one of this DC's workers. ``after_tx_id`` becomes the synced position
        when this store knows it (any worker can then wait for it)."""
        after_position, after_tx_id = request.after_position, request.after_tx_id
        if after_tx_id:
            # Not known here yet (submitted at another DC): the worker waits for the id
            # (and for the position as well).
            record = self._store.state.tx(check_tx_id(after_tx_id, "after_tx_id"))
            if (
                record is not None
                and record.state is not None
                and (record.state >= TxState.ACCEPTED)
            ):
                after_position, after_tx_id = max(after_position, record.position), ""
        if len(request.worker_id) > WORKER_ID_CHARS_MAX:
            raise invalid(f"worker_id: longer than {WORKER_ID_CHARS_MAX} characters")
        if self._dc.services.dispatch is None:
            raise Refusal(
                Refused.PRECONDITION,
                "this transaction-store has no worker-dispatch (--dispatch) to read through",
            )
        return await self._dc.query(
            request, after_position, after_tx_id, forwarded_credentials(context)
        )


WORKER_ID_CHARS_MAX = 63


def _traceparent(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """Where the transaction's trace starts: the submit call's own span (the gRPC
    instrumentation made it, a child of the client's context if it sent one). With
    tracing off, the client's traceparent as given."""
    current = current_traceparent()
    if current:
        return check_traceparent(current)
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent" and isinstance(value, str):
            return check_traceparent(value)
    return ""


class StoreInternalServicer(store_pb2_grpc.StoreInternalServiceServicer):
    def __init__(self, store: TransactionStore) -> None:
        self._store = store

    @answers_errors
    async def LoadProtocolState(
        self,
        request: store_pb2.LoadProtocolStateRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> store_pb2.LoadProtocolStateResponse:
        # 0 from a coordinator of an earlier release: its epoch bounds nothing, and the
        # next one keeps every open stamp, as that release did (``_settle_at_epoch``).
        loaded = await self._store.load_protocol_state(request.local_admit_txs_max)
        answer = protocol_state_to_proto(self._store.state.node_id, loaded)
        answer.dispatch_address = self._store.config.dispatch_address
        return answer

    async def PersistSteps(
        self,
        request_iterator: AsyncIterator[store_pb2.PersistStepsRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[store_pb2.PersistStepsResponse]:
        """Steps are staged in the order they arrive (a task of their own, up to
        PERSIST_STEPS_AHEAD_MAX ahead of the answers) and answered in that order once
        durable; the first refused step's error ends the stream after the answers of
        every step before it."""
        staged: asyncio.Queue[StagedStep | ServiceError | Refusal | None] = asyncio.Queue(
            PERSIST_STEPS_AHEAD_MAX
        )
        adoptions = self._store.adoptions

        async def stage_in_order() -> None:
            try:
                async for request in request_iterator:
                    check_request(request)
                    if self._store.adoptions != adoptions:
                        raise Refusal(
                            Refused.PRECONDITION,
                            "the store adopted another DC's copy since this stream opened: "
                            "its coordinator restarts onto it (LoadProtocolState)",
                        )
                    await staged.put(await self._stage_step(request.step))
            except REFUSALS as error:
                await staged.put(error)
                return
            await staged.put(None)

        stager = asyncio.get_running_loop().create_task(stage_in_order())
        try:
            while (step := await staged.get()) is not None:
                if isinstance(step, REFUSALS):
                    await abort(context, step)
                    return
                try:
                    base = await self._store.finish_step(step)
                except REFUSALS as error:
                    await abort(context, error)
                    return
                yield store_pb2.PersistStepsResponse(merge_base=base_to_proto(base))
        finally:
            stager.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stager

    async def _stage_step(self, request: store_pb2.PersistStepRequest) -> StagedStep:
        check_request(request)
        return await self._store.stage_step(step_from_proto(request))

    @answers_errors
    async def ReadBodies(
        self, request: store_pb2.ReadBodiesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> store_pb2.ReadBodiesResponse:
        held, unread = await self._store.read_bodies(
            list(request.tx_ids), request.bytes_max or READ_BODIES_BYTES_DEFAULT
        )
        return store_pb2.ReadBodiesResponse(
            unread=unread,
            bodies=[
                store_pb2.HeldBody(
                    tx_id=tx_id,
                    body=body,
                    digest=record.body_digest,
                    traceparent=record.traceparent,
                )
                for tx_id, body, record in held
            ],
        )

    @answers_errors
    async def ReadBody(
        self, request: store_pb2.ReadBodyRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> store_pb2.ReadBodyResponse:
        held, _ = await self._store.read_bodies([request.tx_id])
        if not held:
            raise Refusal(Refused.NOT_FOUND, f"no body of {request.tx_id} held here")
        _, body, record = held[0]
        return store_pb2.ReadBodyResponse(
            body=body, digest=record.body_digest, traceparent=record.traceparent
        )

    @answers_errors
    async def ReadSynced(
        self, request: store_pb2.ReadSyncedRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> store_pb2.ReadSyncedResponse:
        start, entries = self._store.read_synced(request.from_len, request.count_max)
        return store_pb2.ReadSyncedResponse(
            start=base_to_proto(start), entries=[meta_to_proto(m) for m in entries]
        )

    async def FollowEnqueued(
        self,
        request: store_pb2.FollowEnqueuedRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[store_pb2.FollowEnqueuedResponse]:
        store = self._store
        try:
            check_request(request)
            # Headers at once, not with the first transactions (which may be hours away):
            # a follower then knows its stream is open, and so does a test that leaves it.
            await context.send_initial_metadata(())
            async for ready in store.follow_enqueued(
                request.from_position,
                membership_only=request.membership_only,
                finished_only=request.finished_only,
                from_first_unfinished=request.from_first_unfinished,
                gather_s=request.gather_ms / 1000,
                skip_truncated=request.skip_truncated,
            ):
                response = store_pb2.FollowEnqueuedResponse()
                body_bytes = 0
                for position, record in ready:
                    body = b""
                    if not request.finished_only:
                        body = await store.read_encoded_body(record.tx_id) or b""
                    if response.txs and body_bytes + len(body) > FOLLOW_BODY_BYTES_MAX:
                        yield response
                        response, body_bytes = store_pb2.FollowEnqueuedResponse(), 0
                    body_bytes += len(body)
                    state = record.state
                    tx = response.txs.add(
                        position=position,
                        traceparent=record.traceparent,
                        state=common_pb2.TxState.ValueType(state.value if state else 0),
                        body=body,
                    )
                    if record.outcome is not None:
                        record.outcome.into(tx.outcome)
                    if record.meta is not None:
                        tx.meta.CopyFrom(meta_to_proto(record.meta))
                yield response
        except REFUSALS as error:
            await abort(context, error)

    async def AdvanceStatesStream(
        self,
        request_iterator: AsyncIterator[store_pb2.AdvanceStatesStreamRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[store_pb2.AdvanceStatesStreamResponse]:
        """Each request's state changes applied in arrival order, each answered once
        durable; the first refused request ends the stream with its status."""
        try:
            async for request in request_iterator:
                check_request(request)
                await self._advance_states(request.batch)
                yield store_pb2.AdvanceStatesStreamResponse()
        except REFUSALS as error:
            await abort(context, error)

    async def _advance_states(self, request: store_pb2.AdvanceStatesRequest) -> None:
        await self._store.advance_states(
            changes_from_proto(request.changes), request.service or "worker-dispatch"
        )

    async def WatchLocalSubmits(
        self,
        request: store_pb2.WatchLocalSubmitsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[store_pb2.WatchLocalSubmitsResponse]:
        if isinstance(request, MalformedRequest):
            await abort(context, request.as_error())
        try:
            async for submits in self._store.watch_local_submits():
                response = store_pb2.WatchLocalSubmitsResponse()
                for submit in submits:
                    response.submits.add(
                        tx_id=submit.tx_id,
                        body=submit.body,
                        digest=submit.digest,
                        traceparent=submit.traceparent,
                        ts=submit.ts,
                        local_seq=submit.local_seq,
                    )
                yield response
        except REFUSALS as error:
            await abort(context, error)

    @answers_errors
    async def ExportBase(
        self, request: store_pb2.ExportBaseRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> store_pb2.ExportBaseResponse:
        if request.final_state not in (common_pb2.TX_STATE_OK, common_pb2.TX_STATE_FAILED):
            raise invalid("final_state: TX_STATE_OK or TX_STATE_FAILED")
        adoption = self._store.export_base(
            request.position,
            TxState(request.final_state),
            check_node_id_field(request.adopter, "adopter"),
            request.adopter_len,
        )
        return store_pb2.ExportBaseResponse(adoption=adoption_to_proto(adoption))

    @answers_errors
    async def AdoptBase(
        self, request: store_pb2.AdoptBaseRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> store_pb2.AdoptBaseResponse:
        synced_len = await self._store.adopt_base(adoption_from_proto(request.adoption))
        return store_pb2.AdoptBaseResponse(synced_len=synced_len)

    @answers_errors
    async def ReportProgress(
        self, request: store_pb2.ReportProgressRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> store_pb2.ReportProgressResponse:
        if len(request.peer_synced_len) > 16:
            raise invalid("peer_synced_len: at most 16 peers")
        if len(request.peer_ordered_len) > 16:
            raise invalid("peer_ordered_len: at most 16 peers")
        if len(request.peer_posted_len) > 16:
            raise invalid("peer_posted_len: at most 16 peers")
        workers = request.workers_min_position if request.HasField("workers_min_position") else None
        store = self._store
        core = request.core_history_len if request.HasField("core_history_len") else None
        truncatable = store.report_progress(
            dict(request.peer_synced_len),
            workers,
            peers_reported=request.peers_reported,
            core_history_len=core,
            peers_ordered=dict(request.peer_ordered_len),
            peers_posted=dict(request.peer_posted_len),
        )
        held = store.bodies_held_durably_len()
        store.missing_body_alarm(held)  # observed each second: the alarm counts from here
        return store_pb2.ReportProgressResponse(
            truncatable_below=truncatable,
            history_from=store.state.history_len + 1,
            bodies_held_len=held,
            peers_ordered=store.state.peers_ordered,
        )
