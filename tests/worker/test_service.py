"""A real worker process over gRPC: streamed applies, read-your-writes, refusals."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from tests.support.postgres import PostgresServer
from tests.support.processes import ServiceProcess, worker
from tests.support.waiting import wait_until
from tests.worker.apply_driver import request_body_at
from txsync.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from txsync.worker.backend import APPLY_BATCH_MAX
from txsync.worker.service import RECENT_TX_IDS_MAX


@pytest.fixture(params=["sqlite", "postgresql"])
def running_worker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServiceProcess]:
    conninfo = ""
    if request.param == "postgresql":
        server: PostgresServer = request.getfixturevalue("postgres")
        conninfo = server.new_database()
    process = worker(tmp_path / "w1", "w1", postgres=conninfo)
    process.start()
    yield process
    assert process.terminate() == 0, process.log()


def _requests(
    first: int, last: int, skip: frozenset[int] = frozenset()
) -> Iterator[worker_pb2.ApplyRequest]:
    for position in range(first, last + 1):
        yield worker_pb2.ApplyRequest(
            position=position, tx_id=f"tx-{position}",
            body=request_body_at(position).SerializeToString(),
            skip=position in skip,
        )  # fmt: skip


def _count_query(after: int, timeout_s: float = 10) -> worker_pb2.WorkerServiceQueryRequest:
    return worker_pb2.WorkerServiceQueryRequest(
        statement=common_pb2.Statement(sql="SELECT count(*) FROM applied_log"),
        after_position=after,
        timeout=Duration(seconds=int(timeout_s)),
    )


def test_streamed_applies_reads_after_a_position_and_heartbeats(
    running_worker: ServiceProcess,
) -> None:
    with grpc.insecure_channel(running_worker.address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        # A read that waits for position 200, issued before anything is applied.
        answers: list[worker_pb2.WorkerServiceQueryResponse] = []
        reader = threading.Thread(target=lambda: answers.append(stub.Query(_count_query(200))))
        reader.start()
        outcomes = list(stub.Apply(_requests(1, 300, skip=frozenset({250}))))
        reader.join()
        assert [o.outcome.position for o in outcomes] == list(range(1, 301))
        states = {o.outcome.position: o.outcome.state for o in outcomes}
        assert states[250] == common_pb2.TX_STATE_FAILED and states[1] == common_pb2.TX_STATE_OK
        assert answers[0].position >= 200 and answers[0].rows[0].values[0].int_value >= 199
        by_id = stub.Query(
            worker_pb2.WorkerServiceQueryRequest(
                statement=common_pb2.Statement(sql="SELECT count(*) FROM applied_log"),
                after_tx_id="tx-120",
            )
        )
        assert by_id.position >= 120

        beat = stub.Heartbeat(worker_pb2.HeartbeatRequest())
        assert (beat.worker_id, beat.position, beat.tx_id) == ("w1", 300, "tx-300")
        assert beat.state_digest == outcomes[-1].outcome.state_digest
        assert beat.backend in ("sqlite", "postgresql")

        # Re-sent positions are answered from the record; a gap ends the stream.
        again = list(stub.Apply(_requests(299, 300)))
        assert [a.outcome.state_digest for a in again] == [
            o.outcome.state_digest for o in outcomes[-2:]
        ]
        with pytest.raises(grpc.RpcError) as gap:
            list(stub.Apply(_requests(305, 305)))
        assert gap.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "applied: 300" in (gap.value.details() or "")
        # Sent together, new positions and then a gap: those before the gap are applied
        # and answered (one batch or several), then the stream ends.
        answered: list[int] = []
        with pytest.raises(grpc.RpcError) as late_gap:
            for answer in stub.Apply(itertools.chain(_requests(301, 303), _requests(305, 305))):
                answered.append(answer.outcome.position)
        assert answered == [301, 302, 303]
        assert late_gap.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "applied: 303" in (late_gap.value.details() or "")


def test_batched_applies_answer_each_batch_with_one_message(
    running_worker: ServiceProcess,
) -> None:
    """ApplyBatches (dispatch's stream): the same outcomes as Apply, in order, fewer
    messages each way; a message over 64 transactions is refused, after what came
    before it is applied."""

    def batches(first: int, last: int, size: int) -> Iterator[worker_pb2.ApplyBatchesRequest]:
        requests = list(_requests(first, last))
        for start in range(0, len(requests), size):
            yield worker_pb2.ApplyBatchesRequest(txs=requests[start : start + size])

    with grpc.insecure_channel(running_worker.address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        answers = list(stub.ApplyBatches(batches(1, 200, 40)))
        outcomes = [o for answer in answers for o in answer.outcomes]
        assert [o.outcome.position for o in outcomes] == list(range(1, 201))
        assert all(o.outcome.state == common_pb2.TX_STATE_OK for o in outcomes)
        assert len(answers) < len(outcomes)  # a batch applied together, one answer
        beat = stub.Heartbeat(worker_pb2.HeartbeatRequest())
        assert beat.state_digest == outcomes[-1].outcome.state_digest

        with pytest.raises(grpc.RpcError) as refused:
            list(stub.ApplyBatches(itertools.chain(batches(201, 210, 10),
                                                   batches(211, 275, 65))))  # fmt: skip
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "over 64" in (refused.value.details() or "")
        assert stub.Heartbeat(worker_pb2.HeartbeatRequest()).position == 210


def test_a_read_after_a_tx_id_older_than_the_recent_ones_is_answered_at_once(
    tmp_path: Path,
) -> None:
    """The worker wakes reads by the newest ``RECENT_TX_IDS_MAX`` ids applied and keeps
    older ones as digests (issue 47: 15 MiB of ids made 1 MiB): a read after an id past
    the newest, and past the database's outcomes, waits for nothing, as one after a
    recent id does. Before the digests it waited for its timeout."""
    process = worker(tmp_path / "w1", "w1")
    process.start()
    last = RECENT_TX_IDS_MAX + APPLY_BATCH_MAX
    batches = (
        worker_pb2.ApplyBatchesRequest(
            txs=list(_requests(first, min(first + APPLY_BATCH_MAX - 1, last)))
        )
        for first in range(1, last + 1, APPLY_BATCH_MAX)
    )
    try:
        with grpc.insecure_channel(process.address) as channel:
            stub = worker_pb2_grpc.WorkerServiceStub(channel)
            assert sum(len(answer.outcomes) for answer in stub.ApplyBatches(batches)) == last
            for tx_id in ("tx-1", f"tx-{last}"):
                request = worker_pb2.WorkerServiceQueryRequest(
                    statement=common_pb2.Statement(sql="SELECT count(*) FROM applied_log"),
                    after_tx_id=tx_id,
                )
                assert stub.Query(request).position == last
    finally:
        assert process.terminate() == 0, process.log()


def test_queries_refuse_writes_bad_limits_and_time_out(running_worker: ServiceProcess) -> None:
    with grpc.insecure_channel(running_worker.address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        list(stub.Apply(_requests(1, 3)))
        cases = [
            (worker_pb2.WorkerServiceQueryRequest(
                statement=common_pb2.Statement(sql="DELETE FROM applied_log")),
             grpc.StatusCode.INVALID_ARGUMENT, "reads only"),
            (worker_pb2.WorkerServiceQueryRequest(
                statement=common_pb2.Statement(sql="SELECT 1"), max_rows=20_000),
             grpc.StatusCode.INVALID_ARGUMENT, "max_rows"),
            (_count_query(after=10, timeout_s=1), grpc.StatusCode.DEADLINE_EXCEEDED, "applied: 3"),
        ]  # fmt: skip
        for request, code, words in cases:
            with pytest.raises(grpc.RpcError) as refused:
                stub.Query(request)
            assert refused.value.code() is code and words in (refused.value.details() or "")
        assert stub.Query(_count_query(after=3)).rows[0].values[0].int_value == 2


def test_pending_reads_are_bounded_and_answered_when_their_position_comes(
    running_worker: ServiceProcess,
) -> None:
    """Reads run or wait at most READS_PENDING_MAX (64) at a time, and one caller holds at
    most three quarters of them (48); one more is refused at once (RESOURCE_EXHAUSTED),
    and the ones held are all answered when the position comes."""
    with grpc.insecure_channel(running_worker.address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        list(stub.Apply(_requests(1, 3)))
        held = [stub.Query.future(_count_query(after=10, timeout_s=60)) for _ in range(48)]
        refused: list[grpc.RpcError] = []

        def one_more_refused() -> bool:
            try:
                stub.Query(_count_query(after=3))
            except grpc.RpcError as error:
                refused.append(error)
                return True
            return False

        wait_until("the caller's 49th pending read is refused", one_more_refused, timeout_s=60)
        assert refused[-1].code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "holds 48 reads here, the most one caller may" in (refused[-1].details() or "")
        list(stub.Apply(_requests(4, 10)))
        assert {read.result(timeout=60).rows[0].values[0].int_value for read in held} == {9}
        assert stub.Query(_count_query(after=10)).rows[0].values[0].int_value == 9


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_snapshots_copy_a_worker_and_a_bad_one_changes_nothing(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    databases = {"src": "", "dst": ""}
    if backend == "postgresql":
        server: PostgresServer = request.getfixturevalue("postgres")
        databases = {name: server.new_database() for name in databases}
    source, target = (worker(tmp_path / n, n, postgres=databases[n]) for n in ("src", "dst"))
    source.start()
    target.start()
    try:
        with (
            grpc.insecure_channel(source.address) as from_channel,
            grpc.insecure_channel(target.address) as to_channel,
        ):
            exporter = worker_pb2_grpc.WorkerServiceStub(from_channel)
            importer = worker_pb2_grpc.WorkerServiceStub(to_channel)
            list(exporter.Apply(_requests(1, 50)))
            chunks = list(exporter.ExportSnapshot(worker_pb2.ExportSnapshotRequest()))
            assert chunks[-1].snapshot_digest and chunks[-1].position == 50

            tampered = worker_pb2.ExportSnapshotResponse()
            tampered.CopyFrom(chunks[-1])
            tampered.data = b"x" + tampered.data[1:]
            bad = [*chunks[:-1], tampered]
            with pytest.raises(grpc.RpcError) as refused:
                importer.ImportSnapshot(
                    iter(worker_pb2.ImportSnapshotRequest(chunk=c) for c in bad)
                )
            assert refused.value.code() is grpc.StatusCode.DATA_LOSS
            assert importer.Heartbeat(worker_pb2.HeartbeatRequest()).position == 0  # untouched

            done = importer.ImportSnapshot(
                iter(worker_pb2.ImportSnapshotRequest(chunk=c) for c in chunks)
            )
            assert done.position == 50 and done.state_digest == chunks[-1].state_digest
            again = list(importer.Apply(_requests(51, 60)))  # it goes on from the snapshot
            mirror = list(exporter.Apply(_requests(51, 60)))
            assert again[-1].outcome.state_digest == mirror[-1].outcome.state_digest
    finally:
        for process in (source, target):
            assert process.terminate() == 0, process.log()
