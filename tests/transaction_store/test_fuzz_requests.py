"""Every request decoder of the real server (unary calls, and the internal streams'
messages), fed random and mutated bytes.

Bytes go over the wire raw, so they meet the server's real decoding path. A handler that
raised an unexpected exception would answer UNKNOWN; a hang would hit the deadline. Both
fail the test; refusing (INVALID_ARGUMENT and friends) is the right answer.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import duration_pb2
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.processes import ServiceProcess, health_status, transaction_store
from txsync.v1 import client_pb2, common_pb2, store_pb2

TX = str(uuid.uuid4())
META = common_pb2.TxMeta(ts=3, tx_id=TX, origin="dc2")
BODY = common_pb2.TxBody(statements=[common_pb2.Statement(sql="SELECT 1")])
VALID: dict[str, Message] = {
    "/txsync.v1.ClientService/Submit": client_pb2.SubmitRequest(body=BODY, idempotency_key="k"),
    "/txsync.v1.ClientService/SubmitBatch": client_pb2.SubmitBatchRequest(
        submits=[client_pb2.SubmitRequest(body=BODY)]
    ),
    "/txsync.v1.ClientService/Get": client_pb2.GetRequest(tx_id=TX, include_body=True),
    "/txsync.v1.ClientService/Wait": client_pb2.WaitRequest(
        tx_id=TX, state=common_pb2.TX_STATE_OK, timeout=duration_pb2.Duration(nanos=1000)
    ),
    "/txsync.v1.ClientService/List": client_pb2.ListRequest(page_size=3, page_token="c2VxOjI="),
    "/txsync.v1.StoreInternalService/PersistSteps": store_pb2.PersistStepsRequest(
        step=store_pb2.PersistStepRequest(
            counter=5,
            incoming=[META],
            synced_start=common_pb2.MergeBase(),
            synced=[META],
            state_changes=[store_pb2.StateChange(tx_id=TX, state=common_pb2.TX_STATE_INCOMING)],
            bodies=[
                store_pb2.StoreBodyRequest(tx_id=TX, body=BODY.SerializeToString(), digest=b"d")
            ],
        )
    ),
    "/txsync.v1.StoreInternalService/ReadBody": store_pb2.ReadBodyRequest(tx_id=TX),
    "/txsync.v1.StoreInternalService/ReadBodies": store_pb2.ReadBodiesRequest(tx_ids=[TX]),
    "/txsync.v1.StoreInternalService/ReadSynced": store_pb2.ReadSyncedRequest(count_max=3),
    "/txsync.v1.StoreInternalService/AdvanceStatesStream": store_pb2.AdvanceStatesStreamRequest(
        batch=store_pb2.AdvanceStatesRequest(
            changes=[store_pb2.StateChange(tx_id=TX, state=common_pb2.TX_STATE_TESTING)]
        )
    ),
    "/txsync.v1.StoreInternalService/ReportProgress": store_pb2.ReportProgressRequest(
        peer_synced_len={"dc2": 1}, workers_min_position=1, core_history_len=1
    ),
    "/txsync.v1.StoreInternalService/ExportBase": store_pb2.ExportBaseRequest(
        position=1, final_state=common_pb2.TX_STATE_OK, adopter="dc2", adopter_len=0
    ),
    "/txsync.v1.StoreInternalService/AdoptBase": store_pb2.AdoptBaseRequest(
        adoption=common_pb2.BaseAdoption(
            meta=META,
            before=common_pb2.MergeBase(synced_len=2, last_tx_id=str(uuid.uuid4())),
            final_state=common_pb2.TX_STATE_OK,
            counter=5,
            synced_own=[common_pb2.SyncedAt(position=1, tx_id=str(uuid.uuid4()))],
        )
    ),
}
METHODS = sorted(VALID)
STREAMS = {
    "/txsync.v1.StoreInternalService/PersistSteps",
    "/txsync.v1.StoreInternalService/AdvanceStatesStream",
}
"""Bidirectional streams: the bytes go as the stream's one message."""


@pytest.fixture(scope="module")
def channel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[grpc.Channel]:
    process: ServiceProcess = transaction_store(tmp_path_factory.mktemp("fuzz"), "dc1")
    process.start()
    with grpc.insecure_channel(process.address) as open_channel:
        yield open_channel
    health = "healthy" if process.process and process.process.poll() is None else "dead"
    assert health == "healthy", process.log()
    assert process.terminate() == 0
    assert "Traceback" not in process.log(), process.log()


def _call(channel: grpc.Channel, method: str, data: bytes) -> None:
    try:
        if method in STREAMS:
            stream: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(method)
            list(stream(iter([data]), timeout=5))
        else:
            raw: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(method)
            raw(data, timeout=5)
    except grpc.RpcError as error:
        code = error.code()
        assert code is not grpc.StatusCode.UNKNOWN, (method, data, error)
        assert code is not grpc.StatusCode.DEADLINE_EXCEEDED, (method, data)


FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FUZZ
@given(method=st.sampled_from(METHODS), data=st.binary(max_size=300))
def test_random_bytes_are_refused_cleanly(channel: grpc.Channel, method: str, data: bytes) -> None:
    _call(channel, method, data)


@FUZZ
@given(
    method=st.sampled_from(METHODS),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
)
def test_mutated_requests_are_refused_cleanly(
    channel: grpc.Channel, method: str, flips: list[tuple[int, int]]
) -> None:
    data = bytearray(VALID[method].SerializeToString())
    for position, value in flips:
        data[position % len(data)] = value
    _call(channel, method, bytes(data))


def test_server_is_still_serving_after_the_fuzz(channel: grpc.Channel) -> None:
    assert health_status(channel) == health_pb2.HealthCheckResponse.SERVING
