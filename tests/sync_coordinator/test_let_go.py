"""Which peers the coordinator names to its store for letting go (``let_go``)."""

from __future__ import annotations

from txsync.sync_coordinator.let_go import SERVED_HOLD_MS, ServedPeers


def test_a_peer_is_named_once_heard_from_and_sent_nothing_for_the_hold() -> None:
    served = ServedPeers(started_ms=1_000)
    posted = {"dc2": 40, "dc3": 7}
    peers = ["dc2", "dc3", "dc4"]  # dc4: not heard from since the start
    # Just started: what its last run sent may still be on its way to any of them.
    assert served.orders(posted, peers, now_ms=1_000 + SERVED_HOLD_MS - 1) == {}
    assert served.orders(posted, peers, now_ms=1_000 + SERVED_HOLD_MS) == posted
    served.served("dc3", now_ms=20_000)  # a post, catch-up or view message to dc3
    assert served.orders(posted, peers, now_ms=20_000 + SERVED_HOLD_MS - 1) == {"dc2": 40}
    assert served.orders(posted, peers, now_ms=20_000 + SERVED_HOLD_MS) == posted
    assert served.orders(posted, ["dc2"], now_ms=40_000) == {"dc2": 40}  # dc3 removed


def test_a_peer_not_heard_from_is_named_at_its_recorded_length() -> None:
    """A coordinator that restarted while a peer was away has not heard from it: the
    store's record of how far its order came (``peers_ordered``) names it, under the
    same hold; its own post, once heard, counts instead."""
    served = ServedPeers(started_ms=1_000)
    recorded = {"dc3": 7}
    after_hold = 1_000 + SERVED_HOLD_MS
    assert served.orders({}, ["dc2", "dc3"], after_hold - 1, recorded) == {}
    assert served.orders({}, ["dc2", "dc3"], after_hold, recorded) == {"dc3": 7}
    assert served.orders({"dc3": 90}, ["dc3"], after_hold, recorded) == {"dc3": 90}
    assert served.orders({}, ["dc2"], after_hold, recorded) == {}  # dc3 removed
