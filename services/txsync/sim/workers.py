"""Each simulated DC's worker side: worker-dispatch's own ``PipelineMachine`` over a few
simulated workers, fed from the DC's store (``sim/store.py``) as ``FollowEnqueued``
feeds it: a position once its synced entry is durable (PROTOCOL.md §4.7).

A simulated worker applies a transaction by extending a hash chain, as a real one
extends its state digest; whether a transaction fails is a function of its id, so that
every replica of it decides the same. Requests and answers take a drawn 1-5 ms. What
dispatch decides reaches the store after a drawn 0-6 ms, in order, and the store's own
rules take it (``plan_verdicts``: TESTING in memory until its outcome, a passed state a
repeat, two different verdicts refused); a dispatch that dies (with its DC) loses the
records still on their way, and the store what it had not written, which leaves
positions TESTING or ENQUEUED behind workers that applied them, as a real crash does.

Dispatch judges its workers as the service does: it heartbeats each one and runs
worker-dispatch's own ``health.judge`` on the answer (or the silence), at the simulator's
pace (every 100 ms, dead after 300 ms without an answer, stuck after 1 s without an
outcome: the service's seconds divided by ten, as ``SIM_TIMING`` divides the
protocol's). The pipeline runs over the workers judged healthy, from the positions
dispatch last heard of; a change of that set restarts it, and so does a stream to a
worker that has died, 200 ms later, as ``Dispatch.run`` does (with the dead worker in it
again, until the heartbeats say it is dead).

Faults (with ``crash``): workers crash and restart (their history is durable, as a
database's commit is); dispatch is out of the pipeline while its DC is down, and
forgets what it judged. Dispatch reports the lowest position it feeds to the store,
which truncates what every worker and peer passed (``sim/store.py``); a worker whose
next position is gone is restored from a copy of the testing worker, as
``Dispatch.watch_recoveries`` does. A pipeline (re)start feeds from the lowest position among its
workers, or the store's first unfinished one.

Checks (invariant 7): a worker applies each position once, after the one before; every
worker of every DC holds the same digest at a position; every DC records the same
outcome for a transaction; no worker that is up is judged stuck (the pipeline left it
waiting); no pipeline restarts in a loop (dispatch's ``RestartLoop`` alarm) where no
fault is left to restart it; and, once the network heals, every worker that is up has
applied the whole synced queue and every transaction is finished.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from txsync.protocol import NodeId, TxId, TxState
from txsync.sim.invariants import InvariantChecker, InvariantViolation
from txsync.sim.store import SimStore
from txsync.transaction_store.step_rules import first_unfinished
from txsync.worker_dispatch.health import (
    RESTART_LOOP_WINDOW_S,
    Beat,
    Event,
    Health,
    Pipeline,
    RestartLoop,
    choose_testing_worker,
    judge,
    snapshot_needed,
)
from txsync.worker_dispatch.pipeline import (
    FINISHED,
    Answer,
    Entry,
    OutOfSync,
    Output,
    PipelineError,
    PipelineMachine,
    Record,
    Send,
)

WORKERS_PER_DC = 2
LINK_MS = (1, 5)
"""A request or an answer between dispatch and a worker."""
RECORD_MS = (0, 6)
"""The store recording a state dispatch decided."""
HEARTBEAT_MS = 100
DEAD_AFTER_MS = 300
STUCK_AFTER_MS = 1_000
"""Dispatch's ``HEARTBEAT_S``, ``DEAD_AFTER_S`` and default ``stuck_after_s``, divided
by ten: a worker down for a while (50-1,500 ms) is judged dead now and then."""
JOIN_FROM_LOG_MOST = 5
"""A worker back further than this behind the testing worker starts from its snapshot
(dispatch's ``JOIN_FROM_LOG_MAX`` is 100: a schedule here is 20 transactions)."""
LOOP_WINDOW_S = RESTART_LOOP_WINDOW_S / 10
"""Dispatch's restart-loop window at this pace (its count stays 20)."""
STREAM_ERROR_PAUSE_MS = 200
"""After a worker's stream failed, the pipeline restarts this much later
(``Dispatch.run``)."""

MachineFactory = Callable[..., PipelineMachine[None]]
Judge = Callable[..., tuple[Health, tuple[Event, ...]]]
"""``health.judge``, or a broken one (tests/sim)."""
RecordAtStore = Callable[[NodeId, TxId, TxState, bytes], None]
"""Hands a state dispatch decided to the DC's store: (node, tx id, state, DC digest)."""
ReportToStore = Callable[[NodeId, int | None], int]
"""Dispatch's progress report (the lowest position of the workers it feeds, None: no
such worker); answers the first synced position the store still holds."""


def runs_ok(tx_id: TxId) -> bool:
    """Whether a transaction succeeds when run: about one in eight fails, everywhere."""
    return hashlib.sha256(tx_id.encode()).digest()[0] >= 32


HistoryEntry = tuple[TxId, bool, bytes]
"""What a worker applied at a position: tx id, whether it ran OK, digest after it."""


@dataclass(slots=True)
class SimWorker:
    worker_id: str
    up: bool = True
    incarnation: int = 0
    """Bumped at each crash: a stream to an earlier process delivers nothing more."""
    requests_clock: int = 0
    answers_clock: int = 0
    """When the newest request to it, and answer from it, arrives: streams are FIFO."""
    history: list[HistoryEntry] = field(default_factory=list)
    """What it applied at each position: tx id, whether it ran OK, digest after it."""

    @property
    def position(self) -> int:
        return len(self.history)

    def apply(self, position: int, tx_id: TxId, skip: bool) -> tuple[bool, bytes]:
        """Run (or, ``skip``, record as failed) the transaction at ``position``; a
        position it has is answered from its record, as a real worker does."""
        if position <= self.position:
            recorded_tx, ok, digest = self.history[position - 1]
            if recorded_tx != tx_id:
                raise InvariantViolation(
                    7, f"{self.worker_id} has {recorded_tx} at {position}, was sent {tx_id}"
                )
            return ok, digest
        if position != self.position + 1:
            raise InvariantViolation(
                7, f"{self.worker_id} at {self.position} was sent position {position}"
            )
        ok = not skip and runs_ok(tx_id)
        before = self.history[-1][2] if self.history else b""
        digest = hashlib.sha256(before + tx_id.encode() + bytes([ok])).digest()
        self.history.append((tx_id, ok, digest))
        return ok, digest


@dataclass(frozen=True, slots=True)
class WorkerRequest:
    node: NodeId
    generation: int
    incarnation: int
    """The worker process the pipeline's stream reached (-1: none, it was down)."""
    send: Send[None]


@dataclass(frozen=True, slots=True)
class WorkerAnswer:
    node: NodeId
    generation: int
    answer: Answer


@dataclass(frozen=True, slots=True)
class StateRecorded:
    node: NodeId
    incarnation: int
    """The dispatch process that sent it: one that died lost what was on its way."""
    record: Record


@dataclass(frozen=True, slots=True)
class WorkerCrash:
    node: NodeId
    worker_id: str


@dataclass(frozen=True, slots=True)
class WorkerRestart:
    node: NodeId
    worker_id: str


@dataclass(frozen=True, slots=True)
class PipelineRestart:
    node: NodeId
    generation: int


@dataclass(frozen=True, slots=True)
class Heartbeats:
    """Dispatch asks each of its workers for a heartbeat and judges the answers."""

    node: NodeId
    incarnation: int


WorkerEvent = (
    WorkerRequest
    | WorkerAnswer
    | StateRecorded
    | WorkerCrash
    | WorkerRestart
    | PipelineRestart
    | Heartbeats
)


@dataclass(slots=True)
class _Dispatch:
    """One DC's dispatch and its workers."""

    node: NodeId
    workers: dict[str, SimWorker]
    up: bool = True
    incarnation: int = 0
    last_record_ms: int = 0
    """When the store records this incarnation's newest state: records keep their order."""
    generation: int = 0
    """Bumped at each pipeline (re)start and dispatch crash: older events are void."""
    machine: PipelineMachine[None] | None = None
    tester: str | None = None
    next_position: int = 0
    """The next position to feed the running machine."""
    health: dict[str, Health] = field(default_factory=dict)
    """What this incarnation judged of each worker (all out until heard from)."""
    positions: dict[str, int] = field(default_factory=dict)
    """Where each worker stood when dispatch last heard (a heartbeat that brought it
    back, an answer): the pipeline starts from these, as the service's does."""
    progressed_ms: dict[str, int] = field(default_factory=dict)
    """When each worker last answered, or when work reached it idle (``Pipeline``)."""
    beaten: bool = False
    """This incarnation heard its first heartbeats: the pipeline runs from then on."""
    needs_snapshot: set[str] = field(default_factory=set)
    """Workers whose next position the store truncated: out of the pipeline until a
    snapshot of the testing worker brings them past it (``Dispatch.watch_recoveries``)."""
    history_from: int = 0
    """The store's first synced position, as its last answer to a report said."""
    restarts: RestartLoop = field(default_factory=lambda: RestartLoop(window_s=LOOP_WINDOW_S))
    """Dispatch's own restart-loop alarm over this incarnation's pipeline restarts."""
    broken_streams: set[tuple[int, str]] = field(default_factory=set)
    """(generation, worker) of the pipeline streams that failed: nothing more sent on
    one arrives, as on a gRPC stream that ended."""


class WorkerSide:
    """The worker side of every simulated DC."""

    def __init__(
        self,
        nodes: Sequence[NodeId],
        *,
        rng: random.Random,
        at: Callable[[int, Any], None],
        checker: InvariantChecker,
        store: Callable[[NodeId], SimStore],
        record: RecordAtStore,
        report: ReportToStore,
        machine_factory: MachineFactory = PipelineMachine,
        health_judge: Judge = judge,
        workers_crash: bool = True,
    ) -> None:
        """``store(node)``: the node's store; ``record``: hands it a decided state;
        ``at(ms, event)``: schedule one of this module's events (``Simulation`` hands
        them back to ``handle``); ``workers_crash``: the schedule crashes workers and
        DCs, which restart pipelines until the faults end."""
        self._rng, self._at, self._checker = rng, at, checker
        self._store, self._record, self._report = store, record, report
        self._factory = machine_factory
        self._judge = health_judge
        self._loops_fail = not workers_crash
        """Whether dispatch's restart-loop alarm fails the seed now: from the start when
        nothing crashes (nothing else restarts a pipeline), else once the faults ended."""
        self._now = 0
        self._dcs = {
            node: _Dispatch(node, {f"{node}-w{i}": SimWorker(f"{node}-w{i}")
                                   for i in range(1, WORKERS_PER_DC + 1)})
            for node in nodes
        }  # fmt: skip
        self._digests: list[bytes] = []
        """The digest every worker must hold at each position (the first one seen)."""
        self._outcomes: dict[TxId, TxState] = {}
        """The outcome every DC must record for each transaction (the first one seen)."""
        self.snapshots = 0
        """Workers restored from a snapshot of their testing worker."""
        self.dc_copies = 0
        """DCs started from a copy of another DC's testing worker."""

    # --- driven by the simulation ----------------------------------------------------------

    def schedule_faults(self, window_ms: int) -> None:
        for _ in range(self._rng.randint(1, len(self._dcs))):
            dc = self._rng.choice(sorted(self._dcs))
            worker = self._rng.choice(sorted(self._dcs[dc].workers))
            self._at(self._rng.randrange(window_ms), WorkerCrash(dc, worker))

    def heal(self, now: int) -> None:
        """Faults are over: every worker comes back (dispatch hears of it by itself)."""
        self._now = now
        for dc in self._dcs.values():
            for worker in dc.workers.values():
                worker.up = True
            dc.restarts = RestartLoop(window_s=LOOP_WINDOW_S)  # what the faults caused
        self._loops_fail = True

    def dc_crashed(self, node: NodeId, now: int) -> None:
        """The DC's processes died: dispatch with the records on their way."""
        self._now = now
        dc = self._dcs[node]
        dc.up = False
        dc.incarnation += 1
        dc.generation += 1
        dc.machine = None

    def dc_started(self, node: NodeId, now: int) -> None:
        """Dispatch starts knowing nothing of its workers: it heartbeats them first."""
        self._now = now
        dc = self._dcs[node]
        dc.up = True
        dc.restarts = RestartLoop(window_s=LOOP_WINDOW_S)  # a new process
        dc.health = {worker: Health() for worker in dc.workers}
        dc.positions.clear()
        dc.progressed_ms.clear()
        dc.needs_snapshot.clear()
        dc.history_from = 0
        dc.beaten = False
        self._at(now, Heartbeats(node, dc.incarnation))

    def synced_changed(self, node: NodeId, now: int) -> None:
        """The node's durable queue or states moved: feed what became ENQUEUED."""
        self._now = now
        self._feed(self._dcs[node])

    def handle(self, event: WorkerEvent, now: int) -> None:
        self._now = now
        dc = self._dcs[event.node]
        match event:
            case WorkerRequest(generation=generation, incarnation=incarnation, send=send):
                worker = dc.workers[send.worker]
                stream = (generation, send.worker)
                if stream in dc.broken_streams:
                    return
                if not worker.up or worker.incarnation != incarnation:
                    # Its stream died with it (or never reached it): nothing later on
                    # that stream arrives, and the pipeline fails and starts again.
                    dc.broken_streams.add(stream)
                    if generation == dc.generation and dc.machine is not None:
                        self._restart_soon(dc, STREAM_ERROR_PAUSE_MS, f"{send.worker} is gone")
                    return
                ok, digest = worker.apply(send.position, send.tx_id, send.skip)
                self._check_digest(worker, send.position, digest)
                answer = Answer(worker.worker_id, send.tx_id, ok, digest)
                worker.answers_clock = max(self._later(LINK_MS), worker.answers_clock)
                self._at(worker.answers_clock, WorkerAnswer(dc.node, generation, answer))
            case WorkerAnswer(generation=generation, answer=answer):
                if dc.machine is None or generation != dc.generation:
                    return  # for a pipeline that is gone
                if not dc.workers[answer.worker].up:
                    return
                try:
                    outputs = dc.machine.answer(answer)
                except PipelineError as error:
                    raise InvariantViolation(7, f"{dc.node}: {error}") from error
                dc.positions[answer.worker] = dc.machine.positions[answer.worker]
                dc.progressed_ms[answer.worker] = self._now
                self._carry_out(dc, outputs)
            case StateRecorded(incarnation=incarnation, record=record):
                if incarnation == dc.incarnation:
                    self._recorded(dc, record)
            case WorkerCrash(worker_id=worker_id):
                worker = dc.workers[worker_id]
                if worker.up:
                    worker.up = False
                    worker.incarnation += 1
                    machine = dc.machine
                    if machine is not None and worker_id in machine.positions:
                        self._restart_soon(dc, STREAM_ERROR_PAUSE_MS, f"{worker_id} crashed")
                    self._at(self._later((50, 1_500)), WorkerRestart(dc.node, worker_id))
            case WorkerRestart(worker_id=worker_id):
                dc.workers[worker_id].up = True  # dispatch hears it at a heartbeat
            case PipelineRestart(generation=generation):
                if generation == dc.generation and dc.up:
                    self._start_pipeline(dc)
            case Heartbeats(incarnation=incarnation):
                if dc.up and incarnation == dc.incarnation:
                    self._heartbeats(dc)

    def check_converged(self, nodes: Sequence[NodeId]) -> None:
        """Every worker that is up applied the whole synced queue, and every DC finished
        every transaction in it."""
        for node in nodes:
            dc = self._dcs[node]
            durable = self._store(node).durable
            for worker in dc.workers.values():
                if worker.up and worker.position != durable.synced_len:
                    raise InvariantViolation(
                        5, f"{worker.worker_id} applied {worker.position} of {durable.synced_len}"
                    )
            position = first_unfinished(durable, 1, ())
            meta = durable.synced_at(position - 1)
            if meta is not None:
                raise InvariantViolation(5, f"{node} never finished {meta.tx_id}")

    def converged(self, nodes: Sequence[NodeId]) -> bool:
        try:
            self.check_converged(nodes)
        except InvariantViolation:
            return False
        return True

    # --- dispatch --------------------------------------------------------------------------

    def _heartbeats(self, dc: _Dispatch) -> None:
        """Each worker's heartbeat judged (``health.judge``): a worker that is down
        does not answer. A change of who is healthy restarts the pipeline; the first
        heartbeats of an incarnation start it."""
        now_s = self._now / 1_000
        changed = False
        for worker_id, worker in sorted(dc.workers.items()):
            machine = dc.machine
            in_flight = 0
            if machine is not None and worker_id in machine.positions:
                in_flight = machine.in_flight(worker_id)
            progressed_s = dc.progressed_ms.get(worker_id, 0) / 1_000
            beat = Beat(worker.position) if worker.up else None
            health, events = self._judge(
                dc.health[worker_id], beat, now_s, Pipeline(in_flight, progressed_s),
                STUCK_AFTER_MS / 1_000, dead_after_s=DEAD_AFTER_MS / 1_000,
            )  # fmt: skip
            dc.health[worker_id] = health
            if Event.STUCK in events and worker.up:
                # A simulated worker answers within milliseconds, and a stream to one
                # that died restarts the pipeline: a second of silence is dispatch's.
                raise InvariantViolation(
                    7, f"{worker_id} judged stuck: {in_flight} in flight, no outcome for 1 s"
                )
            if Event.BACK in events:
                dc.positions[worker_id] = worker.position
                # Judged again from the position it reports now (``_on_event``): far
                # behind the testing worker, or behind the store's history.
                dc.needs_snapshot.discard(worker_id)
                tester = dc.tester
                if (
                    tester is not None
                    and tester != worker_id
                    and dc.health[tester].healthy
                    and snapshot_needed(
                        dc.positions.get(tester, 0),
                        worker.position,
                        most_behind=JOIN_FROM_LOG_MOST,
                    )
                ):
                    dc.needs_snapshot.add(worker_id)
                self._mark_behind_history(dc, worker_id)
            changed |= any(event is not Event.RETRIED for event in events)
        changed |= self._report_progress(dc)
        changed |= self._recover(dc)
        if not dc.beaten:
            dc.beaten = True
            self._start_pipeline(dc)
        elif changed:
            self._restart_soon(dc, 0, "the set of healthy workers changed")
        self._at(self._now + HEARTBEAT_MS, Heartbeats(dc.node, dc.incarnation))

    def _report_progress(self, dc: _Dispatch) -> bool:
        """``Dispatch.report_progress``: the lowest position among the workers the
        pipeline feeds; the store's answer marks those its history no longer covers.
        True if one was marked."""
        fed = [
            position
            for worker_id, position in dc.positions.items()
            if dc.health[worker_id].healthy and worker_id not in dc.needs_snapshot
        ]
        dc.history_from = self._report(dc.node, min(fed) if fed else None)
        marked = False
        for worker_id in sorted(dc.workers):
            if dc.health[worker_id].healthy:  # only workers heard from
                marked |= self._mark_behind_history(dc, worker_id)
        return marked

    # --- a DC started from another DC's snapshot (docs/dc-snapshots.md) -------------------

    def export_copy(self, node: NodeId) -> tuple[int, TxState, list[HistoryEntry]] | None:
        """A copy of ``node``'s testing worker (``ExportSnapshot``, asked across DCs):
        its position, how it applied the transaction there, and its history; None when
        dispatch, or the tester, is not up and judged healthy (asked again later)."""
        dc = self._dcs[node]
        tester = dc.workers.get(dc.tester or "")
        if not dc.up or tester is None or not tester.up or tester.position == 0:
            return None
        if not dc.health[tester.worker_id].healthy:
            return None
        ok = tester.history[-1][1]
        return tester.position, TxState.OK if ok else TxState.FAILED, list(tester.history)

    def adopt_copy(self, node: NodeId, history: list[HistoryEntry]) -> None:
        """``node``'s workers take the copy (the testing worker imports it, the others
        copy it within the DC: ``watch_recoveries``), while the DC is down."""
        dc = self._dcs[node]
        assert not dc.up, "a DC adopts a copy while it restarts"
        for worker in dc.workers.values():
            assert worker.position < len(history), "a DC adopts only a copy ahead of it"
            worker.history = list(history)
        self.dc_copies += 1

    def _mark_behind_history(self, dc: _Dispatch, worker_id: str) -> bool:
        """``Dispatch._mark_behind_history``: true if the worker was marked just now."""
        position = dc.positions.get(worker_id)
        if worker_id in dc.needs_snapshot or position is None or position + 1 >= dc.history_from:
            return False
        dc.needs_snapshot.add(worker_id)
        return True

    def _recover(self, dc: _Dispatch) -> bool:
        """``Dispatch.watch_recoveries``: a worker that needs a snapshot and is up gets
        the testing worker's (its whole history, as a database copy brings it), then
        the pipeline replays the log from there. True if one was restored."""
        tester = dc.workers.get(dc.tester or "")
        if (
            tester is None
            or not tester.up
            or not dc.health[tester.worker_id].healthy
            or tester.worker_id in dc.needs_snapshot
        ):
            return False
        restored = False
        for worker_id in sorted(dc.needs_snapshot):
            worker = dc.workers[worker_id]
            if not worker.up or not dc.health[worker_id].healthy:
                continue
            worker.history = list(tester.history)
            dc.positions[worker_id] = worker.position
            dc.needs_snapshot.discard(worker_id)
            self.snapshots += 1
            restored = True
        return restored

    def _restart_soon(self, dc: _Dispatch, after_ms: int, why: str) -> None:
        """The pipeline stops, and is built anew ``after_ms`` later. Dispatch's
        restart-loop alarm (``RestartLoop``, at the simulator's pace) is a violation
        where no fault is left to make a pipeline restart again and again."""
        now_s = self._now / 1_000
        dc.restarts.record(now_s, why)
        if self._loops_fail and (alarm := dc.restarts.alarm(now_s)):
            raise InvariantViolation(7, f"{dc.node}: {alarm}, no fault left to cause it")
        dc.generation += 1
        dc.machine = None
        self._at(self._now + after_ms, PipelineRestart(dc.node, dc.generation))

    def _start_pipeline(self, dc: _Dispatch) -> None:
        """Over the workers judged healthy, from where dispatch last heard they were."""
        ready = [
            w for w in sorted(dc.workers) if dc.health[w].healthy and w not in dc.needs_snapshot
        ]
        if not ready:
            dc.tester = None
            return
        dc.tester = choose_testing_worker(ready, dc.tester)
        followers = [w for w in ready if w != dc.tester]
        positions = {w: dc.positions[w] for w in ready}
        for worker_id in ready:
            dc.progressed_ms[worker_id] = self._now
        dc.machine = self._factory(dc.tester, followers, positions)
        # The store streams from the lowest position, or its first unfinished one (in
        # what is durable: the store counts a verdict still being written unfinished).
        unfinished = first_unfinished(self._store(dc.node).durable, 1, ())
        dc.next_position = min(dc.machine.start, unfinished)
        self._feed(dc)

    def _feed(self, dc: _Dispatch) -> None:
        machine = dc.machine
        if machine is None or not dc.up:
            return
        # FollowEnqueued streams a position once the log holds it ENQUEUED, in order (a
        # synced entry still on its way to disk may be taken back by a crash), with the
        # record as memory holds it.
        store = self._store(dc.node)
        durable = store.durable
        while dc.next_position <= durable.synced_len:
            position = dc.next_position
            meta = durable.synced_at(position - 1)
            if meta is None or position <= store.state.synced_offset:
                # FollowEnqueued refuses a truncated position (``Refused.TRUNCATED``): the
                # stream fails, and the pipeline starts again without the worker behind.
                dc.history_from = store.history_from()
                for worker_id in sorted(dc.workers):
                    self._mark_behind_history(dc, worker_id)
                self._restart_soon(dc, STREAM_ERROR_PAUSE_MS, f"position {position} truncated")
                return
            tx_id = meta.tx_id
            written = durable.txs[tx_id].state
            if written is None or written < TxState.ENQUEUED:
                return
            record = store.state.txs[tx_id]
            digest = record.outcome.state_digest if record.outcome is not None else b""
            dc.next_position += 1
            entry = Entry(position, tx_id, record.state or written, digest, None)
            try:
                outputs = machine.entry(entry)
            except PipelineError as error:
                raise InvariantViolation(7, f"{dc.node}: {error}") from error
            self._carry_out(dc, outputs)
            if dc.machine is not machine:
                return

    def _carry_out(self, dc: _Dispatch, outputs: list[Output[None]]) -> None:
        for output in outputs:
            match output:
                case Send(worker=worker_id):
                    worker = dc.workers[worker_id]
                    machine = dc.machine
                    if machine is not None and machine.in_flight(worker_id) == 1:
                        dc.progressed_ms[worker_id] = self._now  # idle until now
                    worker.requests_clock = max(self._later(LINK_MS), worker.requests_clock)
                    # A stream opened to a worker that is down reaches no process.
                    incarnation = worker.incarnation if worker.up else -1
                    request = WorkerRequest(dc.node, dc.generation, incarnation, output)
                    self._at(worker.requests_clock, request)
                case Record():
                    at = max(self._later(RECORD_MS), dc.last_record_ms)
                    dc.last_record_ms = at
                    self._at(at, StateRecorded(dc.node, dc.incarnation, output))
                case OutOfSync(worker=worker, reason=reason):
                    # Simulated workers are deterministic: a digest that differs is a bug.
                    raise InvariantViolation(7, f"{dc.node}: {worker} out of sync: {reason}")

    def _recorded(self, dc: _Dispatch, record: Record) -> None:
        """What dispatch decided reaches the store, in order (also a restarted
        pipeline's: the process and its queue of records live on)."""
        digest = record.decided_by.digest if record.decided_by is not None else b""
        self._record(dc.node, record.tx_id, record.state, digest)
        if record.state in FINISHED:
            agreed = self._outcomes.setdefault(record.tx_id, record.state)
            if agreed is not record.state:
                raise InvariantViolation(
                    7,
                    f"{dc.node} recorded {record.tx_id} {record.state.name}, "
                    f"another DC {agreed.name}",
                )
        self._feed(dc)

    def _check_digest(self, worker: SimWorker, position: int, digest: bytes) -> None:
        if position > len(self._digests):
            self._digests.append(digest)
        elif self._digests[position - 1] != digest:
            raise InvariantViolation(
                7, f"{worker.worker_id} holds another digest at position {position}"
            )

    def _later(self, span: tuple[int, int]) -> int:
        return self._now + self._rng.randint(*span)
