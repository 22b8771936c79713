"""worker-dispatch's decisions as pure functions (issue 18): a worker's health, the testing
role, how a worker that joins catches up, and when a pipeline restarts in a loop.

``judge`` takes what dispatch knows of a worker's health (``Health``), what its latest
heartbeat said (a ``Beat``, or None when the call failed), the time, and how the
pipeline stands with that worker (requests in flight, when it last answered one), and
returns the new ``Health`` with what happened (``Event``s): nothing, out (dead, stuck,
draining), tried again after being stuck, or back in. No clock, no I/O and no logging:
``Dispatch._beat`` applies the result, ``tests/worker_dispatch/test_health.py`` runs
scripts of beats and times through it, and the simulator's dispatch heartbeats its
workers through it (``sim/workers.py``).

The rules (PROTOCOL.md §4.7, docs/workers.md):

- A worker that has not answered a heartbeat for ``DEAD_AFTER_S`` is out (dead).
- A healthy worker with work in flight and no outcome for ``stuck_after_s`` is out
  (stuck): the clock starts when work reached it idle, not at its last outcome.
- A stuck worker is back once it moves past where it stuck, or when its backoff ends
  (doubling from ``stuck_after_s`` up to ``STUCK_RETRY_MAX_S`` while it stays stuck), so
  that a live worker is never left out for good.
- A draining worker is out; a worker that answers and is not draining is back in.

The testing role stays with its worker while that worker is fit (one coming back is
behind, and the DC's progress would wait for it), else goes to the first fit worker in
configured order (``choose_testing_worker``). A worker that joins more than ``JOIN_FROM_LOG_MAX``
behind the testing worker is brought up from a snapshot, closer it replays the log
(``snapshot_needed``).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

DEAD_AFTER_S = 3.0
"""A worker that has not answered a heartbeat for this long is taken out of the pipeline."""
STUCK_RETRY_MAX_S = 300.0
"""The longest a stuck worker that does not move waits before it is fed again."""
RESTART_LOOP_WINDOW_S = 60.0
RESTART_LOOP_COUNT = 20
"""A pipeline that restarts this many times within the window is in a loop (a worker
that fails at once on every start, a store that refuses what dispatch records): an alarm
that makes the DC unhealthy, until a window passes without that many."""
JOIN_FROM_LOG_MAX = 100
"""A worker that joins further behind the testing worker than this starts from a
snapshot; closer, it replays the log."""


class Event(enum.Enum):
    DEAD = "dead"
    STUCK = "stuck"
    DRAINING = "draining"
    RETRIED = "retried"
    """Stuck and not moved, but its backoff ended: it is fed again."""
    BACK = "back"


@dataclass(frozen=True, slots=True)
class Beat:
    position: int
    draining: bool = False


@dataclass(frozen=True, slots=True)
class Health:
    healthy: bool = False
    last_heartbeat_s: float = 0.0
    stuck_at: int | None = None
    """Where it was taken out as stuck (None: not stuck)."""
    stuck_retry_at: float = 0.0
    stuck_backoff_s: float = 0.0
    """How long it waited the last time it was stuck (doubles while it stays stuck)."""


@dataclass(frozen=True, slots=True)
class Pipeline:
    """How the pipeline stands with the worker."""

    in_flight: int = 0
    progressed_s: float = 0.0
    """When it last answered (or, idle until then, when work reached it)."""


def judge(
    health: Health,
    beat: Beat | None,
    now: float,
    pipeline: Pipeline,
    stuck_after_s: float,
    *,
    dead_after_s: float = DEAD_AFTER_S,
) -> tuple[Health, tuple[Event, ...]]:
    """The worker's health after a heartbeat (``beat`` None: the call failed).
    ``dead_after_s``: the simulator's clocks run ten times faster (``sim/workers.py``)."""
    if beat is None:
        if health.healthy and now - health.last_heartbeat_s > dead_after_s:
            return replace(health, healthy=False), (Event.DEAD,)
        return health, ()
    health = replace(health, last_heartbeat_s=now)
    events: tuple[Event, ...] = ()
    if health.stuck_at is not None:
        moved = beat.position > health.stuck_at
        if not moved and now < health.stuck_retry_at:
            return health, ()  # still stuck where it was
        if moved:
            health = replace(health, stuck_backoff_s=0.0)
        else:
            events = (Event.RETRIED,)
        health = replace(health, stuck_at=None)
    if health.healthy and pipeline.in_flight and now - pipeline.progressed_s > stuck_after_s:
        backoff = min(STUCK_RETRY_MAX_S, max(stuck_after_s, 2 * health.stuck_backoff_s))
        stuck = replace(
            health,
            healthy=False,
            stuck_at=beat.position,
            stuck_backoff_s=backoff,
            stuck_retry_at=now + backoff,
        )
        return stuck, (*events, Event.STUCK)
    if beat.draining and health.healthy:
        return replace(health, healthy=False), (*events, Event.DRAINING)
    if not beat.draining and not health.healthy:
        return replace(health, healthy=True), (*events, Event.BACK)
    return health, events


