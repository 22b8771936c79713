"""What the coordinator refuses from a peer leaves no trace. A refused post (issue 18):
before, a post whose outcomes were refused had already been remembered as the sender's
newest, so a later post could build on one that was never accepted. A refused body: the
others pushed with it are stored all the same."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import grpc
import pytest

from tests.support.cluster import LocalCluster
from tests.support.peer_stream import exchange, post
from txsync.protocol import GENESIS_TX_ID
from txsync.v1 import common_pb2, peer_pb2, peer_pb2_grpc

EPOCH = 10**6
"""Far above the real dc2's: the probe's posts would be the newest it ever sent."""


def _post(seq: int, **fields: object) -> peer_pb2.PostRequest:
    return peer_pb2.PostRequest(
        sender="dc2",
        epoch=EPOCH,
        seq=seq,
        base=common_pb2.MergeBase(synced_len=0, last_tx_id=GENESIS_TX_ID),
        counter=5,
        **fields,  # type: ignore[arg-type]
    )


def test_a_refused_post_is_not_remembered(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, 2)
    try:
        with grpc.insecure_channel(cluster.dcs[0].coordinator.address) as channel:
            peer = peer_pb2_grpc.PeerServiceStub(channel)
            meta = common_pb2.TxMeta(ts=5, tx_id=str(uuid.uuid4()), origin="dc2")
            bad_outcome = peer_pb2.OutcomeDigest(
                position=1, tx_id=meta.tx_id, state=common_pb2.TX_STATE_INCOMING
            )
            with pytest.raises(grpc.RpcError) as refused:
                post(peer, _post(5, queue=[meta], queue_len=1, outcomes=[bad_outcome]))
            error: grpc.Call = refused.value  # type: ignore[assignment]  # an RpcError is a Call
            assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "outcomes[0].state" in (error.details() or "")
            # A delta on the refused post: the receiver must not hold it.
            delta = _post(6, delta_from_seq=5, delta_skip=0, delta_keep=1, queue_len=1)
            assert post(peer, delta).whole_needed
    finally:
        cluster.stop()


def test_a_pushed_body_that_fails_its_digest_is_refused_and_the_others_are_stored(
    tmp_path: Path,
) -> None:
    """The coordinator checks a peer's bodies itself (the store would fail the whole step
    that carried a bad one): the bad one is refused by name (in its log; the push is
    one-way), the good one is stored with the coordinator's next step and served to
    peers from then on."""
    cluster = LocalCluster(tmp_path, 2)
    try:
        with grpc.insecure_channel(cluster.dcs[0].coordinator.address) as channel:
            peer = peer_pb2_grpc.PeerServiceStub(channel)
            encoded = common_pb2.TxBody(
                statements=[common_pb2.Statement(sql="INSERT INTO t VALUES (1)")]
            ).SerializeToString()
            good, bad = str(uuid.uuid4()), str(uuid.uuid4())
            pushed = peer_pb2.PushBodiesRequest(
                sender="dc2",
                bodies=[
                    peer_pb2.PushBodyRequest(tx_id=bad, body=encoded, digest=bytes(32)),
                    peer_pb2.PushBodyRequest(
                        tx_id=good, body=encoded, digest=hashlib.sha256(encoded).digest()
                    ),
                ],
            )
            # One-way on the stream: no answer, and the stream is not ended for it.
            assert exchange(peer, peer_pb2.ExchangeRequest(bodies=pushed)) == []
            coordinator = cluster.dcs[0].coordinator
            cluster.wait_for(
                "the bad body is refused by name",
                lambda: f"body {bad} from dc2 refused" in coordinator.log(),
            )
            assert "fails its digest" in coordinator.log()
            served: list[bytes] = []

            def good_body_served() -> bool:
                try:
                    answer = peer.GetBody(peer_pb2.GetBodyRequest(sender="dc2", tx_id=good))
                except grpc.RpcError:
                    return False
                served.append(answer.body)
                return True

            # Stored with the coordinator's next step, soon after it arrived.
            cluster.wait_for("the good body is stored and served", good_body_served)
            assert served == [encoded]
            with pytest.raises(grpc.RpcError):
                peer.GetBody(peer_pb2.GetBodyRequest(sender="dc2", tx_id=bad), timeout=30)
            many = peer.GetBodies(
                peer_pb2.GetBodiesRequest(sender="dc2", tx_ids=[bad, good]), timeout=30
            )
            assert [(b.tx_id, b.body) for b in many.bodies] == [(good, encoded)]
            assert not many.unread
            for tx_ids in ([], [good] * 257):
                with pytest.raises(grpc.RpcError) as refused:
                    peer.GetBodies(peer_pb2.GetBodiesRequest(sender="dc2", tx_ids=tx_ids))
                assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert "1..256" in (refused.value.details() or "")
            with pytest.raises(grpc.RpcError) as stranger:
                peer.GetBodies(peer_pb2.GetBodiesRequest(sender="dc9", tx_ids=[good]))
            assert stranger.value.code() is grpc.StatusCode.PERMISSION_DENIED
    finally:
        cluster.stop()
