"""Peer links' queues with one rule broken (``sim/links.py`` runs them in place of the
coordinator's ``PeerQueue``)."""

from __future__ import annotations

from txsync.sync_coordinator.peer_queue import PeerQueue
from txsync.v1 import peer_pb2


class IgnoresWholeNeededQueue(PeerQueue):
    """Takes a peer's ``whole_needed`` answer as an acknowledgement: the post it could not
    rebuild is not sent again, and later posts name it (or the one sent before it) as
    the post they change, which the peer does not hold."""

    def answered(self, answer: peer_pb2.ExchangeResponse) -> None:
        if answer.whole_needed:
            answer = peer_pb2.ExchangeResponse(epoch=answer.epoch, seq=answer.seq)
        super().answered(answer)
