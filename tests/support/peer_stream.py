"""A test speaking to a coordinator as a peer DC does: one message on the ``Exchange``
stream (the only way posts, catch-up entries, bodies and view messages travel between
DCs), half-closed after it."""

from __future__ import annotations

from txsync.v1 import peer_pb2, peer_pb2_grpc


def exchange(
    peer: peer_pb2_grpc.PeerServiceStub, message: peer_pb2.ExchangeRequest, timeout: float = 30
) -> list[peer_pb2.ExchangeResponse]:
    """Send ``message`` alone on a new stream: the answers (a post, the stream's first,
    is answered; anything else is one-way), or the ``grpc.RpcError`` the receiver ended
    the stream with when it refused the message."""
    return list(peer.Exchange(iter([message]), timeout=timeout))


def post(
    peer: peer_pb2_grpc.PeerServiceStub, request: peer_pb2.PostRequest, timeout: float = 30
) -> peer_pb2.ExchangeResponse:
    """Send one post: the receiver's answer (``whole_needed`` when it could not rebuild
    it)."""
    (answer,) = exchange(peer, peer_pb2.ExchangeRequest(post=request), timeout)
    return answer
