"""Cross-DC divergence detection: every DC's finished outcomes, compared by position.

Each DC's coordinator follows its store's finished transactions (OK or FAILED with the
testing worker's running state digest) and piggybacks the new ones on its posts (at most
``OUTCOMES_PER_POST``); every coordinator compares what the others report with its own
outcome at the same position. The digest chains a worker's whole history, so DCs whose
workers applied the same order alike hold equal digests at every position; the first
position where two DCs differ is where they went apart. A lost post only delays
detection: any later position differs too.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from dataclasses import dataclass
from itertools import takewhile
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import StatusCode

from txsync.telemetry import tracer
from txsync.telemetry.logs import event as log_event

log = logging.getLogger(__name__)

OUTCOMES_KEPT = 8_192
"""Positions remembered, ours and the peers' (older ones are forgotten). A peer further
behind is compared from where it reaches what is kept: the digests chain, so a
divergence shows at every later position too. 65,536 made the coordinator's memory
grow with the history up to there (about 16 MB of outcomes, issue 47)."""
OUTCOMES_PER_POST = 1_024
ALARMS_KEPT = 100


@dataclass(frozen=True, slots=True)
class Finished:
    position: int
    tx_id: str
    ok: bool
    state_digest: bytes

    def differs(self, other: Finished) -> bool:
        """Another transaction or verdict at the position, or another digest where both
        know theirs. A DC that started from a copy knows the verdict at the copy's
        position but not the digest the source's worker reached there (it holds the
        copy's database, whose later digests chain from it): compared on that digest,
        every DC raised a DIVERGENCE alarm for good (``bench.soak --dc-down-s``)."""
        if (self.tx_id, self.ok) != (other.tx_id, other.ok):
            return True
        return bool(self.state_digest and other.state_digest) and (
            self.state_digest != other.state_digest
        )

    def describe(self) -> str:
        verdict = "OK" if self.ok else "FAILED"
        return f"{verdict} {self.state_digest.hex()[:12]}"


class OutcomeLedger:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.own: OrderedDict[int, Finished] = OrderedDict()
        self._theirs: OrderedDict[int, dict[str, Finished]] = OrderedDict()
        self.alarms: deque[str] = deque(maxlen=ALARMS_KEPT)
        self.alarm_count = 0
        self.compared = 0
        self._diverged: set[str] = set()
        """Peers already reported: one alarm per peer, at the first position seen."""

    def add_own(self, finished: Finished) -> None:
        self.own[finished.position] = finished
        _trim(self.own)
        for peer, theirs in self._theirs.pop(finished.position, {}).items():
            self._compare(finished, peer, theirs)

    def add_theirs(self, peer: str, finished: Finished) -> None:
        ours = self.own.get(finished.position)
        if ours is not None:
            self._compare(ours, peer, finished)
            return
        self._theirs.setdefault(finished.position, {})[peer] = finished
        _trim(self._theirs)

    def since(self, position: int) -> list[Finished]:
        """Our outcomes after ``position``, oldest first, at most one post's worth. Runs
        for every post to every peer, so it walks back only over what is new (positions
        are added in increasing order) instead of over everything kept."""
        fresh = list(takewhile(lambda f: f.position > position, reversed(self.own.values())))
        return fresh[::-1][:OUTCOMES_PER_POST]

    def _compare(self, ours: Finished, peer: str, theirs: Finished) -> None:
        self.compared += 1
        if not ours.differs(theirs) or peer in self._diverged:
            return
        self._diverged.add(peer)
        self.alarm_count += 1
        alarm = (
            f"DIVERGENCE at position {ours.position}: {self.node_id} has {ours.tx_id} "
            f"{ours.describe()}, {peer} has {theirs.tx_id} {theirs.describe()}"
        )
        self.alarms.append(alarm)
        log.error("%s", alarm, extra=log_event("divergence", peer=peer, position=ours.position))
        # A span of its own, marked as an error, so that Jaeger shows where it was found
        # (and an event on the call that brought it, if one is traced).
        attributes: dict[str, str | int] = {
            "txsync.dc": self.node_id,
            "txsync.peer": peer,
            "txsync.position": ours.position,
            "txsync.ours": f"{ours.tx_id} {ours.describe()}",
            "txsync.theirs": f"{theirs.tx_id} {theirs.describe()}",
        }
        trace.get_current_span().add_event("txsync.divergence", attributes)
        span = tracer().start_span("txsync.divergence", attributes=attributes)
        span.set_status(StatusCode.ERROR, alarm)
        span.end()


def _trim(entries: OrderedDict[int, Any]) -> None:
    while len(entries) > OUTCOMES_KEPT:
        entries.popitem(last=False)
