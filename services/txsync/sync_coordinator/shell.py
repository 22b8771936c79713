"""The coordinator's shell: when what the core decided may be written, and when sent.

The core's rule is persist before send: each ``Ready`` is applied durable effects first,
then messages. The coordinator applies it across many steps at once, and this module is
that logic, pure (no asyncio, grpc, clock or I/O), so that the simulator runs the very
code production runs (``txsync.sim.cluster``): it answers the shell's writes after drawn
delays, crashes nodes with writes in flight or between a write's answer and its sends,
and checks PROTOCOL.md §4 after every step.

What the shell does with the ``Ready`` of each step:

- merges the durable effects of consecutive steps into one store write, one fsync
  (``effects.MergedPersist``);
- keeps at most ``writes_in_flight_max`` writes unanswered; what is stepped meanwhile
  gathers into the next write, handed over at the first step after an answer frees a
  slot (``step_due`` asks for that step), so that it takes the events that waited too
  (with 16 in flight, small writes and posts each paid fixed costs at both ends: batched
  submits fell from 629 to 457 tx/s, measured);
- seals a gathering that grows past ``flush_metas``, ``flush_changes`` or
  ``flush_write_bytes`` on its own, and then takes no more events (``accepting`` is
  False) until an answer lets it be written; and, before a pushed body (``ArrivedBody``,
  written with the step that acquires it) would take it past ``flush_write_bytes`` or
  ``flush_bodies``, seals it first, so that a write fits one gRPC message and holds the
  bodies the store takes in one step;
- releases each batch's sends only once its write and every earlier write are durable,
  in the order the batches were stepped. A batch with nothing durable needs no write,
  but its sends still wait for the batches before it.

Inputs: ``step(events, now_ms=...)`` (the clock is stepped first) and
``write_durable(seq)`` (the store answered write ``seq``; answers come in the order the
writes were sent). Each returns a ``ShellOutput``: writes to hand to the store, in order,
and releases whose sends may go now, in order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from txsync.protocol import BodyAcquired, Event, ProtocolNode, Ready, Rejected, Tick, TxMeta
from txsync.sync_coordinator.effects import BODY_ENTRY_BYTES_MOST, ArrivedBody, MergedPersist

WRITES_IN_FLIGHT_MAX = 2
"""Store writes sent and not yet durable. What the A/Bs favoured (docs/benchmarks.md)."""
FLUSH_METAS = 2_048
FLUSH_CHANGES = 8_192
"""A gathering is sealed for writing (waiting for a slot if need be) once its merged
effects reach these sizes, well inside the store's per-step limits (16,384 metas, 65,536
changes) even after one more batch of events (a step adds at most post_txs_max metas and
three changes for each)."""
FLUSH_WRITE_BYTES = 1024 * 1024
"""A gathering is sealed once its write may take this many bytes
(``MergedPersist.bytes_bound``), and sealed before a pushed body would take it past
this. So a write holds either less than this before its last event, or one body (at most
4 MiB) and what the step that acquires it adds; the last event adds at most a view
install forgetting the largest incoming queue (65,536 tx ids), its seal twice (installed
and voted for) and two runs of 4,096 metas: about 5.8 MB at most, and a write stays
within gRPC's 8 MiB message (``rpc.MESSAGE_BYTES_MAX``), which the store's channel
enforces. (The shell once bounded bodies alone, at 4 MiB: with a large install in the
same write that could reach 10 MB.)"""
FLUSH_BODIES = 256
"""Pushed bodies per write: at most what the store takes in one step
(``transaction_store.validation.BODIES_PER_CALL_MAX``, not imported: this module stays
free of gRPC). Past it the store refuses the write and the coordinator's incarnation
ends: batched submits put 300 small bodies in one gathering and stopped a coordinator
in make bench."""

ShellEvent = Event | ArrivedBody
"""What the shell steps: the core's events, and pushed bodies (``BodyAcquired`` to the
core, written with the step)."""


@dataclass(frozen=True, slots=True)
class StepWrite:
    """Write ``merged`` to the store; the store answers writes in the order sent."""

    seq: int
    merged: MergedPersist


@dataclass(frozen=True, slots=True)
class Release:
    """One batch's sends, which may go now: every ``Ready``'s messages and bodies, in
    order."""

    readies: tuple[Ready, ...]
    installed: bool
    """The batch installed a view: links follow the configuration before sending."""


@dataclass(slots=True)
class ShellOutput:
    writes: list[StepWrite] = field(default_factory=list)
    releases: list[Release] = field(default_factory=list)
    rejections: list[Rejected] = field(default_factory=list)
    next_tick_ms: int | None = None
    """The last stepped ``Ready``'s: when to step a Tick if nothing else comes."""
    step_due: bool = False
    """A write slot freed while steps are gathered: step soon (a Tick will do). The
    gathering is sealed at the end of that step, with whatever events waited meanwhile:
    sealing it at the answer instead split one write into two, and the sends with it
    (Post +9%, PushBodies +25% per transaction in make bench-rpcs)."""


@dataclass(slots=True)
class _Gathering:
    """The effects of the steps not yet sealed into a batch, merged."""

    merged: MergedPersist = field(default_factory=MergedPersist)
    readies: list[Ready] = field(default_factory=list)

    def add(self, ready: Ready) -> None:
        self.merged.add(ready)
        self.readies.append(ready)


@dataclass(slots=True)
class _Batch:
    """Sealed steps: their write (none if nothing in them is durable) and their sends."""

    readies: tuple[Ready, ...]
    merged: MergedPersist | None
    seq: int = 0
    """Set when handed to the store."""
    durable: bool = False


