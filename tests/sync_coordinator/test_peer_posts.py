"""A post the coordinator refuses leaves no trace (issue 18): before, a post whose
outcomes were refused had already been remembered as the sender's newest, so a later post
could build on one that was never accepted."""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import pytest

from tests.support.cluster import LocalCluster
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
                peer.Post(_post(5, queue=[meta], queue_len=1, outcomes=[bad_outcome]), timeout=30)
            error: grpc.Call = refused.value  # type: ignore[assignment]  # an RpcError is a Call
            assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "outcomes[0].state" in (error.details() or "")
            # A delta on the refused post: the receiver must not hold it.
            delta = _post(6, delta_from_seq=5, delta_skip=0, delta_keep=1, queue_len=1)
            assert peer.Post(delta, timeout=30).whole_needed
    finally:
        cluster.stop()
