"""Which peers a store may let go of (``--peer-hold-max``), as the coordinator reports
them: pure, with the time given, run by the coordinator and by the simulator.

A store lets go of a peer whose order is further behind than its bound: it truncates
past that peer, which then starts from another DC's copy (docs/dc-snapshots.md). A
peer this DC sent a post, catch-up or view message lately is not let go, whatever its
last post said: what is on its way to it may name transactions whose bodies it has yet
to fetch, and
truncating past them left it with a synced transaction whose body no DC held (the
simulator, invariant 4, within the first 60 seeds of `crash` with a bound of 4).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

SERVED_HOLD_MS = 10_000
"""A peer sent anything within this long is not let go: far longer than a message takes
to arrive, or the stream carrying it is torn down and the peer asks again."""


@dataclass(slots=True)
class ServedPeers:
    """When this DC last sent each peer what may carry synced entries: a post, catch-up
    (from its core's memory or its store's txlog), a view message (an install's seal).
    A coordinator that starts knows nothing of what its last run sent: it counts every
    peer served at its start."""

    started_ms: int
    hold_ms: int = SERVED_HOLD_MS
    at_ms: dict[str, int] = field(default_factory=dict)

    def served(self, peer: str, now_ms: int) -> None:
        self.at_ms[peer] = now_ms

    def orders(
        self,
        posted: Mapping[str, int],
        peers: Iterable[str],
        now_ms: int,
        recorded: Mapping[str, int] = MappingProxyType({}),
    ) -> dict[str, int]:
        """How far each of ``peers`` says its order came (``posted``: its latest post's
        synced length), for those its store may let go: heard from since this
        coordinator started, or else recorded by the store (``recorded``: how far its
        order came, as the store last wrote it with a truncation), and not served
        lately. The others are left out, and a store lets go of none it is not told of.

        Without ``recorded``, a coordinator that restarted while a DC was away never heard
        from it, and its store held every transaction until that DC came back
        (``bench.soak --dc-down-s``: 73,288 transactions, 250 MiB)."""
        return {
            peer: length
            for peer in peers
            if (length := posted.get(peer, recorded.get(peer))) is not None
            and now_ms - self.at_ms.get(peer, self.started_ms) >= self.hold_ms
        }
