"""``LagClock``: how long a DC has lacked what a peer had, from the peers' lengths."""

from __future__ import annotations

from txsync.telemetry.lag_clock import NOTES_MAX, LagClock


def test_in_step_the_lag_is_the_gap_between_a_peer_merging_and_this_dc() -> None:
    clock = LagClock()
    assert clock.seconds_behind(0, now=5.0) == 0.0  # nobody ahead
    clock.reached(10, now=10.0)
    assert round(clock.seconds_behind(0, now=10.02), 6) == 0.02
    assert clock.seconds_behind(10, now=10.03) == 0.0  # merged too: caught up


def test_cut_off_the_lag_is_the_time_since_a_peer_first_had_what_is_missing() -> None:
    clock = LagClock()
    for second in range(60):  # the peers go on, one position a second
        clock.reached(100 + second, now=float(second))
    assert clock.seconds_behind(99, now=60.0) == 60.0  # lacks 100, seen at 0 s
    clock.forget_up_to(130)
    assert clock.seconds_behind(130, now=61.0) == 30.0  # caught up to 130: lacks 131 (30 s)
    assert clock.seconds_behind(159, now=62.0) == 0.0
    clock.reached(150, now=63.0)  # an older post of a slower peer: nothing new
    assert clock.seconds_behind(159, now=64.0) == 0.0


def test_the_notes_are_bounded_and_keep_the_oldest() -> None:
    clock = LagClock()
    for n in range(NOTES_MAX + 100):
        clock.reached(n + 1, now=float(n))
    assert clock.seconds_behind(0, now=float(NOTES_MAX + 100)) == NOTES_MAX + 100
    assert len(clock._notes) == NOTES_MAX  # the bound itself


def test_followers_at_different_lengths_each_read_their_own_lag() -> None:
    clock = LagClock()
    for second in range(10):
        clock.reached(second + 1, now=float(second))  # length n+1 first seen at n s
    assert clock.seconds_behind(2, now=10.0) == 8.0  # lacks 3, seen at 2 s
    assert clock.seconds_behind(8, now=10.0) == 2.0  # asking does not forget
    assert clock.seconds_behind(2, now=10.0) == 8.0
    clock.forget_up_to(5)  # every follower has 5
    assert clock.seconds_behind(5, now=10.0) == 5.0 and len(clock._notes) == 5