def choose_testing_worker(fit: Sequence[str], current: str | None) -> str | None:
    """Who tests next among the ``fit`` workers (configured order): the current one while
    it is fit, else the first; None when none is fit."""
    if current in fit:
        return current
    return fit[0] if fit else None


def snapshot_needed(
    tester_position: int, joining_position: int, *, most_behind: int = JOIN_FROM_LOG_MAX
) -> str:
    """Why a worker joining at ``joining_position`` needs a snapshot first ("": it replays
    the log). ``most_behind``: the simulator's schedules are a few transactions long."""
    behind = tester_position - joining_position
    return f"{behind} transactions behind the testing worker" if behind > most_behind else ""


class RestartLoop:
    """Tells a pipeline that restarts in a loop from one that restarts now and then:
    ``RESTART_LOOP_COUNT`` restarts within ``RESTART_LOOP_WINDOW_S``, the last of them
    within the window too. Times are given, so that it can be tested without a clock."""

    def __init__(
        self, *, window_s: float = RESTART_LOOP_WINDOW_S, count: int = RESTART_LOOP_COUNT
    ) -> None:
        """``window_s``: the simulator's clocks run ten times faster (``sim/workers.py``)."""
        self._window_s = window_s
        self._restarts: deque[tuple[float, str]] = deque(maxlen=count)

    def record(self, now: float, why: str) -> None:
        self._restarts.append((now, why))

    def alarm(self, now: float) -> str:
        """The alarm's text, or "" when there is none."""
        restarts, window_s = self._restarts, self._window_s
        if len(restarts) < (restarts.maxlen or 0):
            return ""
        span = restarts[-1][0] - restarts[0][0]
        if span > window_s or now - restarts[-1][0] > window_s:
            return ""
        return (
            f"the pipeline restarted {len(restarts)} times in {span:.0f} s "
            f"(last: {restarts[-1][1]})"
        )


@dataclass(frozen=True, slots=True)
class Storage:
    """A worker's database size and disk, from its heartbeat (0: not known)."""

    database_bytes: int
    disk_free_bytes: int
    disk_total_bytes: int


@dataclass(frozen=True, slots=True)
class StorageWarnings:
    """When a worker's storage draws a warning (``--disk-free-alarm-percent``,
    ``--database-bytes-alarm``): before its disk fills, which stops its applies and takes
    it out, and while its database outgrows what the operator planned for. A warning, not
    an alarm: the worker still applies, so the DC stays healthy (a laptop's or a CI
    host's disk is often over 90% full, and a DC that works must not read as down)."""

    disk_free_percent: int = 10
    database_bytes: int = 0
    """0: no warning on the database's size."""

    def of(self, worker_id: str, storage: Storage) -> list[str]:
        warnings = []
        total, free = storage.disk_total_bytes, storage.disk_free_bytes
        if total and free * 100 < total * self.disk_free_percent:
            warnings.append(
                f"DISK: worker {worker_id} has {free / GIB:.1f} GiB free of "
                f"{total / GIB:.1f} GiB ({free * 100 / total:.0f}%, warned below "
                f"{self.disk_free_percent}%)"
            )
        if self.database_bytes and storage.database_bytes > self.database_bytes:
            warnings.append(
                f"DATABASE SIZE: worker {worker_id}'s database holds "
                f"{storage.database_bytes / GIB:.2f} GiB (warned above "
                f"{self.database_bytes / GIB:.2f} GiB)"
            )
        return warnings


GIB = 1024**3
