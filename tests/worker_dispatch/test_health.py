"""Scripts through worker-dispatch's health judgement (``worker_dispatch.health.judge``):
each line is a time, what the heartbeat said and how the pipeline stands, and what the
judgement must decide. Pure: nothing here waits or starts a process."""

from __future__ import annotations

from dataclasses import dataclass

from txsync.worker_dispatch.health import (
    DEAD_AFTER_S,
    JOIN_FROM_LOG_MAX,
    STUCK_RETRY_MAX_S,
    Beat,
    Event,
    Health,
    Pipeline,
    choose_testing_worker,
    judge,
    snapshot_needed,
)

STUCK_AFTER_S = 10.0
FAILED = None
"""The heartbeat call failed."""


@dataclass(frozen=True)
class Line:
    at: float
    beat: Beat | None
    events: tuple[Event, ...] = ()
    healthy: bool | None = None
    """What the worker must be after the line (None: not checked)."""
    in_flight: int = 0
    progressed_s: float = 0.0


def _run(script: list[Line], health: Health | None = None) -> Health:
    health = health or Health()
    for number, line in enumerate(script, start=1):
        pipeline = Pipeline(line.in_flight, line.progressed_s)
        health, events = judge(health, line.beat, line.at, pipeline, STUCK_AFTER_S)
        assert events == line.events, (number, line, events)
        if line.healthy is not None:
            assert health.healthy is line.healthy, (number, line, health)
    return health


def test_a_worker_comes_in_drains_and_dies() -> None:
    _run([
        Line(0.0, Beat(0), (Event.BACK,), healthy=True),
        Line(1.0, Beat(5), (), healthy=True),
        Line(2.0, Beat(5, draining=True), (Event.DRAINING,), healthy=False),
        Line(3.0, Beat(5), (Event.BACK,), healthy=True),
        Line(4.0, FAILED, (), healthy=True),
        Line(3.0 + DEAD_AFTER_S - 0.5, FAILED, (), healthy=True),  # not yet: last beat at 3
        Line(3.0 + DEAD_AFTER_S + 0.5, FAILED, (Event.DEAD,), healthy=False),
        Line(9.0, FAILED, (), healthy=False),  # already out: said once
        Line(10.0, Beat(5), (Event.BACK,), healthy=True),
    ])  # fmt: skip


def test_an_idle_worker_is_never_stuck() -> None:
    """The stuck clock counts only while work is in flight (issue 16: an idle worker's
    first request once counted its idle time and it was taken out for good)."""
    _run([
        Line(0.0, Beat(0), (Event.BACK,), healthy=True),
        Line(100.0, Beat(0), (), healthy=True, in_flight=0, progressed_s=0.0),
        # Work reached it at 100 (progressed_s set then): 5 s later it is only busy.
        Line(105.0, Beat(0), (), healthy=True, in_flight=1, progressed_s=100.0),
    ])  # fmt: skip


def test_a_stuck_worker_is_tried_again_with_a_doubling_backoff() -> None:
    health = _run([
        Line(0.0, Beat(0), (Event.BACK,), healthy=True),
        Line(11.0, Beat(3), (Event.STUCK,), healthy=False, in_flight=2, progressed_s=0.0),
        Line(15.0, Beat(3), (), healthy=False),  # still at 3, backoff not over
        # The backoff (stuck_after_s at first) ends at 21: fed again, back in.
        Line(21.5, Beat(3), (Event.RETRIED, Event.BACK), healthy=True),
        # Stuck again at once: the backoff doubles.
        Line(33.0, Beat(3), (Event.STUCK,), healthy=False, in_flight=1, progressed_s=21.5),
    ])  # fmt: skip
    assert health.stuck_backoff_s == 2 * STUCK_AFTER_S
    assert health.stuck_retry_at == 33.0 + 2 * STUCK_AFTER_S


def test_a_stuck_worker_that_moves_is_back_at_once_and_its_backoff_resets() -> None:
    health = _run([
        Line(0.0, Beat(0), (Event.BACK,), healthy=True),
        Line(11.0, Beat(3), (Event.STUCK,), healthy=False, in_flight=2, progressed_s=0.0),
        Line(12.0, Beat(4), (Event.BACK,), healthy=True),  # moved past 3
    ])  # fmt: skip
    assert health.stuck_at is None and health.stuck_backoff_s == 0.0


def test_the_backoff_stops_doubling_at_its_maximum() -> None:
    health = Health(healthy=True, stuck_backoff_s=STUCK_RETRY_MAX_S)
    stuck, events = judge(health, Beat(1), 500.0, Pipeline(1, 0.0), STUCK_AFTER_S)
    assert events == (Event.STUCK,)
    assert stuck.stuck_backoff_s == STUCK_RETRY_MAX_S


def test_a_dead_worker_that_was_stuck_stays_out_until_it_answers() -> None:
    _run([
        Line(0.0, Beat(0), (Event.BACK,), healthy=True),
        Line(11.0, Beat(2), (Event.STUCK,), healthy=False, in_flight=1, progressed_s=0.0),
        Line(30.0, FAILED, (), healthy=False),  # out already: not dead on top
        Line(40.0, Beat(2), (Event.RETRIED, Event.BACK), healthy=True),
    ])  # fmt: skip


def test_the_testing_role_stays_while_its_worker_is_fit() -> None:
    assert choose_testing_worker(["w1", "w2", "w3"], None) == "w1"
    assert choose_testing_worker(["w1", "w2", "w3"], "w2") == "w2", "w1 back: w2 keeps the role"
    assert choose_testing_worker(["w1", "w3"], "w2") == "w1", "w2 out: the first fit one"
    assert choose_testing_worker([], "w2") is None


def test_a_worker_far_behind_joins_from_a_snapshot() -> None:
    assert snapshot_needed(500, 500 - JOIN_FROM_LOG_MAX) == ""
    assert snapshot_needed(500, 499 - JOIN_FROM_LOG_MAX) == (
        f"{JOIN_FROM_LOG_MAX + 1} transactions behind the testing worker"
    )
    assert snapshot_needed(10, 20) == "", "ahead of the tester: it replays nothing"
