"""``LagClock``: how long a DC has lacked what a peer had, from the peers' lengths."""

from __future__ import annotations

from txsync.sync_coordinator.lag_clock import NOTES_MAX, LagClock


def test_in_step_the_lag_is_the_gap_between_a_peer_merging_and_this_dc() -> None:
    clock = LagClock()
    assert clock.seconds_behind(0, now=5.0) == 0.0  # nobody ahead
    clock.peer_reached(10, now=10.0)
    assert round(clock.seconds_behind(0, now=10.02), 6) == 0.02
    assert clock.seconds_behind(10, now=10.03) == 0.0  # merged too: caught up


def test_cut_off_the_lag_is_the_time_since_a_peer_first_had_what_is_missing() -> None:
    clock = LagClock()
    for second in range(60):  # the peers go on, one position a second
        clock.peer_reached(100 + second, now=float(second))
    assert clock.seconds_behind(99, now=60.0) == 60.0  # lacks 100, seen at 0 s
    assert clock.seconds_behind(130, now=61.0) == 30.0  # caught up to 130: lacks 131 (30 s)
    assert clock.seconds_behind(159, now=62.0) == 0.0
    clock.peer_reached(150, now=63.0)  # an older post of a slower peer: nothing new
    assert clock.seconds_behind(159, now=64.0) == 0.0


def test_the_notes_are_bounded_and_keep_the_oldest() -> None:
    clock = LagClock()
    for n in range(NOTES_MAX + 100):
        clock.peer_reached(n + 1, now=float(n))
    assert clock.seconds_behind(0, now=float(NOTES_MAX + 100)) == NOTES_MAX + 100
    assert len(clock._notes) == NOTES_MAX  # the bound itself