class ShellError(Exception):
    """An input the shell's contract rules out (an answer for a write never sent, or out
    of order): the caller is broken, and the incarnation must end."""


class Shell:
    def __init__(
        self,
        core: ProtocolNode,
        *,
        writes_in_flight_max: int = WRITES_IN_FLIGHT_MAX,
        flush_metas: int = FLUSH_METAS,
        flush_changes: int = FLUSH_CHANGES,
        flush_write_bytes: int = FLUSH_WRITE_BYTES,
        flush_bodies: int = FLUSH_BODIES,
    ) -> None:
        if writes_in_flight_max < 1:
            raise ValueError("writes_in_flight_max must be at least 1")
        self.core = core
        self._writes_max = writes_in_flight_max
        self._flush_metas = flush_metas
        self._flush_changes = flush_changes
        self._flush_write_bytes = flush_write_bytes
        self._flush_bodies = flush_bodies
        self._gathering = _Gathering()
        self._unreleased: deque[_Batch] = deque()
        """Every sealed batch whose sends have not been released, in order."""
        self._unwritten: deque[_Batch] = deque()
        """Sealed batches with a write that waits for a slot, in order."""
        self._in_flight: deque[_Batch] = deque()
        """Written batches the store has not answered yet, in order."""
        self._last_seq = 0

    @property
    def accepting(self) -> bool:
        """Whether to feed more events: False while a sealed write waits for a slot."""
        return not self._unwritten

    @property
    def writes_in_flight(self) -> tuple[StepWrite, ...]:
        """Writes handed to the store and not answered, oldest first."""
        return tuple(StepWrite(b.seq, b.merged) for b in self._in_flight if b.merged)

    def pending_synced(self) -> list[TxMeta]:
        """Synced entries the core appended that are not durable yet, in order."""
        merged = [*(b.merged for b in self._in_flight), *(b.merged for b in self._unwritten)]
        merged.append(self._gathering.merged)
        return [meta for m in merged if m is not None for meta in m.synced]

    def step(self, events: Iterable[ShellEvent], *, now_ms: int) -> ShellOutput:
        """Step the core with ``Tick(now_ms)``, then once per event, in order.

        The clock goes first: the core takes the time from its latest Tick, so an event
        stepped ahead of it would start its delays (a body fetch, a round's deadline, the
        repost gap) from the time of an older step, after a quiet spell up to a second
        stale. Every caller reads its clock once per batch and hands it here, so none can
        forget (or put it last, as the coordinator once did)."""
        out = ShellOutput()
        for event in (Tick(now_ms), *events):
            if isinstance(event, ArrivedBody):
                event = self._take_body(event)
            ready = self.core.step(event)
            self._gathering.add(ready)
            out.rejections.extend(ready.rejections)
            out.next_tick_ms = ready.next_tick_ms
            if self._is_big(self._gathering.merged):
                self._seal()
        gathering = self._gathering
        if gathering.readies and (
            gathering.merged.is_empty() or (self.accepting and self._slot_free())
        ):
            self._seal()
        self._flush(out)
        return out

    def write_durable(self, seq: int) -> ShellOutput:
        """The store answered write ``seq``: it and every write before it are durable."""
        if not self._in_flight or self._in_flight[0].seq != seq:
            expected = self._in_flight[0].seq if self._in_flight else None
            raise ShellError(f"write {seq} answered; the oldest unanswered is {expected}")
        self._in_flight.popleft().durable = True
        out = ShellOutput()
        self._flush(out)
        out.step_due = bool(self._gathering.readies) and self.accepting and self._slot_free()
        return out

    # --- the rules (broken shells in tests/sim override them) ------------------------------

    def _take_releasable(self) -> list[_Batch]:
        """Persist before send: the batches whose write and every earlier write are
        durable, in order."""
        released = []
        while self._unreleased and self._unreleased[0].durable:
            released.append(self._unreleased.popleft())
        return released

    def _take_body(self, arrived: ArrivedBody) -> Event:
        """A pushed body goes into the write of the step that tells the core of it."""
        merged = self._gathering.merged
        if not merged.is_empty() and (
            merged.bytes_bound() + BODY_ENTRY_BYTES_MOST + len(arrived.body)
            > self._flush_write_bytes
            or len(merged.bodies) >= self._flush_bodies
        ):
            self._seal()
        self._gathering.merged.add_body(arrived)
        return BodyAcquired(arrived.tx_id)

    # --- internals -------------------------------------------------------------------------

    def _is_big(self, merged: MergedPersist) -> bool:
        metas = len(merged.incoming) + len(merged.synced)
        return (
            metas >= self._flush_metas
            or len(merged.changes) >= self._flush_changes
            or merged.bytes_bound() >= self._flush_write_bytes
        )

    def _slot_free(self) -> bool:
        return len(self._in_flight) < self._writes_max

    def _seal(self) -> None:
        gathering, self._gathering = self._gathering, _Gathering()
        if gathering.merged.is_empty():
            batch = _Batch(tuple(gathering.readies), None, durable=True)
        else:
            gathering.merged.local_seq = self.core.local_seq_stepped
            batch = _Batch(tuple(gathering.readies), gathering.merged)
            self._unwritten.append(batch)
        self._unreleased.append(batch)

    def _flush(self, out: ShellOutput) -> None:
        while self._unwritten and self._slot_free():
            batch = self._unwritten.popleft()
            assert batch.merged is not None, "only batches with a write wait for a slot"
            self._last_seq += 1
            batch.seq = self._last_seq
            self._in_flight.append(batch)
            out.writes.append(StepWrite(batch.seq, batch.merged))
        for batch in self._take_releasable():
            installed = batch.merged is not None and batch.merged.installed is not None
            out.releases.append(Release(batch.readies, installed))
