"""A health judgement with one rule broken (the simulated dispatch runs it in place of
``health.judge``)."""

from __future__ import annotations

from dataclasses import replace

from txsync.worker_dispatch.health import Beat, Event, Health, Pipeline, judge


def never_revives(
    health: Health,
    beat: Beat | None,
    now: float,
    pipeline: Pipeline,
    stuck_after_s: float,
    *,
    dead_after_s: float,
) -> tuple[Health, tuple[Event, ...]]:
    """A worker once taken out (dead, stuck, draining) is never let back in: only one
    never heard from before comes in at its first heartbeat."""
    after, events = judge(health, beat, now, pipeline, stuck_after_s, dead_after_s=dead_after_s)
    if Event.BACK in events and health.last_heartbeat_s > 0:
        return replace(after, healthy=False), tuple(e for e in events if e is not Event.BACK)
    return after, events


def back_at_every_beat(
    health: Health,
    beat: Beat | None,
    now: float,
    pipeline: Pipeline,
    stuck_after_s: float,
    *,
    dead_after_s: float,
) -> tuple[Health, tuple[Event, ...]]:
    """A healthy worker's every heartbeat says it is back, as if it had been out: the
    pipeline restarts at each one, and applies between restarts."""
    after, events = judge(health, beat, now, pipeline, stuck_after_s, dead_after_s=dead_after_s)
    if beat is not None and after.healthy and not events:
        return after, (Event.BACK,)
    return after, events
