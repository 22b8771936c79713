"""A test speaking to a transaction-store as worker-dispatch does: one batch of state
changes on the ``AdvanceStatesStream`` stream (the only way dispatch records TESTING, OK
and FAILED), half-closed after it."""

from __future__ import annotations

from txsync.v1 import store_pb2, store_pb2_grpc


def advance(
    store: store_pb2_grpc.StoreInternalServiceStub,
    batch: store_pb2.AdvanceStatesRequest,
    *,
    metadata: tuple[tuple[str, str], ...] | None = None,
    timeout: float = 30,
) -> list[store_pb2.AdvanceStatesStreamResponse]:
    """Send ``batch`` alone on a new stream: the store's answers once it is durable, or
    the ``grpc.RpcError`` the store ended the stream with when it refused the batch."""
    request = store_pb2.AdvanceStatesStreamRequest(batch=batch)
    return list(store.AdvanceStatesStream(iter([request]), metadata=metadata, timeout=timeout))
