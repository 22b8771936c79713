"""The latency tools: the cores alone in simulated time, and the txlog breakdown."""

from __future__ import annotations

from bench.latency_breakdown import breakdown, client_rows
from bench.protocol_model import DroppingCore, measure
from txsync.protocol import ProtocolNode


def test_with_a_client_at_every_dc_the_cores_agree_in_about_one_round_trip() -> None:
    got = measure(ProtocolNode, rtt_ms=50, txs=200)
    assert got.p50_ms <= 1.1 * 50 and got.p99_ms <= 1.1 * 50


def test_dropping_posts_at_a_base_change_costs_half_a_round_trip_more() -> None:
    """What rebasing bought (issue 19); the model must tell the two cores apart."""
    assert measure(DroppingCore, rtt_ms=50, txs=200).p50_ms >= 1.4 * 50


def test_rebased_posts_start_no_storm_of_rounds() -> None:
    """A rebased post from a lagger once counted as an answer to our round: rounds then
    completed as fast as posts crossed, 151 posts per transaction at 50 ms RTT (13x
    dropping them). Rebasing may cost some posts, not a storm."""
    rebased = measure(ProtocolNode, rtt_ms=50, txs=200).posts_per_tx
    assert rebased <= 2 * measure(DroppingCore, rtt_ms=50, txs=200).posts_per_tx


def test_the_breakdown_counts_from_each_transaction_s_submit_at_its_origin() -> None:
    times = {
        "t1": {("dc1", "submit"): 1_000, ("dc1", "synced"): 1_030, ("dc2", "meta"): 1_010},
        "t2": {("dc2", "submit"): 2_000, ("dc1", "meta"): 2_020, ("dc2", "synced"): 2_040},
        "t0": {("dc1", "synced"): 500},  # submitted before the oldest txlog file
    }
    rows = breakdown(times, {"t1": "dc1", "t2": "dc2"})
    assert rows == [
        ("origin", "submit", [0, 0]),
        ("origin", "synced", [30, 40]),
        ("peer", "meta", [10, 20]),
    ]


def test_the_client_legs_join_each_answer_with_its_origin_s_entries() -> None:
    times = {
        "t1": {("dc1", "submit"): 1_002, ("dc1", "ACCEPTED"): 1_030, ("dc2", "ACCEPTED"): 1_020},
        "t2": {("dc2", "submit"): 2_001, ("dc2", "ACCEPTED"): 2_050},
        "t3": {("dc1", "submit"): 3_000},  # never ACCEPTED in the window: left out
    }
    sent = [("t1", 1_000.5, 1_034.5), ("t2", 2_000.0, 2_052.0), ("t3", 2_999.0, 3_040.0)]
    rows = client_rows(sent, times, {"t1": "dc1", "t2": "dc2", "t3": "dc1"})
    assert rows == [
        ("client", "sent>submit", [1.0, 1.5]),
        ("client", "ACCEPTED>answer", [2.0, 4.5]),
        ("client", "answer", [34.0, 52.0]),
    ]
