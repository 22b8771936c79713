"""How long this DC has been behind its peers, in seconds (``txsync_lag_seconds``).

Positions behind (``txsync_lag``) say how much is missing, not for how long: 5,000
positions are a second at a busy peer and an hour at a quiet one. Here, the lag is the
age of the oldest thing a peer had that this DC still lacks: each time a peer's post
shows a synced queue longer than any seen before, the length is noted with the time it
was first seen; once this DC's own queue reaches a length, the notes at or below it are
dropped. The lag is then how long ago the oldest remaining note was made (0 when none
is left). A DC in step with its peers reads the few milliseconds between their merges
and its own; a DC cut off reads the time since the cut.

Pure: the caller passes the time (monotonic seconds).
"""

from __future__ import annotations

from collections import deque

NOTES_MAX = 4_096
"""Lengths remembered at most. Past it, longer lengths are not noted until this DC
catches up with some: the oldest notes, which set the lag, are kept."""


class LagClock:
    def __init__(self) -> None:
        self._notes: deque[tuple[int, float]] = deque()
        """(synced length first seen at a peer, when), lengths increasing."""

    def peer_reached(self, synced_len: int, now: float) -> None:
        """A peer's post shows its synced queue at ``synced_len``."""
        longest = self._notes[-1][0] if self._notes else -1
        if synced_len > longest and len(self._notes) < NOTES_MAX:
            self._notes.append((synced_len, now))

    def seconds_behind(self, own_len: int, now: float) -> float:
        """How long ago a peer first had a position this DC (at ``own_len``) lacks."""
        notes = self._notes
        while notes and notes[0][0] <= own_len:
            notes.popleft()
        return max(0.0, now - notes[0][1]) if notes else 0.0
