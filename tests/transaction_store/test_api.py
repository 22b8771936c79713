"""The transaction-store's gRPC APIs, against the real server process."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.support.clients import list_tx_ids
from tests.support.metrics import sample, scrape
from tests.support.processes import ServiceProcess, free_port, health_status, transaction_store
from tests.support.store_stream import advance
from tests.support.waiting import wait_until
from txsync.transaction_store.txlog.bodies import BodyStore, body_digest
from txsync.transaction_store.txlog.framing import scan
from txsync.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    client_pb2,
    client_pb2_grpc,
    common_pb2,
    store_pb2,
    store_pb2_grpc,
)


def _body(value: int = 1) -> common_pb2.TxBody:
    return common_pb2.TxBody(
        statements=[
            common_pb2.Statement(
                sql="INSERT INTO t (v) VALUES (?)", params=[common_pb2.SqlValue(int_value=value)]
            )
        ]
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    process = transaction_store(tmp_path_factory.mktemp("store"), "dc1", "--incoming-max", "5000")
    process.start()
    yield process
    assert process.terminate() == 0, process.log()


@pytest.fixture
def client(server: ServiceProcess) -> Iterator[client_pb2_grpc.ClientServiceStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield client_pb2_grpc.ClientServiceStub(channel)


@pytest.fixture
def internal(server: ServiceProcess) -> Iterator[store_pb2_grpc.StoreInternalServiceStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield store_pb2_grpc.StoreInternalServiceStub(channel)


def _persist(
    internal: store_pb2_grpc.StoreInternalServiceStub, step: store_pb2.PersistStepRequest
) -> store_pb2.PersistStepsResponse:
    """One protocol step on PersistSteps, as the coordinator sends it: answered once
    durable (or refused with the stream's status)."""
    (answer,) = internal.PersistSteps(iter([store_pb2.PersistStepsRequest(step=step)]), timeout=30)
    return answer


def _code(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()  # type: ignore[operator]
    error: grpc.Call = caught.value  # type: ignore[assignment]
    return error.code(), error.details() or ""


def test_bad_client_input_gets_a_clear_status_and_changes_nothing(
    client: client_pb2_grpc.ClientServiceStub,
) -> None:
    before = client.List(client_pb2.ListRequest(page_size=1000))
    huge = common_pb2.TxBody(statements=[common_pb2.Statement(sql="x" * 70_000)])
    too_many = common_pb2.TxBody(statements=[common_pb2.Statement(sql="SELECT 1")] * 1001)
    cases = [
        (lambda: client.Submit(client_pb2.SubmitRequest(body=common_pb2.TxBody())),
         "at least one statement"),
        (lambda: client.Submit(client_pb2.SubmitRequest(body=huge)), "more than 65536"),
        (lambda: client.Submit(client_pb2.SubmitRequest(body=too_many)), "more than 1000"),
        (lambda: client.Submit(client_pb2.SubmitRequest(body=_body(), idempotency_key="k" * 129)),
         "idempotency_key"),
        (lambda: client.Get(client_pb2.GetRequest(tx_id="00ac16d7")), "is not a UUID"),
        (lambda: client.List(client_pb2.ListRequest(state=common_pb2.TxState.ValueType(42))),
         "42 is not a transaction state"),
        (lambda: client.List(client_pb2.ListRequest(page_token="garbage!")), "page_token"),
        (lambda: client.List(client_pb2.ListRequest(page_size=5000)), "more than 1000"),
        (lambda: client.SubmitBatch(client_pb2.SubmitBatchRequest()), "outside 1..1000"),
        (lambda: client.Submit(client_pb2.SubmitRequest(
            body=_body(), wait_for=common_pb2.TxState.ValueType(42))), "wait_for: 42"),
        (lambda: client.Submit(client_pb2.SubmitRequest(
            body=_body(), wait_for=common_pb2.TX_STATE_OK,
            wait_timeout=duration_pb2.Duration(seconds=3600))), "more than 600"),
        (lambda: client.SubmitBatch(client_pb2.SubmitBatchRequest(submits=[
            client_pb2.SubmitRequest(body=_body()),
            client_pb2.SubmitRequest(body=_body(), wait_for=common_pb2.TxState.ValueType(9))])),
         "wait_for: 9"),
        (lambda: client.SubmitStream(iter([client_pb2.SubmitStreamRequest(submit=(
            client_pb2.SubmitRequest(body=_body(), wait_for=common_pb2.TX_STATE_OK)))])),
         "a stream is answered once"),
    ]  # fmt: skip
    for call, text in cases:
        code, details = _code(call)
        assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        assert text in details, details
    code, _ = _code(lambda: client.Get(client_pb2.GetRequest(tx_id=str(uuid.uuid4()))))
    assert code is grpc.StatusCode.NOT_FOUND
    after = client.List(client_pb2.ListRequest(page_size=1000))
    assert len(after.transactions) == len(before.transactions)


def test_oversized_message_is_refused(client: client_pb2_grpc.ClientServiceStub) -> None:
    blob = common_pb2.SqlValue(blob_value=b"x" * (9 * 1024 * 1024))
    body = common_pb2.TxBody(statements=[common_pb2.Statement(sql="INSERT", params=[blob])])
    code, _ = _code(lambda: client.Submit(client_pb2.SubmitRequest(body=body)))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED  # gRPC's own 8 MiB message cap


def test_bad_internal_input_gets_a_clear_status(
    internal: store_pb2_grpc.StoreInternalServiceStub, client: client_pb2_grpc.ClientServiceStub
) -> None:
    tx_id = client.Submit(client_pb2.SubmitRequest(body=_body())).tx_id
    encoded = _body().SerializeToString()
    cases = [
        (lambda: _persist(internal, store_pb2.PersistStepRequest(bodies=[
            store_pb2.StoreBodyRequest(tx_id=str(uuid.uuid4()), body=encoded, digest=b"bad")])),
         grpc.StatusCode.DATA_LOSS),
        (lambda: internal.ReadBody(store_pb2.ReadBodyRequest(tx_id=str(uuid.uuid4()))),
         grpc.StatusCode.NOT_FOUND),
        (lambda: internal.ReadSynced(store_pb2.ReadSyncedRequest(from_len=10**6, count_max=5)),
         grpc.StatusCode.OUT_OF_RANGE),
        (lambda: internal.ReadSynced(store_pb2.ReadSyncedRequest(count_max=5000)),
         grpc.StatusCode.INVALID_ARGUMENT),
        (lambda: _persist(internal, store_pb2.PersistStepRequest(
            synced_start=common_pb2.MergeBase(synced_len=7, last_tx_id=tx_id),
            synced=[common_pb2.TxMeta(ts=1, tx_id=tx_id, origin="dc1")])),
         grpc.StatusCode.FAILED_PRECONDITION),
        (lambda: _persist(internal, store_pb2.PersistStepRequest(
            incoming=[common_pb2.TxMeta(ts=0, tx_id=tx_id, origin="dc1")])),
         grpc.StatusCode.INVALID_ARGUMENT),
        (lambda: advance(internal, store_pb2.AdvanceStatesRequest(changes=[
            store_pb2.StateChange(tx_id=tx_id, state=common_pb2.TX_STATE_OK)])),
         grpc.StatusCode.FAILED_PRECONDITION),
        (lambda: advance(internal, store_pb2.AdvanceStatesRequest(changes=[
            store_pb2.StateChange(tx_id=tx_id, state=common_pb2.TX_STATE_ACCEPTED)])),
         grpc.StatusCode.INVALID_ARGUMENT),
    ]  # fmt: skip
    for call, expected in cases:
        code, details = _code(call)
        assert code is expected, (code, details)
        assert details
    got = client.Get(client_pb2.GetRequest(tx_id=tx_id))
    assert got.state == common_pb2.TX_STATE_INCOMING and len(got.history) == 1


def test_bodies_travel_between_dcs_with_their_digest(
    internal: store_pb2_grpc.StoreInternalServiceStub,
) -> None:
    tx_id = str(uuid.uuid4())
    encoded = _body(7).SerializeToString()
    pushed = store_pb2.StoreBodyRequest(tx_id=tx_id, body=encoded, digest=body_digest(encoded))
    _persist(internal, store_pb2.PersistStepRequest(bodies=[pushed]))
    read = internal.ReadBody(store_pb2.ReadBodyRequest(tx_id=tx_id))
    assert read.body == encoded and read.digest == body_digest(encoded)


def test_a_body_file_without_its_record_is_not_held(
    server: ServiceProcess, internal: store_pb2_grpc.StoreInternalServiceStub
) -> None:
    """Only the txlog's record makes a body held: a file alone (left by a crash, or
    put there by hand) must not, or a coordinator would mark the body acquired and
    order a transaction the store cannot enqueue (a coordinator died of this under
    load once, when files were written before their records)."""
    tx_id = str(uuid.uuid4())
    _persist(internal, store_pb2.PersistStepRequest(
        incoming=[common_pb2.TxMeta(ts=1000, tx_id=tx_id, origin="dc2")]))  # fmt: skip
    BodyStore(server.workdir / "txlog" / "transactions").write(tx_id, _body(3).SerializeToString())
    code, _ = _code(lambda: internal.ReadBody(store_pb2.ReadBodyRequest(tx_id=tx_id)))
    assert code is grpc.StatusCode.NOT_FOUND
    read = internal.ReadBodies(store_pb2.ReadBodiesRequest(tx_ids=[tx_id]))
    assert not read.bodies


def test_pipelined_steps_apply_in_order_and_a_refused_one_ends_the_stream(
    client: client_pb2_grpc.ClientServiceStub, internal: store_pb2_grpc.StoreInternalServiceStub
) -> None:
    """PersistSteps: the coordinator sends steps without waiting for each to be durable.
    They are checked in the order sent (the second extends what the first staged), each is
    answered once durable, and the first refused one ends the stream: nothing after it."""
    base = _persist(internal, store_pb2.PersistStepRequest()).merge_base
    first, second = (str(uuid.uuid4()) for _ in range(2))
    meta = common_pb2.TxMeta(ts=2 * 10**6, tx_id=first, origin="dc2")
    later = common_pb2.TxMeta(ts=2 * 10**6 + 1, tx_id=second, origin="dc2")
    steps = [
        store_pb2.PersistStepRequest(counter=2 * 10**6, incoming=[meta]),
        store_pb2.PersistStepRequest(synced_start=base, synced=[meta], state_changes=[
            store_pb2.StateChange(tx_id=first, state=common_pb2.TX_STATE_INCOMING),
            store_pb2.StateChange(tx_id=first, state=common_pb2.TX_STATE_ACCEPTED)]),
        store_pb2.PersistStepRequest(synced_start=base, synced=[later]),  # a stale base
        store_pb2.PersistStepRequest(incoming=[later]),
    ]  # fmt: skip
    answers: list[store_pb2.PersistStepsResponse] = []
    requests = (store_pb2.PersistStepsRequest(step=step) for step in steps)
    with pytest.raises(grpc.RpcError) as refused:
        for answer in internal.PersistSteps(requests):
            answers.append(answer)
    assert [a.merge_base.synced_len for a in answers] == [base.synced_len, base.synced_len + 1]
    assert answers[1].merge_base.last_tx_id == first
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "does not extend the merge base" in (refused.value.details() or "")
    got = client.Get(client_pb2.GetRequest(tx_id=first))
    assert got.state == common_pb2.TX_STATE_ACCEPTED and got.position == base.synced_len + 1
    code, _ = _code(lambda: client.Get(client_pb2.GetRequest(tx_id=second)))
    assert code is grpc.StatusCode.NOT_FOUND  # the step after the refused one never ran


def test_pushed_bodies_are_stored_with_a_step_and_read_many_at_once(
    internal: store_pb2_grpc.StoreInternalServiceStub,
) -> None:
    """Bodies peers pushed ride in the protocol step that acquires them: stored with its
    fsync, one held already skipped; a forged one fails the whole step, which stores
    none of its bodies (the coordinator checks each body before it steps it)."""
    good = [(str(uuid.uuid4()), _body(n).SerializeToString()) for n in range(3)]

    def pushed(tx_id: str, encoded: bytes, digest: bytes) -> store_pb2.StoreBodyRequest:
        return store_pb2.StoreBodyRequest(tx_id=tx_id, body=encoded, digest=digest)

    held = [pushed(t, e, body_digest(e)) for t, e in good]
    _persist(internal, store_pb2.PersistStepRequest(bodies=held))
    _persist(internal, store_pb2.PersistStepRequest(bodies=held))  # held: skipped
    forged, fresh = str(uuid.uuid4()), str(uuid.uuid4())
    code, details = _code(lambda: _persist(internal, store_pb2.PersistStepRequest(bodies=[
        pushed(fresh, good[0][1], body_digest(good[0][1])),
        pushed(forged, good[0][1], b"bad")])))  # fmt: skip
    assert code is grpc.StatusCode.DATA_LOSS and "digest" in details
    read = internal.ReadBodies(store_pb2.ReadBodiesRequest(tx_ids=[fresh, forged]))
    assert not read.bodies, "a refused step stores nothing"

    unknown = str(uuid.uuid4())
    read = internal.ReadBodies(store_pb2.ReadBodiesRequest(tx_ids=[*(t for t, _ in good), unknown]))
    assert [(b.tx_id, b.body, b.digest) for b in read.bodies] == [
        (t, e, body_digest(e)) for t, e in good
    ]
    code, details = _code(lambda: internal.ReadBodies(
        store_pb2.ReadBodiesRequest(tx_ids=[unknown] * 257)))  # fmt: skip
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "256" in details

    # An answer's bodies stop at bytes_max (the first whatever its size); the held ones
    # left out are named, so the caller asks again (what the coordinators' pushes and
    # GetBodies do: 256 bodies of 4 MiB would not fit gRPC's 8 MiB).
    ids = [t for t, _ in good]
    first_only = internal.ReadBodies(
        store_pb2.ReadBodiesRequest(tx_ids=[unknown, *ids], bytes_max=1)
    )
    assert [b.tx_id for b in first_only.bodies] == ids[:1]
    assert list(first_only.unread) == ids[1:]


def test_many_clients_single_and_batched_submits(
    server: ServiceProcess, client: client_pb2_grpc.ClientServiceStub
) -> None:
    before = set(list_tx_ids(client))
    acknowledged: list[str] = []
    lock = threading.Lock()

    def single(worker: int) -> None:
        with grpc.insecure_channel(server.address) as channel:
            stub = client_pb2_grpc.ClientServiceStub(channel)
            for n in range(40):
                key = f"single-{worker}-{n}"
                tx_id = stub.Submit(client_pb2.SubmitRequest(body=_body(n), idempotency_key=key))
                with lock:
                    acknowledged.append(tx_id.tx_id)

    def batched(worker: int) -> None:
        with grpc.insecure_channel(server.address) as channel:
            stub = client_pb2_grpc.ClientServiceStub(channel)
            for n in range(8):
                request = client_pb2.SubmitBatchRequest(
                    submits=[
                        client_pb2.SubmitRequest(body=_body(i), idempotency_key=f"{worker}-{n}-{i}")
                        for i in range(25)
                    ]
                )
                results = stub.SubmitBatch(request).results
                with lock:
                    acknowledged.extend(r.accepted.tx_id for r in results)

    threads = [threading.Thread(target=single, args=(w,)) for w in range(8)]
    threads += [threading.Thread(target=batched, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(acknowledged) == 8 * 40 + 4 * 8 * 25
    assert len(set(acknowledged)) == len(acknowledged)
    listed = [tx for tx in list_tx_ids(client) if tx not in before]
    assert sorted(listed) == sorted(acknowledged)  # each exactly once


def test_batches_sent_at_once_are_decoded_by_the_store_one_by_one(tmp_path: Path) -> None:
    """Six callers send a 500-transaction batch each at once to a store process: each
    is decoded by the store's handler, in its turn (the turns themselves are shown in
    ``test_store_rules``, with the writes held), and every transaction is taken
    exactly once."""
    metrics = f"127.0.0.1:{free_port()}"
    store = transaction_store(tmp_path / "store", "dc1", "--metrics-listen", metrics)
    store.start()
    try:
        callers, size = 6, 500
        started = threading.Barrier(callers)
        answered: list[list[client_pb2.SubmitResult]] = []
        lock = threading.Lock()

        def caller(n: int) -> None:
            request = client_pb2.SubmitBatchRequest(submits=[
                client_pb2.SubmitRequest(body=_body(i), idempotency_key=f"staged-{n}-{i}")
                for i in range(size)
            ])  # fmt: skip
            with grpc.insecure_channel(store.address) as channel:
                stub = client_pb2_grpc.ClientServiceStub(channel)
                started.wait()
                results = list(stub.SubmitBatch(request, timeout=120).results)
            with lock:
                answered.append(results)

        threads = [threading.Thread(target=caller, args=(n,)) for n in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        tx_ids = [r.accepted.tx_id for results in answered for r in results]
        assert len(answered) == callers and all(tx_ids)
        assert len(set(tx_ids)) == callers * size
        text = scrape(metrics)
        assert sample(text, "txsync_work_total", kind="requests_decoded_late") == callers
    finally:
        assert store.terminate() == 0, store.log()


def test_the_log_rotates_by_entries_too_so_a_start_replays_few(tmp_path: Path) -> None:
    """Small entries fill the bytes bound late (16 MiB of state changes were 106,355
    entries, 2 s to start): past ``--log-file-entries-max`` entries appended the file
    rotates as well, and a start replays its snapshot, not the entries before it."""
    store = transaction_store(tmp_path / "store", "dc1", "--log-file-entries-max", "300")
    store.start()
    try:
        with grpc.insecure_channel(store.address) as channel:
            stub = client_pb2_grpc.ClientServiceStub(channel)
            for n in range(4):  # an entry each: the fourth batch passes the bound
                stub.SubmitBatch(client_pb2.SubmitBatchRequest(submits=[
                    client_pb2.SubmitRequest(body=_body(n * 100 + i)) for i in range(100)
                ]), timeout=60)  # fmt: skip
        wait_until("a rotation paced by entries", lambda: "txlog rotated" in store.log(), 120)
        assert store.terminate() == 0, store.log()
        store.start()
        recovered = [line for line in store.log().splitlines() if "txlog recovered" in line]
        assert "(0 since the snapshot)" in recovered[-1], recovered
        with grpc.insecure_channel(store.address) as channel:
            assert len(list_tx_ids(client_pb2_grpc.ClientServiceStub(channel))) == 400
    finally:
        assert store.terminate() == 0, store.log()


def test_a_submit_waits_for_the_state_asked_in_the_same_call(
    client: client_pb2_grpc.ClientServiceStub, internal: store_pb2_grpc.StoreInternalServiceStub
) -> None:
    """No coordinator runs beside this store: a submit that waits for ACCEPTED is answered
    at its timeout, or once the test, in the coordinator's place, persists it as ordered."""
    short = duration_pb2.Duration(nanos=200_000_000)
    timed_out = client.Submit(client_pb2.SubmitRequest(
        body=_body(), wait_for=common_pb2.TX_STATE_ACCEPTED, wait_timeout=short))  # fmt: skip
    assert timed_out.tx_id and timed_out.created
    assert not timed_out.reached and timed_out.state == common_pb2.TX_STATE_INCOMING

    batch = client.SubmitBatch(client_pb2.SubmitBatchRequest(submits=[
        client_pb2.SubmitRequest(body=_body(1)),
        client_pb2.SubmitRequest(body=_body(2), wait_for=common_pb2.TX_STATE_INCOMING),
        client_pb2.SubmitRequest(body=_body(3), wait_for=common_pb2.TX_STATE_ACCEPTED,
                                 wait_timeout=short),
    ])).results  # fmt: skip
    assert [r.accepted.reached for r in batch] == [True, True, False]

    before = set(list_tx_ids(client))
    answers: list[client_pb2.SubmitResponse] = []
    waiting = threading.Thread(target=lambda: answers.append(client.Submit(
        client_pb2.SubmitRequest(body=_body(4), wait_for=common_pb2.TX_STATE_ACCEPTED,
                                 wait_timeout=duration_pb2.Duration(seconds=20)))))  # fmt: skip
    waiting.start()
    new: list[str] = []
    for _ in range(200):
        new = [tx for tx in list_tx_ids(client) if tx not in before]
        if new:
            break
        waiting.join(0.05)
    assert len(new) == 1 and not answers  # durable, and still waiting
    base = _persist(internal, store_pb2.PersistStepRequest()).merge_base
    meta = common_pb2.TxMeta(ts=10**6, tx_id=new[0], origin="dc1")
    _persist(internal, store_pb2.PersistStepRequest(
        incoming=[meta], synced_start=base, synced=[meta],
        state_changes=[store_pb2.StateChange(tx_id=new[0],
                                             state=common_pb2.TX_STATE_ACCEPTED)]))  # fmt: skip
    waiting.join(10)
    # A local submit holds its body, so the synced append makes it ENQUEUED at once
    # (past the ACCEPTED waited for).
    assert [(a.tx_id, a.reached, a.state) for a in answers] == [
        (new[0], True, common_pb2.TX_STATE_ENQUEUED)
    ]


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_stream_of_refused_bodies_is_answered_and_not_held(
    server: ServiceProcess, client: client_pb2_grpc.ClientServiceStub
) -> None:
    """Bodies too big to submit are answered in their place and dropped at once; the
    others reach the store in chunks of bounded bytes. Held until the stream's end, 60
    bodies of 6 MB grew the store by their 360 MB (issue 48: 300 of them, 2.35 GB)."""
    assert server.process is not None
    before = _rss_mib(server.process.pid)
    big = common_pb2.TxBody(
        statements=[common_pb2.Statement(sql="SELECT '" + "x" * 6_000_000 + "'")]
    )
    requests = [
        client_pb2.SubmitStreamRequest(submit=client_pb2.SubmitRequest(body=_body(1))),
        *(
            client_pb2.SubmitStreamRequest(submit=client_pb2.SubmitRequest(body=big))
            for _ in range(60)
        ),
        client_pb2.SubmitStreamRequest(submit=client_pb2.SubmitRequest(body=_body(2))),
    ]
    results = client.SubmitStream(iter(requests), timeout=120).results
    assert [r.HasField("accepted") for r in results] == [True, *[False] * 60, True]
    assert all("more than 4194304" in r.error for r in results[1:-1]), results[1]
    grown = _rss_mib(server.process.pid) - before
    assert grown < 150, f"the store grew by {grown:.0f} MiB"


def _each(call_id: int, body: common_pb2.TxBody, **submit: Any) -> client_pb2.SubmitEachRequest:
    request = client_pb2.SubmitRequest(body=body, **submit)
    return client_pb2.SubmitEachRequest(call_id=call_id, submit=request)


def test_submit_each_answers_every_message_on_its_own_by_call_id(
    client: client_pb2_grpc.ClientServiceStub,
) -> None:
    """Each message of a ``SubmitEach`` stream is a ``Submit``: answered by its call id,
    refused on its own (the stream goes on), idempotent by key as a unary submit is."""
    key = f"each-{uuid.uuid4()}"
    requests = [
        _each(1, _body(1), idempotency_key=key),
        _each(2, _body(2), idempotency_key="k" * 129),  # refused: the key is too long
        _each(3, _body(1), idempotency_key=key),  # a retry: the first one's transaction
        *(_each(n, _body(n)) for n in range(4, 301)),
    ]
    answers = {a.call_id: a.result for a in client.SubmitEach(iter(requests), timeout=120)}
    assert sorted(answers) == list(range(1, 301))
    assert answers[2].error.startswith("INVALID_ARGUMENT: idempotency_key"), answers[2]
    first, again = answers[1].accepted, answers[3].accepted
    assert (first.created, again.created, again.tx_id) == (True, False, first.tx_id)
    accepted = [answers[n].accepted for n in range(4, 301)]
    assert len({a.tx_id for a in accepted}) == 297
    assert all(a.state == common_pb2.TX_STATE_INCOMING for a in accepted)
    got = client.Get(client_pb2.GetRequest(tx_id=accepted[-1].tx_id))
    assert got.state == common_pb2.TX_STATE_INCOMING


def test_submit_each_reads_no_further_while_its_limit_is_under_way(
    client: client_pb2_grpc.ClientServiceStub,
) -> None:
    """At most ``SUBMIT_EACH_UNDER_WAY_MAX`` (256) submits of a stream are under way: 256
    that wait for a state this store alone never reaches hold the stream, and the 257th,
    which waits for nothing, is answered only after one of them."""
    waiting = {"wait_for": common_pb2.TX_STATE_ACCEPTED}
    requests = [
        *(
            _each(n, _body(n), wait_timeout=duration_pb2.Duration(seconds=2), **waiting)
            for n in range(1, 257)
        ),
        _each(257, _body(257)),
    ]
    order = [a.call_id for a in client.SubmitEach(iter(requests), timeout=120)]
    assert sorted(order) == list(range(1, 258))
    assert order[0] != 257, "the 257th went past the limit"


def test_a_malformed_message_ends_the_submit_each_stream(server: ServiceProcess) -> None:
    with grpc.insecure_channel(server.address) as channel:
        raw = channel.stream_stream(
            "/txsync.v1.ClientService/SubmitEach",
            request_serializer=lambda message: message,
            response_deserializer=client_pb2.SubmitEachResponse.FromString,
        )
        good = _each(1, _body(1)).SerializeToString()
        answers = raw(iter([good, b"\xff\xff\xff"]), timeout=60)
        code, details = _code(lambda: list(answers))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed request: not a valid txsync.v1.SubmitEachRequest" in details


def test_stream_submit_and_wait(client: client_pb2_grpc.ClientServiceStub) -> None:
    requests = (
        client_pb2.SubmitStreamRequest(submit=client_pb2.SubmitRequest(body=_body(i)))
        for i in range(1500)
    )
    results = client.SubmitStream(requests).results
    assert len(results) == 1500 and all(r.HasField("accepted") for r in results)
    waited = client.Wait(
        client_pb2.WaitRequest(
            tx_id=results[0].accepted.tx_id,
            state=common_pb2.TX_STATE_INCOMING,
            timeout=duration_pb2.Duration(seconds=1),
        )
    )
    assert waited.reached and waited.state == common_pb2.TX_STATE_INCOMING
    not_yet = client.Wait(
        client_pb2.WaitRequest(
            tx_id=results[0].accepted.tx_id,
            state=common_pb2.TX_STATE_ACCEPTED,
            timeout=duration_pb2.Duration(nanos=100_000_000),
        )
    )
    assert not not_yet.reached
    unknown = client.Wait(
        client_pb2.WaitRequest(
            tx_id=str(uuid.uuid4()),
            state=common_pb2.TX_STATE_INCOMING,
            timeout=duration_pb2.Duration(nanos=100_000_000),
        )
    )
    assert not unknown.reached and unknown.state == common_pb2.TX_STATE_UNSPECIFIED
    # Several at once, each answered as Wait answers it, in the order asked.
    ids = [r.accepted.tx_id for r in results[:999]] + [str(uuid.uuid4())]
    batch = client.WaitBatch(
        client_pb2.WaitBatchRequest(
            tx_ids=ids, state=common_pb2.TX_STATE_INCOMING,
            timeout=duration_pb2.Duration(nanos=100_000_000),
        )
    ).results  # fmt: skip
    assert [w.reached for w in batch] == [True] * 999 + [False]
    assert batch[0].state == common_pb2.TX_STATE_INCOMING
    assert batch[-1].state == common_pb2.TX_STATE_UNSPECIFIED
    for count in (0, 1001):
        with pytest.raises(grpc.RpcError) as refused:
            client.WaitBatch(
                client_pb2.WaitBatchRequest(
                    tx_ids=ids[:1] * count, state=common_pb2.TX_STATE_INCOMING
                )
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "tx_ids" in (refused.value.details() or "")


def test_health_and_reflection(server: ServiceProcess) -> None:
    with grpc.insecure_channel(server.address) as channel:
        status = health_status(channel, "txsync.v1.ClientService")
        assert status == health_pb2.HealthCheckResponse.SERVING
        reflection: Any = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = {s.name for r in responses for s in r.list_services_response.service}
        assert {"txsync.v1.ClientService", "txsync.v1.StoreInternalService"} <= names


def test_sigterm_finishes_cleanly_and_restart_remembers(tmp_path: Path) -> None:
    process = transaction_store(tmp_path, "dc9")
    process.start()
    with grpc.insecure_channel(process.address) as channel:
        stub = client_pb2_grpc.ClientServiceStub(channel)
        tx_id = stub.Submit(client_pb2.SubmitRequest(body=_body(), idempotency_key="once")).tx_id
    assert process.terminate() == 0
    assert "stopped cleanly" in process.log()
    process.start()
    with grpc.insecure_channel(process.address) as channel:
        stub = client_pb2_grpc.ClientServiceStub(channel)
        again = stub.Submit(client_pb2.SubmitRequest(body=_body(), idempotency_key="once"))
        assert again.tx_id == tx_id and not again.created
    assert process.terminate() == 0


def test_corrupt_log_refuses_start_with_file_and_offset(tmp_path: Path) -> None:
    process = transaction_store(tmp_path, "dc8")
    process.start()
    with grpc.insecure_channel(process.address) as channel:
        stub = client_pb2_grpc.ClientServiceStub(channel)
        for _ in range(3):
            stub.Submit(client_pb2.SubmitRequest(body=_body()))
    assert process.terminate() == 0
    log_file = next((tmp_path / "txlog").glob("log-*.dat"))
    data = bytearray(log_file.read_bytes())
    data[12] ^= 0xFF  # inside the first frame's payload
    log_file.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match="exited 3"):
        process.start()
    assert f"txlog corrupt in {log_file} at byte offset 0" in process.log()


def test_admin_status_reports_a_torn_tail_and_exports_the_log(tmp_path: Path) -> None:
    process = transaction_store(tmp_path, "dc7")
    process.start()
    with grpc.insecure_channel(process.address) as channel:
        stub = client_pb2_grpc.ClientServiceStub(channel)
        for n in range(3):
            stub.Submit(client_pb2.SubmitRequest(body=_body(n)))
    process.kill()
    log_file = next((tmp_path / "txlog").glob("log-*.dat"))
    with open(log_file, "ab") as log:
        log.write(b"\x40\x00\x00\x00\x12\x34")  # an append cut short by the crash
    process.start()
    with grpc.insecure_channel(process.address) as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        status = admin.GetStatus(admin_pb2.GetStatusRequest()).local
        assert status.node_id == "dc7" and status.incoming_len == 3 and status.healthy
        assert any("torn tail" in alarm and log_file.name in alarm for alarm in status.alarms)
        exported = b"".join(r.records for r in admin.ExportLog(admin_pb2.ExportLogRequest()))
        assert len(scan(exported).frames) == 3 and scan(exported).torn_tail is None
        code, details = _code(
            lambda: admin.TruncateLog(admin_pb2.TruncateLogRequest(below_position=2))
        )
        assert code is grpc.StatusCode.FAILED_PRECONDITION and "only passed" in details
        code, details = _code(lambda: admin.ListWorkers(admin_pb2.ListWorkersRequest()))
        assert code is grpc.StatusCode.FAILED_PRECONDITION and "--dispatch" in details
    assert process.terminate() == 0


def test_a_body_missing_for_long_is_an_alarm_until_it_arrives(tmp_path: Path) -> None:
    """A synced transaction whose body no peer sends stops this DC's workers at it: once
    it has waited ``--body-missing-alarm-s`` the status raises an alarm naming it, and the
    DC is unhealthy; the body stored, both are gone (docs/operations.md, "Upgrading from
    0.1.0": a stall that was silent)."""
    process = transaction_store(tmp_path, "dc7", "--body-missing-alarm-s", "1")
    process.start()
    tx_id, encoded = str(uuid.uuid4()), _body(5).SerializeToString()
    meta = common_pb2.TxMeta(ts=2 * 10**6, tx_id=tx_id, origin="dc2")

    def status() -> admin_pb2.DcStatus:
        return admin.GetStatus(admin_pb2.GetStatusRequest(), timeout=30).local

    def missing_body_alarms() -> list[str]:
        return [alarm for alarm in status().alarms if "BODY MISSING" in alarm]

    with grpc.insecure_channel(process.address) as channel:
        internal = store_pb2_grpc.StoreInternalServiceStub(channel)
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        base = _persist(internal, store_pb2.PersistStepRequest()).merge_base
        _persist(internal, store_pb2.PersistStepRequest(counter=meta.ts, incoming=[meta]))
        accepted = [
            store_pb2.StateChange(tx_id=tx_id, state=common_pb2.TX_STATE_INCOMING),
            store_pb2.StateChange(tx_id=tx_id, state=common_pb2.TX_STATE_ACCEPTED),
        ]
        synced = store_pb2.PersistStepRequest(synced_start=base, synced=[meta])
        synced.state_changes.extend(accepted)
        _persist(internal, synced)
        assert status().healthy  # not waited long yet
        wait_until("the BODY MISSING alarm", lambda: bool(missing_body_alarms()), 120)
        (alarm,) = missing_body_alarms()
        assert not status().healthy
        assert f"position {base.synced_len + 1} ({tx_id}, from dc2)" in alarm
        pushed = store_pb2.StoreBodyRequest(tx_id=tx_id, body=encoded, digest=body_digest(encoded))
        _persist(internal, store_pb2.PersistStepRequest(bodies=[pushed]))
        assert status().healthy and not status().alarms
    assert process.terminate() == 0


def test_one_caller_cannot_take_every_admin_call_that_waits_on_another_service(
    tmp_path: Path,
) -> None:
    """Admin calls the store passes on (here ListWorkers to a dispatch that never
    answers, each held up to 2 s) are limited to 32 at once, 24 for one caller: the
    rest are refused at once, naming the share, and given back when they end."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(128)  # accepts connections, never speaks
    host, port = silent.getsockname()
    process = transaction_store(tmp_path, "dc1", "--dispatch", f"{host}:{port}")
    process.start()
    try:
        with grpc.insecure_channel(process.address) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            calls = [
                admin.ListWorkers.future(admin_pb2.ListWorkersRequest(), timeout=60)
                for _ in range(40)
            ]
            answers = [_code(call.result) for call in calls]
            refused = [d for code, d in answers if code is grpc.StatusCode.RESOURCE_EXHAUSTED]
            assert refused, answers
            assert all("the most one caller may" in details for details in refused), refused
            assert len(refused) <= 40 - 24
            code, details = _code(lambda: admin.ListWorkers(admin_pb2.ListWorkersRequest()))
            assert code is not grpc.StatusCode.RESOURCE_EXHAUSTED, details  # given back
    finally:
        process.terminate()
        silent.close()
