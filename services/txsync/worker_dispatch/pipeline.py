"""One pipeline's decisions as a pure machine: who applies which position, what the store
records, and when a worker is out of sync (PROTOCOL.md §4.7, docs/workers.md).

A pipeline runs over a testing worker and its followers, from the lowest position among
them (or earlier: the store streams from its first unfinished position). Inputs:

- ``entry(Entry)``: the store's next synced transaction, in position order, as it stands
  there (ENQUEUED, TESTING, OK or FAILED), with the DC's digest when it is finished;
- ``answer(Answer)``: a worker's outcome for its oldest request in flight (workers
  answer in order).

Outputs, to be applied in order:

- ``Send``: a request to one worker. Every worker gets each position at most once per
  pipeline; a follower only positions beyond its own.
- ``Record``: a state for the store: TESTING when an ENQUEUED one goes to the testing
  worker, OK or FAILED when the testing worker decides (``decided_by`` is that answer).
- ``OutOfSync``: a worker answered with a digest other than the DC's, or with a digest of
  the rows the transaction touched other than the testing worker's (when both measured
  one). It gets no more work from this pipeline, which must restart without it.

The payload (the transaction's body, as the caller holds it) travels with ``Entry`` to
each ``Send`` untouched, so the machine never looks inside a transaction. No clock, I/O,
asyncio or logging: ``dispatch.py`` applies the outputs over gRPC, and the simulator
(``txsync.sim``) runs the same machine for every DC.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from txsync.protocol import TxState

P = TypeVar("P")

FINISHED = (TxState.OK, TxState.FAILED)


@dataclass(frozen=True, slots=True)
class Entry(Generic[P]):
    position: int
    tx_id: str
    state: TxState
    """As the store has it: ENQUEUED, TESTING, OK or FAILED."""
    digest: bytes
    """The DC's state digest at this position when finished (else empty)."""
    payload: P


@dataclass(frozen=True, slots=True)
class Answer:
    worker: str
    tx_id: str
    ok: bool
    digest: bytes
    touched: bytes = b""
    """The digest of the rows the transaction touched (empty: not measured)."""


@dataclass(frozen=True, slots=True)
class Send(Generic[P]):
    worker: str
    position: int
    tx_id: str
    skip: bool
    """The DC failed it: the worker records it FAILED at this position without running."""
    payload: P


@dataclass(frozen=True, slots=True)
class Record:
    position: int
    tx_id: str
    state: TxState
    decided_by: Answer | None = None
    """The testing worker's answer that made it OK or FAILED (None for TESTING)."""


@dataclass(frozen=True, slots=True)
class OutOfSync:
    worker: str
    reason: str


Output = Send[P] | Record | OutOfSync


class PipelineError(Exception):
    """An input the contract rules out (an answer from a worker with nothing in flight,
    an entry out of order): the caller is broken, and the pipeline must restart."""


@dataclass(slots=True)
class _InFlight(Generic[P]):
    position: int
    expected: bytes
    """The DC's digest there, or empty when this answer decides it (the testing worker)."""
    payload: P
    tx_id: str
    touched: bytes = b""
    """The testing worker's digest of the rows it touched (empty: none to compare)."""


class PipelineMachine(Generic[P]):
    def __init__(self, tester: str, followers: Sequence[str], positions: Mapping[str, int]) -> None:
        """``positions``: each worker's applied position as its heartbeat said."""
        workers = (tester, *followers)
        if len(set(workers)) != len(workers):
            raise ValueError("a worker is named twice")
        self.tester = tester
        self.followers = tuple(followers)
        self.positions = {worker: positions[worker] for worker in workers}
        """Each worker's applied position: its heartbeat's, then its answers'."""
        self.digests: dict[str, bytes] = {}
        """Each worker's state digest as its last answer gave it."""
        self._in_flight: dict[str, deque[_InFlight[P]]] = {w: deque() for w in workers}
        self.out_of_sync: dict[str, str] = {}
        self._last_entry = 0

    @property
    def start(self) -> int:
        """The first position to ask the store for (it may start earlier, at its first
        unfinished one)."""
        return min(self.positions.values()) + 1

    def in_flight(self, worker: str) -> int:
        return len(self._in_flight[worker])

    def entry(self, entry: Entry[P]) -> list[Output[P]]:
        if entry.position <= self._last_entry:
            raise PipelineError(f"entry {entry.position} after {self._last_entry}")
        self._last_entry = entry.position
        out: list[Output[P]] = []
        if entry.state in FINISHED:
            # Done already: only workers behind it need it, following the DC's verdict.
            skip = entry.state is TxState.FAILED
            for worker in (self.tester, *self.followers):
                if self.positions[worker] < entry.position and worker not in self.out_of_sync:
                    flight = _InFlight(entry.position, entry.digest, entry.payload, entry.tx_id)
                    out.append(self._send(worker, flight, skip))
            return out
        if entry.state is TxState.ENQUEUED:
            out.append(Record(entry.position, entry.tx_id, TxState.TESTING))
        # The testing worker decides, even one past it (it answers from its record).
        flight = _InFlight(entry.position, b"", entry.payload, entry.tx_id)
        out.append(self._send(self.tester, flight, False))
        return out

    def answer(self, answer: Answer) -> list[Output[P]]:
        worker = answer.worker
        queue = self._in_flight.get(worker)
        if not queue:
            raise PipelineError(f"{worker} answered with nothing in flight")
        sent = queue.popleft()
        if answer.tx_id != sent.tx_id:
            raise PipelineError(
                f"{worker} answered {answer.tx_id} for position {sent.position} ({sent.tx_id})"
            )
        if sent.expected and answer.digest != sent.expected:
            reason = f"digest differs at position {sent.position} ({answer.tx_id})"
            self.out_of_sync[worker] = reason
            return [OutOfSync(worker, reason)]
        if sent.touched and answer.touched and answer.touched != sent.touched:
            reason = (
                f"the rows {answer.tx_id} touched differ from the testing worker's at "
                f"position {sent.position}"
            )
            self.out_of_sync[worker] = reason
            return [OutOfSync(worker, reason)]
        self.positions[worker], self.digests[worker] = sent.position, answer.digest
        if sent.expected:
            return []  # the DC had decided this one already
        # The testing worker decided: its outcome is the DC's, and the followers follow.
        state = TxState.OK if answer.ok else TxState.FAILED
        out: list[Output[P]] = [Record(sent.position, answer.tx_id, state, answer)]
        for follower in self.followers:
            if self.positions[follower] < sent.position and follower not in self.out_of_sync:
                flight = _InFlight(
                    sent.position, answer.digest, sent.payload, sent.tx_id, answer.touched
                )
                out.append(self._send(follower, flight, not answer.ok))
        return out

    def _send(self, worker: str, flight: _InFlight[P], skip: bool) -> Send[P]:
        self._in_flight[worker].append(flight)
        return Send(worker, flight.position, flight.tx_id, skip, flight.payload)
