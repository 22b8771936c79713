"""How long something has been behind, in seconds: a DC behind its peers
(``txsync_lag_seconds``), a worker behind its DC's feed (``txsync_worker_lag_seconds``).

Positions behind (``txsync_lag``) say how much is missing, not for how long: 5,000
positions are a second at a busy peer and an hour at a quiet one. Here, the lag is the
age of the oldest thing the leader had that the follower still lacks: each time the
leader (a peer's posts, the store's feed) shows a synced length longer than any seen
before, the length is noted with the time it was first seen. A follower at a length
lags by how long ago the first note above its length was made (0 when none is above
it). Notes at or below what every follower has are forgotten. A DC in step with its
peers reads the few milliseconds between their merges and its own; a DC cut off reads
the time since the cut.

Pure: the caller passes the time (monotonic seconds).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque

NOTES_MAX = 4_096
"""Lengths remembered at most. Past it, longer lengths are not noted until the followers
catch up with some: the oldest notes, which set the lag, are kept."""


class LagClock:
    def __init__(self) -> None:
        self._notes: deque[tuple[int, float]] = deque()
        """(synced length first seen at the leader, when), lengths increasing."""

    def reached(self, synced_len: int, now: float) -> None:
        """The leader shows its synced queue at ``synced_len``."""
        longest = self._notes[-1][0] if self._notes else -1
        if synced_len > longest and len(self._notes) < NOTES_MAX:
            self._notes.append((synced_len, now))

    def forget_up_to(self, synced_len: int) -> None:
        """Every follower has ``synced_len``: notes at or below it no longer matter."""
        notes = self._notes
        while notes and notes[0][0] <= synced_len:
            notes.popleft()

    def seconds_behind(self, own_len: int, now: float) -> float:
        """How long ago the leader first had a position a follower at ``own_len`` lacks."""
        first_above = bisect_right(self._notes, own_len, key=lambda note: note[0])
        if first_above == len(self._notes):
            return 0.0
        return max(0.0, now - self._notes[first_above][1])
