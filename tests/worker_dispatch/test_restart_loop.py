"""A pipeline that restarts in a loop raises an alarm (issue 17); one that restarts now
and then does not. Times are given: nothing here waits."""

from __future__ import annotations

from txsync.worker_dispatch.health import (
    RESTART_LOOP_COUNT,
    RESTART_LOOP_WINDOW_S,
    RestartLoop,
)


def test_restarts_in_a_loop_raise_an_alarm_until_they_stop() -> None:
    loop = RestartLoop()
    for n in range(RESTART_LOOP_COUNT - 1):
        loop.record(100.0 + n * 0.2, "w1 unreachable (UNAVAILABLE)")
    assert loop.alarm(104.0) == "", "one short of the count"
    loop.record(104.0, "position 7 was truncated")
    alarm = loop.alarm(104.5)
    assert alarm.startswith(f"the pipeline restarted {RESTART_LOOP_COUNT} times in 4 s")
    assert alarm.endswith("(last: position 7 was truncated)")
    assert loop.alarm(104.0 + RESTART_LOOP_WINDOW_S + 1) == "", "quiet for a window: cleared"


def test_restarts_now_and_then_raise_none() -> None:
    loop = RestartLoop()
    gap = RESTART_LOOP_WINDOW_S / RESTART_LOOP_COUNT * 1.5
    for n in range(3 * RESTART_LOOP_COUNT):
        loop.record(n * gap, "the set of healthy workers changed")
        assert loop.alarm(n * gap) == ""
