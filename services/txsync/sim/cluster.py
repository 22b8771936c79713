"""A whole cluster of protocol cores in one thread, driven by one seeded random source.

Everything that happens is an event on one time-ordered heap: a message or body arriving,
a node's timer, a client's submit, a crash or restart, a partition or its healing. The
same seed always yields the same run, so any failure replays from its seed alone.

Each node runs the coordinator's own ``Shell`` around its core: the shell merges the
core's durable effects into writes, keeps a few in flight and releases sends only once
they are durable. The simulated store answers each write after a drawn delay, in order,
and keeps exactly what was written (a peer's body with the step that acquired it, as
the coordinator writes it); after a crash the node restarts from that durable state
alone. A crash may come with writes in flight (the store kept a random prefix of them) or
between a write's answer and the sends it releases.
"""

from __future__ import annotations

import heapq
import random
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from txsync.protocol import (
    Ballot,
    BodyAcquired,
    ConfigChange,
    ConfigChangeSynced,
    DurableState,
    FetchBody,
    Limits,
    LocalTx,
    MergeBase,
    NodeId,
    Post,
    PostReceived,
    ProtocolNode,
    PushBody,
    Ready,
    RoundEnded,
    RoundStarted,
    SendPost,
    SendSyncedEntries,
    SendViewMessage,
    ServeCatchUpFromLog,
    SyncedEntries,
    SyncedEntriesReceived,
    Tick,
    Timing,
    TxId,
    TxMeta,
    TxState,
    ViewAccepted,
    ViewMessageReceived,
    ViewPromise,
    ViewProposal,
)
from txsync.protocol.model import Message
from txsync.sim.faults import FaultMix
from txsync.sim.invariants import InvariantChecker, InvariantViolation
from txsync.sim.workers import MachineFactory, WorkerEvent, WorkerSide
from txsync.sync_coordinator.effects import ArrivedBody, MergedPersist
from txsync.sync_coordinator.shell import Shell, ShellEvent, ShellOutput, StepWrite
from txsync.worker_dispatch.pipeline import PipelineMachine

NodeFactory = Callable[..., ProtocolNode]
ShellFactory = Callable[..., Shell]

SIM_TIMING = Timing(
    round_timeout_ms=150,
    idle_interval_ms=300,
    repost_gap_ms=2,
    body_fetch_delay_ms=20,
    body_fetch_retry_ms=40,
    body_fetch_retry_max_ms=800,
    catchup_resend_ms=40,
    catchup_grace_ms=40,
    exclusion_timeout_ms=400,
    view_change_timeout_ms=300,
    view_change_stagger_ms=30,
    view_resend_ms=40,
    promise_wait_ms=40,
)
"""Shorter than the services' defaults so that a schedule covers many rounds quickly."""

SIM_LIMITS = Limits(
    post_txs_max=64, catchup_entries_max=16, synced_window_max=64, local_admit_txs_max=8
)
"""Small enough that posts are cut, catch-up comes in chunks, old entries leave memory,
and local submits wait for room in the core (``_feed_locals``)."""

SIM_FLUSH_METAS = 24
SIM_FLUSH_CHANGES = 48
"""Far below the coordinator's, so that gatherings are sealed on size and the shell stops
taking events until a write slot frees, as under heavy load."""
DISK_MS = ((0, 6), (2, 40))
"""How long the store takes to answer one write: a fast disk or a slow one (drawn per
seed), then per write; answers stay in order. On the slow one, crashes find more writes
in flight."""

HAND_OVER_MS = ((0, 3), (0, 30))
"""How long a durable stamped submit takes to reach the core (the store's watch): prompt,
or lagging (drawn per seed), so that peers' posts raise the counter meanwhile and the
restamp and the replay rule are exercised."""

STAMP_CLOCK_SKEW_US = 7_919
"""With a stamp clock (odd seeds), node n's clock runs n times this many microseconds
modulo 50 ms ahead of the simulated time: clocks that disagree by more than a message's
trip, as the store's wall clocks may (``StoreConfig.stamp_clock_us``)."""

STEPS_MAX = 400_000
"""A schedule that takes more steps than this is reported as a liveness failure."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    seed: int
    nodes: int = 3
    txs: int = 20
    faults: FaultMix = field(default_factory=FaultMix)
    submit_window_ms: int = 2_000
    fault_window_ms: int = 3_000
    liveness_bound_ms: int = 30_000
    """After healing, every tx must be synced everywhere within this much simulated time."""
    stamped_submits: bool = True
    """The store stamps each local submit's timestamp as it writes it, and hands it to the
    coordinator once durable, as the services do (docs/protocol.md, "The submit's
    counter, stamped by the store"); False: the core stamps every one and writes the
    meta before its first post, as they did before (the regression seeds found then
    replay so)."""


@dataclass(slots=True)
class _Durable:
    counter: int = 0
    epoch: int = 0
    synced: list[TxMeta] = field(default_factory=list)
    synced_ids: set[TxId] = field(default_factory=set)
    incoming: dict[TxId, TxMeta] = field(default_factory=dict)
    bodies: set[TxId] = field(default_factory=set)
    view: ViewProposal | None = None
    promised: Ballot | None = None
    accepted_ballot: Ballot | None = None
    accepted: ViewProposal | None = None
    stamps: dict[TxId, tuple[int, int]] = field(default_factory=dict)
    """Stamped submits of this incarnation no write has settled yet: (stamp, local_seq)."""
    restamp: dict[TxId, int] = field(default_factory=dict)
    """Stamped submits a write voided (a counter at or past the stamp, made before the
    core had stepped them): handed over unstamped at the next start, by local_seq."""

    def restore(self) -> DurableState:
        return DurableState(
            counter=self.counter,
            epoch=self.epoch,
            synced_len=len(self.synced),
            synced_tail=tuple(self.synced[-SIM_LIMITS.synced_window_max :]),
            incoming=tuple((meta, meta.tx_id in self.bodies) for meta in self.incoming.values()),
            synced_unacquired=tuple(m for m in self.synced if m.tx_id not in self.bodies),
            view=self.view,
            promised=self.promised,
            accepted_ballot=self.accepted_ballot,
            accepted=self.accepted,
        )


@dataclass(slots=True)
class _SimNode:
    node_id: NodeId
    durable: _Durable
    shell: Shell | None
    tick_at: int | None = None
    torn_crash_pending: bool = False
    fed_position: int = 0
    """Synced positions scanned for membership entries (the shell's follower)."""
    open_round: int | None = None
    """The round the core reported started and not yet ended (its reports must pair)."""
    waiting: deque[ShellEvent] = field(default_factory=deque)
    """Events that arrived while the shell took none (a sealed write waits for a slot)."""
    last_answer_ms: int = 0
    """When the store answers this incarnation's newest write: answers keep their order."""
    log: deque[_LogItem] = field(default_factory=deque)
    """What the store staged and has not made durable yet, in log order."""
    local_seq: int = 0
    """The store's numbering of local submits."""
    handing: dict[TxId, None] = field(default_factory=dict)
    """Durable stamped submits the core has not stepped yet (on their way, waiting for
    room in the core, or waiting while the shell takes no events)."""
    locals_waiting: deque[LocalTx] = field(default_factory=deque)
    """Submits the store's watch handed over while the core had no room for more local
    metas: stepped in order as room frees, as the coordinator does
    (``Coordinator._wait_room_for_local``)."""
    last_hand_ms: int = 0

    @property
    def core(self) -> ProtocolNode | None:
        return None if self.shell is None else self.shell.core


@dataclass(frozen=True, slots=True)
class _Deliver:
    to: NodeId
    sender: NodeId
    message: Message


@dataclass(frozen=True, slots=True)
class _DeliverBody:
    to: NodeId
    sender: NodeId
    tx_id: TxId


@dataclass(frozen=True, slots=True)
class _FetchRequest:
    to: NodeId
    sender: NodeId
    tx_id: TxId


@dataclass(frozen=True, slots=True)
class _Timer:
    node: NodeId


@dataclass(frozen=True, slots=True)
class _Submit:
    tx_id: TxId
    attempt: int


@dataclass(frozen=True, slots=True)
class _ChangeMembership:
    attempt: int


@dataclass(frozen=True, slots=True)
class _WriteDurable:
    node: NodeId
    epoch: int
    """The incarnation that handed the write over: an answer to a crashed one is void."""
    seq: int
    merged: MergedPersist


@dataclass(frozen=True, slots=True)
class _StampedSubmit:
    """A local submit the store stamped and staged."""

    tx_id: TxId
    stamp: int
    local_seq: int


_LogItem = StepWrite | _StampedSubmit


@dataclass(frozen=True, slots=True)
class _SubmitDurable:
    node: NodeId
    epoch: int
    submit: _StampedSubmit


@dataclass(frozen=True, slots=True)
class _HandOver:
    """The store's watch hands a durable stamped submit to the coordinator."""

    node: NodeId
    epoch: int
    submit: _StampedSubmit


@dataclass(frozen=True, slots=True)
class _Crash:
    node: NodeId
    torn: bool


@dataclass(frozen=True, slots=True)
class _Restart:
    node: NodeId


@dataclass(frozen=True, slots=True)
class _Partition:
    blocked: frozenset[tuple[NodeId, NodeId]]
    """Directed links (sender, receiver) that lose everything while this lasts."""


@dataclass(frozen=True, slots=True)
class _Heal:
    pass


_NetworkEvent = _Deliver | _DeliverBody | _FetchRequest
_SimEvent = (
    _NetworkEvent
    | _Timer
    | _Submit
    | _ChangeMembership
    | _WriteDurable
    | _SubmitDurable
    | _HandOver
    | _Crash
    | _Restart
    | _Partition
    | _Heal
    | WorkerEvent
)


@dataclass(slots=True)
class SimStats:
    steps: int = 0
    messages: int = 0
    dropped: int = 0
    duplicated: int = 0
    crashes: int = 0
    partitions: int = 0
    rounds: int = 0
    synced: int = 0
    acked: int = 0
    views: int = 0
    end_ms: int = 0


class Simulation:
    def __init__(
        self,
        config: SimConfig,
        node_factory: NodeFactory = ProtocolNode,
        shell_factory: ShellFactory = Shell,
        machine_factory: MachineFactory = PipelineMachine,
        *,
        check_sends: bool = True,
    ) -> None:
        """``check_sends=False`` leaves out rule 9 (persist before send), to show what a
        broken shell's sends lead to further on."""
        self.config = config
        self._check_sends = check_sends
        self.stats = SimStats()
        self._rng = random.Random(config.seed)
        self._factory = node_factory
        self._shell_factory = shell_factory
        self._writes_in_flight_max = self._rng.choice((1, 2, 4))
        self._disk_ms = self._rng.choice(DISK_MS)
        self._hand_ms = self._rng.choice(HAND_OVER_MS) if config.stamped_submits else (0, 0)
        self._stamp_clock = config.stamped_submits and config.seed % 2 == 1
        """Odd seeds stamp as the store does (at least its clock under load: ``_loaded``),
        even ones from the counter alone (every stamp one above it: the tightest a post
        can pass); chosen from the seed, not drawn, so the even seeds' schedules stay as
        found."""
        self._initial = tuple(f"dc{index + 1}" for index in range(config.nodes))
        spare = (f"dc{config.nodes + 1}",) if config.faults.membership else ()
        self._ids = self._initial + spare
        """Every node; with membership changes one spare starts unconfigured."""
        self._membership: dict[TxId, ConfigChange] = {}
        self._received: dict[TxId, tuple[NodeId, int]] = {}
        """Each client submit's node and incarnation (epoch), for the client's retry when
        that incarnation dies before the submit is acknowledged."""
        self._now = 0
        self._heap: list[tuple[int, int, _SimEvent]] = []
        self._seq = 0
        self._nodes = {node: _SimNode(node, _Durable(), None) for node in self._ids}
        for node in spare:  # it knows the configuration it is not part of yet
            self._nodes[node].durable.view = ViewProposal.initial(dict.fromkeys(self._initial, 1))
        self._blocked: frozenset[tuple[NodeId, NodeId]] = frozenset()
        self._link_clock: dict[tuple[NodeId, NodeId], int] = {}
        self._faults_on = True
        self.checker = InvariantChecker(self._ids)
        self.workers = WorkerSide(
            self._ids,
            rng=self._rng,
            at=self._at,
            checker=self.checker,
            synced=lambda node: self._nodes[node].durable.synced,  # read, never copied
            machine_factory=machine_factory,
        )
        faults = config.faults
        self._drop_p = self._rng.uniform(0.02, 0.2) if faults.drop else 0.0
        self._dup_p = self._rng.uniform(0.02, 0.2) if faults.duplicate else 0.0
        self._delay_ms = (5, 80) if faults.delay else (1, 5)

    # --- the run ---------------------------------------------------------------------------

    def run(self) -> SimStats:
        """Run the schedule; raises ``InvariantViolation`` at the first broken rule."""
        config = self.config
        for node in self._ids:
            self._start(node)
        for _ in range(config.txs):
            tx_id = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
            self._at(self._rng.randrange(config.submit_window_ms), _Submit(tx_id, 0))
        self._schedule_faults()
        heal_at = config.fault_window_ms
        self._at(heal_at, _Heal())
        deadline = heal_at + config.liveness_bound_ms
        while self._heap:
            at, _, event = heapq.heappop(self._heap)
            if at > deadline:
                break
            self._now = at
            self.stats.steps += 1
            if self.stats.steps > STEPS_MAX:
                raise InvariantViolation(5, f"no convergence within {STEPS_MAX} steps")
            self._handle(event)
            if at >= heal_at and self._converged():
                self.checker.check_converged(self._configured(), self._configured())
                self.workers.check_converged(self._configured())
                self.stats.end_ms = at
                self.stats.synced = self.checker.reference_len
                self.stats.acked = len(self.checker.acked)
                return self.stats
        self.checker.check_converged(self._configured(), self._configured())
        self.workers.check_converged(self._configured())
        raise InvariantViolation(5, f"not converged {config.liveness_bound_ms} ms after healing")

    def _configured(self) -> tuple[NodeId, ...]:
        """The nodes of the newest installed configuration: those that must converge."""
        latest = self.checker.latest_view
        if latest is None:
            return self._initial
        return tuple(node for node, _ in latest.configuration.weights)

    def _converged(self) -> bool:
        if len(self.checker.acked) < self.config.txs:
            return False
        target = self.checker.reference_len
        for node in self._configured():
            sim_node = self._nodes[node]
            core = sim_node.core
            if core is None or core.merge_base.synced_len != target or core.incoming_metas():
                return False
            if sim_node.shell is not None and sim_node.shell.pending_synced():
                return False
            if sim_node.handing or sim_node.log:  # a submit on its way to the core
                return False
            if len(sim_node.durable.bodies) < target:
                return False
        return self.workers.converged(self._configured())

    def _schedule_faults(self) -> None:
        faults, window, rng = self.config.faults, self.config.fault_window_ms, self._rng
        if faults.crash:
            self.workers.schedule_faults(window)
            for _ in range(rng.randint(1, 2 * len(self._ids))):
                node = rng.choice(self._ids)
                self._at(rng.randrange(window), _Crash(node, torn=rng.random() < 0.4))
        if faults.membership:
            for _ in range(rng.randint(1, 3)):
                self._at(rng.randrange(window), _ChangeMembership(0))
        if len(self._ids) < 2:
            return
        if faults.partition:
            at = rng.randrange(window // 4)
            while at < window:
                self._at(at, _Partition(self._random_split()))
                at += rng.randint(100, 1_500)
                self._at(at, _Heal())
                at += rng.randint(50, 800)
        if faults.flap:
            at = rng.randrange(window // 8)
            while at < window:
                if rng.random() < 0.5:
                    source, target = rng.sample(self._ids, 2)
                    blocked = frozenset({(source, target)})  # one link, one way
                else:
                    blocked = self._random_split()
                self._at(at, _Partition(blocked))
                at += rng.randint(10, 60)
                self._at(at, _Heal())
                at += rng.randint(10, 60)

    def _random_split(self) -> frozenset[tuple[NodeId, NodeId]]:
        """Two random groups; in a third of the splits only one direction is cut (A still
        hears B, B no longer hears A), which symmetric partitions never exercise."""
        rng = self._rng
        shuffled = list(self._ids)
        rng.shuffle(shuffled)
        cut = rng.randint(1, len(shuffled) - 1)
        left, right = shuffled[:cut], shuffled[cut:]
        one_way = rng.random() < 1 / 3
        blocked = {(a, b) for a in left for b in right}
        if not one_way:
            blocked |= {(b, a) for a in left for b in right}
        return frozenset(blocked)

    # --- events ----------------------------------------------------------------------------

    def _handle(self, event: _SimEvent) -> None:
        if isinstance(event, WorkerEvent):
            self.workers.handle(event, self._now)
            return
        match event:
            case _Timer(node):
                sim_node = self._nodes[node]
                if sim_node.core is not None and sim_node.tick_at == self._now:
                    sim_node.tick_at = None
                    self._step(node, Tick(self._now))
            case _Deliver(to, _, message):
                if self._nodes[to].core is not None and self._linked(event.sender, to):
                    if isinstance(message, SyncedEntries):
                        self._step(to, SyncedEntriesReceived(message))
                    elif isinstance(message, Post):
                        self._step(to, PostReceived(message))
                    else:
                        self._step(to, ViewMessageReceived(message))
            case _DeliverBody(to, sender, tx_id):
                target = self._nodes[to]
                # A body we already hold is news only when we fetched it from ourselves.
                news = tx_id not in target.durable.bodies or sender == to
                if target.core is not None and self._linked(sender, to) and news:
                    # A peer's body is durable with the write of the step that acquires
                    # it, as the coordinator writes it (``ArrivedBody``).
                    arrived = ArrivedBody(tx_id, b"", b"")
                    self._step(to, BodyAcquired(tx_id) if sender == to else arrived)
            case _FetchRequest(to, sender, tx_id):
                holder = self._nodes[to]
                held = tx_id in holder.durable.bodies
                if holder.core is not None and self._linked(sender, to) and held:
                    self._send(_DeliverBody(sender, to, tx_id))
            case _WriteDurable():
                self._write_durable(event)
            case _SubmitDurable(node, epoch, submit):
                sim_node = self._nodes[node]
                if epoch == sim_node.durable.epoch and sim_node.core is not None:
                    self._submit_durable(node, submit)  # else _crash settled it
            case _HandOver(node, epoch, submit):
                sim_node = self._nodes[node]
                if epoch == sim_node.durable.epoch and sim_node.core is not None:
                    local = LocalTx(submit.tx_id, submit.stamp, submit.local_seq)
                    sim_node.locals_waiting.append(local)
                    self._feed_locals(node)
            case _Submit(tx_id, attempt):
                self._submit(tx_id, attempt)
            case _ChangeMembership(attempt):
                self._change_membership(attempt)
            case _Crash(node, torn):
                if self._faults_on and self._nodes[node].core is not None:
                    if torn:
                        self._nodes[node].torn_crash_pending = True
                    else:
                        self._crash(node)
            case _Restart(node):
                if self._nodes[node].core is None:
                    self._start(node)
            case _Partition(blocked):
                if self._faults_on:
                    self._blocked = blocked
                    self.stats.partitions += 1
            case _Heal():
                self._blocked = frozenset()
                if self._now >= self.config.fault_window_ms:
                    self._faults_on = False
                    self.workers.heal(self._now)
                    for node, sim_node in self._nodes.items():
                        sim_node.torn_crash_pending = False
                        if sim_node.core is None:
                            self._start(node)

    def _submit(self, tx_id: TxId, attempt: int) -> None:
        up = [node for node in self._configured() if self._nodes[node].core is not None]
        if not up:
            self._at(self._now + 50, _Submit(tx_id, attempt + 1))
            return
        node = self._rng.choice(up)
        self._local_tx(node, tx_id)

    def _local_tx(self, node: NodeId, tx_id: TxId) -> None:
        """A client's submit reaches ``node``: its store holds the body, its core hears.
        Stamped, the store stamps it above every counter and timestamp it has staged and
        writes it; the core hears once that is durable."""
        sim_node = self._nodes[node]
        durable = sim_node.durable
        self._received[tx_id] = (node, durable.epoch)
        if not self.config.stamped_submits:
            durable.bodies.add(tx_id)
            self._step(node, LocalTx(tx_id))
            return
        sim_node.local_seq += 1
        stamp = self._staged_high(sim_node) + 1
        if self._stamp_clock and self._loaded(sim_node):
            skew_us = self._ids.index(node) * STAMP_CLOCK_SKEW_US % 50_000
            stamp = max(stamp, self._now * 1_000 + skew_us)
        submit = _StampedSubmit(tx_id, stamp, sim_node.local_seq)
        sim_node.log.append(submit)
        self._at(self._answer_ms(sim_node), _SubmitDurable(node, durable.epoch, submit))

    @staticmethod
    def _loaded(sim_node: _SimNode) -> bool:
        """The store's sign of load (``TransactionStore._stamp_clock_us``): another
        local submit stamped and not yet settled (staged or durable) or waiting for the
        core's stamp."""
        durable = sim_node.durable
        staged = any(isinstance(item, _StampedSubmit) for item in sim_node.log)
        return staged or bool(durable.stamps) or bool(durable.restamp)

    def _staged_high(self, sim_node: _SimNode) -> int:
        """The highest counter or timestamp the store holds or has staged for the node."""
        high = sim_node.durable.counter
        for item in sim_node.log:
            if isinstance(item, _StampedSubmit):
                high = max(high, item.stamp)
            else:
                merged = item.merged
                metas = [*merged.incoming, *merged.synced]
                high = max(high, merged.counter, *(meta.ts for meta in metas))
        return high

    def _submit_durable(self, node: NodeId, submit: _StampedSubmit) -> None:
        sim_node = self._nodes[node]
        head = sim_node.log.popleft()
        assert head is submit, "the store answers in log order"
        self._apply_submit(node, submit)
        sim_node.handing[submit.tx_id] = None
        hand_at = max(self._now + self._rng.randint(*self._hand_ms), sim_node.last_hand_ms)
        sim_node.last_hand_ms = hand_at
        self._at(hand_at, _HandOver(node, sim_node.durable.epoch, submit))

    def _apply_submit(self, node: NodeId, submit: _StampedSubmit) -> None:
        """The submit's entry is durable: its body, its meta at the stamp, the counter it
        raises, INCOMING, and the client's answer."""
        durable = self._nodes[node].durable
        tx_id = submit.tx_id
        durable.bodies.add(tx_id)
        durable.incoming[tx_id] = TxMeta(submit.stamp, tx_id, node)
        durable.stamps[tx_id] = (submit.stamp, submit.local_seq)
        durable.counter = max(durable.counter, submit.stamp)
        self.checker.on_state(node, tx_id, TxState.INCOMING)
        self.checker.on_acked(node, tx_id)

    def _change_membership(self, attempt: int) -> None:
        """An operator's membership entry at a configured node that is up: add the spare,
        else remove a node (keeping three), else change a weight."""
        configured = self._configured()
        up = [node for node in configured if self._nodes[node].core is not None]
        if not up:
            self._at(self._now + 50, _ChangeMembership(attempt + 1))
            return
        rng = self._rng
        spare = [node for node in self._ids if node not in configured and node not in self._initial]
        if spare:
            change = ConfigChange(spare[0], 1)
        elif len(configured) > 3:
            change = ConfigChange(rng.choice(configured), 0)
        else:
            change = ConfigChange(rng.choice(configured), rng.choice((1, 2)))
        tx_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        self._membership[tx_id] = change
        self._local_tx(rng.choice(up), tx_id)

    def _on_refused(self, event: ShellEvent, out: ShellOutput) -> None:
        """A client whose submit was refused (no majority, a full queue) tries again."""
        if isinstance(event, LocalTx) and not event.stamp and out.rejections:
            # One retry per submit: a crash of this node must not send it a second time
            # (the same id from two origins is two transactions, not a retry).
            self._received.pop(event.tx_id, None)
            if event.tx_id in self._membership:
                self._at(self._now + 50, _ChangeMembership(1))
            else:
                self._at(self._now + 50, _Submit(event.tx_id, 1))

    def _feed_membership(self, node: NodeId) -> None:
        """What the coordinator's follower does: in synced order, without gaps, tell the
        core of each membership entry whose body is held."""
        sim_node = self._nodes[node]
        durable = sim_node.durable
        while sim_node.core is not None and sim_node.fed_position < len(durable.synced):
            meta = durable.synced[sim_node.fed_position]
            if meta.tx_id not in durable.bodies:
                return
            sim_node.fed_position += 1
            change = self._membership.get(meta.tx_id)
            if change is not None:
                self._step(node, ConfigChangeSynced(sim_node.fed_position, change))

    def _start(self, node: NodeId) -> None:
        sim_node = self._nodes[node]
        sim_node.durable.epoch += 1
        # The epoch's entry settles every stamp no write voided: the restarted core holds
        # them as restored, and its writes count local submits from here.
        sim_node.durable.stamps.clear()
        # What the store does when a coordinator loads its state (load_protocol_state):
        # a synced transaction whose body is held but which is still ACCEPTED (its
        # ENQUEUED was in a write lost in a crash) becomes ENQUEUED.
        for meta in sim_node.durable.synced:
            stranded = self.checker.state_of(node, meta.tx_id) is TxState.ACCEPTED
            if stranded and meta.tx_id in sim_node.durable.bodies:
                self.checker.on_state(node, meta.tx_id, TxState.ENQUEUED)
        sim_node.open_round = None  # a restarted core counts rounds from 0 again
        view = sim_node.durable.view
        sim_node.fed_position = view.configuration.applied_position if view is not None else 0
        core = self._factory(
            node,
            self._initial,
            now_ms=self._now,
            durable=sim_node.durable.restore(),
            limits=SIM_LIMITS,
            timing=SIM_TIMING,
        )
        sim_node.shell = self._shell_factory(
            core,
            writes_in_flight_max=self._writes_in_flight_max,
            flush_metas=SIM_FLUSH_METAS,
            flush_changes=SIM_FLUSH_CHANGES,
        )
        self.checker.on_restart(node, sim_node.durable.counter)
        sim_node.tick_at = None
        sim_node.waiting.clear()
        sim_node.last_answer_ms = self._now
        self.workers.dc_started(node, self._now)
        restamp = sorted(sim_node.durable.restamp, key=sim_node.durable.restamp.__getitem__)
        sim_node.handing.update(dict.fromkeys(restamp))
        self._step(node, Tick(self._now))
        # As the store's watch hands them over, first; like every hand-over, only while
        # the core has room (the core refuses an unstamped one when full, and these are
        # acknowledged already).
        sim_node.locals_waiting.extend(LocalTx(tx_id) for tx_id in restamp)
        self._feed_locals(node)

    def _feed_locals(self, node: NodeId) -> None:
        """Step the submits handed over, in order, while the core has room for them
        (the ones waiting for the shell count as taken)."""
        sim_node = self._nodes[node]
        waiting = sim_node.locals_waiting
        while waiting and sim_node.shell is not None:
            queued = sum(isinstance(event, LocalTx) for event in sim_node.waiting)
            if not sim_node.shell.core.has_room_for_local(queued):
                return
            self._step(node, waiting.popleft())

    def _crash(self, node: NodeId) -> None:
        """The node's process dies. Of the writes it had handed over, the store may have
        made any prefix durable before it noticed."""
        sim_node = self._nodes[node]
        shell = sim_node.shell
        assert shell is not None
        if self.config.stamped_submits:
            staged = list(sim_node.log)
            for item in staged[: self._rng.randint(0, len(staged))]:
                if isinstance(item, _StampedSubmit):
                    self._apply_submit(node, item)
                else:
                    self._apply_durable(node, item.merged)
            sim_node.log.clear()
        else:
            in_flight = shell.writes_in_flight
            for write in in_flight[: self._rng.randint(0, len(in_flight))]:
                self._apply_durable(node, write.merged)
        # A submit the dead incarnation never acknowledged was never written, nor (the
        # shell's rule) told to anyone: its client times out and submits it again.
        epoch = sim_node.durable.epoch
        lost = [
            tx_id
            for tx_id, received in self._received.items()
            if received == (node, epoch) and tx_id not in self.checker.acked
        ]
        for tx_id in lost:
            del self._received[tx_id]
            self._at(self._now + 50, _Submit(tx_id, 1))
        sim_node.shell = None
        sim_node.tick_at = None
        sim_node.torn_crash_pending = False
        sim_node.waiting.clear()
        sim_node.handing.clear()
        sim_node.locals_waiting.clear()
        self.workers.dc_crashed(node, self._now)
        self.stats.crashes += 1
        self._at(self._now + self._rng.randint(50, 1_500), _Restart(node))

    # --- one step of one node, and its effects ---------------------------------------------

    def _step(self, node: NodeId, event: ShellEvent) -> None:
        """Step ``event`` through the node's shell, or keep it while the shell takes none."""
        sim_node = self._nodes[node]
        shell = sim_node.shell
        assert shell is not None
        if not shell.accepting:
            sim_node.waiting.append(event)
            return
        if isinstance(event, LocalTx):
            sim_node.handing.pop(event.tx_id, None)  # the core holds it from here
        core = shell.core
        rounds_before = core.round_no
        try:
            # The shell steps the clock first; a Tick of our own adds nothing to it.
            out = shell.step([] if isinstance(event, Tick) else [event], now_ms=self._now)
        except AssertionError as error:
            raise InvariantViolation(0, f"{node}: {error!r} on {type(event).__name__}") from error
        self.stats.rounds += core.round_no - rounds_before
        self._on_refused(event, out)
        self._take_output(node, out)
        # The checker knows what is durable; the core is ahead by what is being written.
        pending = shell.pending_synced()
        self.checker.check_node(
            node,
            counter=core.counter,
            synced_len=core.merge_base.synced_len - len(pending),
            incoming_ids={meta.tx_id for meta in core.incoming_metas()},
            synced_pending={meta.tx_id for meta in pending}.union(sim_node.handing),
        )
        if out.next_tick_ms is not None:
            self._arm_timer(sim_node, out.next_tick_ms)
        if self._membership and not isinstance(event, ConfigChangeSynced):
            self._feed_membership(node)
        if sim_node.locals_waiting and not isinstance(event, LocalTx):
            self._feed_locals(node)  # an ADD or a forget may have made room

    def _take_output(self, node: NodeId, out: ShellOutput) -> None:
        """Hand the shell's writes to the store and make the sends it released."""
        sim_node = self._nodes[node]
        for write in out.writes:
            answer = self._answer_ms(sim_node)
            if self.config.stamped_submits:
                sim_node.log.append(write)
            epoch = sim_node.durable.epoch
            self._at(answer, _WriteDurable(node, epoch, write.seq, write.merged))
        for release in out.releases:
            for ready in release.readies:
                self._check_round_reports(sim_node, ready)
                self._send_effects(node, ready)

    def _answer_ms(self, sim_node: _SimNode) -> int:
        answer = max(self._now + self._rng.randint(*self._disk_ms), sim_node.last_answer_ms)
        sim_node.last_answer_ms = answer
        return answer

    def _write_durable(self, answer: _WriteDurable) -> None:
        """The store made a write durable: apply it, then tell the shell, which may
        release sends, hand over the next write and take events again."""
        node = answer.node
        sim_node = self._nodes[node]
        shell = sim_node.shell
        if shell is None or answer.epoch != sim_node.durable.epoch:
            return  # the incarnation that wrote it is gone; _crash settled its writes
        if self.config.stamped_submits:
            head = sim_node.log.popleft()
            assert isinstance(head, StepWrite) and head.seq == answer.seq, "answers in order"
        self._apply_durable(node, answer.merged)
        out = shell.write_durable(answer.seq)
        if sim_node.torn_crash_pending:
            self._crash(node)  # durable, but nothing it released was sent
            return
        self._take_output(node, out)
        if out.step_due:
            self._arm_timer(sim_node, self._now)  # the coordinator wakes its loop
        if self._membership:
            self._feed_membership(node)
        while sim_node.shell is shell and shell.accepting and sim_node.waiting:
            self._step(node, sim_node.waiting.popleft())

    @staticmethod
    def _check_round_reports(sim_node: _SimNode, ready: Ready) -> None:
        """Round reports (tracing and metrics rely on them) pair up: one start, then the
        end of that very round, numbers counting up by one."""
        for report in ready.rounds:
            node = sim_node.node_id
            match report:
                case RoundStarted(round_no, _):
                    if sim_node.open_round is not None:
                        raise InvariantViolation(
                            0, f"{node}: round {round_no} started in round {sim_node.open_round}"
                        )
                    sim_node.open_round = round_no
                case RoundEnded(round_no=round_no, started_ms=started, ended_ms=ended):
                    if sim_node.open_round != round_no or ended < started:
                        raise InvariantViolation(
                            0, f"{node}: round {round_no} ended, open {sim_node.open_round}"
                        )
                    sim_node.open_round = None

    def _apply_durable(self, node: NodeId, merged: MergedPersist) -> None:
        """What the transaction-store does with one write, in its order: counter,
        forgotten metas, new metas, synced append, installed view, vote, states."""
        durable = self._nodes[node].durable
        durable.bodies.update(arrived.tx_id for arrived in merged.bodies)
        if merged.counter:
            self._settle_stamps(node, merged)
            durable.counter = max(durable.counter, merged.counter)
        if merged.forgotten:
            self.checker.on_forgotten(node, merged.forgotten)
            for tx_id in merged.forgotten:
                durable.incoming.pop(tx_id, None)
        durable.incoming.update((added.tx_id, added) for added in merged.incoming)
        for added in merged.incoming:  # stamped anew: the stamp is history
            durable.stamps.pop(added.tx_id, None)
            durable.restamp.pop(added.tx_id, None)
        if merged.synced:
            start = merged.synced_start
            assert start is not None, "a synced append has a start"
            held = all(self._body_held_somewhere(synced.tx_id) for synced in merged.synced)
            self.checker.on_synced(node, start.synced_len, merged.synced, held)
            durable.synced.extend(merged.synced)
            durable.synced_ids.update(meta.tx_id for meta in merged.synced)
            for synced in merged.synced:
                durable.incoming.pop(synced.tx_id, None)
        if merged.installed is not None:
            self.checker.on_view(node, merged.installed)
            self.stats.views = self.checker.views_installed
            durable.view = merged.installed
            durable.promised = durable.accepted_ballot = durable.accepted = None
        if merged.vote is not None:
            durable.promised = merged.vote.promised
            durable.accepted_ballot = merged.vote.accepted_ballot
            durable.accepted = merged.vote.accepted
        for change in merged.changes:
            if self.checker.state_of(node, change.tx_id) is change.state:
                continue  # the store takes a repeat as a no-op (forgotten, then learned again)
            self.checker.on_state(node, change.tx_id, change.state)
            meta = durable.incoming.get(change.tx_id)
            if change.state is TxState.INCOMING and meta is not None and meta.origin == node:
                self.checker.on_acked(node, change.tx_id)  # the client's submit is answered
        self.workers.synced_changed(node, self._now)

    def _settle_stamps(self, node: NodeId, merged: MergedPersist) -> None:
        """The replay rule for stamps, applied as the store applies a write with a
        counter: a stamp the core had stepped when the write was made stays for good; one
        at or below the counter that the core had not stepped is void (the core may have
        posted that counter without it), and the submit is stamped anew at the next
        start. (``BrokenStampSimulation`` keeps every stamp, to show the harm.)"""
        durable = self._nodes[node].durable
        for tx_id, (stamp, local_seq) in list(durable.stamps.items()):
            if merged.local_seq >= local_seq:
                del durable.stamps[tx_id]
            elif merged.counter >= stamp:
                del durable.stamps[tx_id]
                durable.restamp[tx_id] = local_seq
                if durable.incoming.get(tx_id) == TxMeta(stamp, tx_id, node):
                    del durable.incoming[tx_id]

    def _check_durable(self, node: NodeId, message: Message) -> None:
        """Persist before send (the ``Ready`` contract, rule 1): what a message claims
        of its sender's state, its sender holds durably. A crash right after the send
        must not make the node take back what its peers heard."""
        if not self._check_sends:
            return
        durable = self._nodes[node].durable
        problem = None
        match message:
            case Post(base=base, queue=queue) | ViewPromise(base=base, queue=queue):
                if base.synced_len > len(durable.synced):
                    problem = f"base {base.synced_len} with {len(durable.synced)} synced durably"
                lost = next(
                    (
                        meta.tx_id
                        for meta in queue
                        if meta.tx_id not in durable.incoming
                        and meta.tx_id not in durable.synced_ids
                    ),
                    None,
                )
                if lost is not None:
                    problem = f"{lost} in its queue, not durable"
                if isinstance(message, ViewPromise) and not self._voted(
                    durable, durable.promised, message.ballot
                ):
                    problem = f"a promise of {message.ballot}, {durable.promised} durably"
            case SyncedEntries(start=start, entries=entries):
                end = start.synced_len + len(entries)
                if end > len(durable.synced):
                    problem = f"entries up to {end} with {len(durable.synced)} synced durably"
            case ViewAccepted(ballot=ballot):
                if not self._voted(durable, durable.accepted_ballot, ballot):
                    problem = f"accepted {ballot}, {durable.accepted_ballot} durably"
        if problem is not None:
            kind = type(message).__name__
            raise InvariantViolation(9, f"{node} sent a {kind} claiming {problem}")

    @staticmethod
    def _voted(durable: _Durable, vote: Ballot | None, ballot: Ballot) -> bool:
        """The vote is durable, or the view it was for is installed already (an install
        in the same write voids the vote, and is the stronger fact)."""
        installed = durable.view.view.view_no if durable.view is not None else 0
        return (vote is not None and vote >= ballot) or installed >= ballot.view_no

    def _send_effects(self, node: NodeId, ready: Ready) -> None:
        promised: Post | None = None
        for message in ready.messages:
            match message:
                case SendPost(to, post):
                    self._check_durable(node, post)
                    if post is not promised:  # one post goes to each peer
                        promised = post
                        self._check_promise(node, post)
                    self._send(_Deliver(to, node, post))
                case SendSyncedEntries(to, entries):
                    self._check_durable(node, entries)
                    self._send(_Deliver(to, node, entries))
                case ServeCatchUpFromLog(to, from_len, count_max):
                    synced = self._nodes[node].durable.synced
                    start_base = _base_of(synced, from_len)
                    chunk = tuple(synced[from_len : from_len + count_max])
                    core = self._nodes[node].core
                    view_no = core.view_no if core is not None else 0
                    entries = SyncedEntries(view_no, node, start_base, chunk)
                    self._send(_Deliver(to, node, entries))
                case SendViewMessage(to, view_message):
                    self._check_durable(node, view_message)
                    self._send(_Deliver(to, node, view_message))
        for body in ready.bodies:
            match body:
                case PushBody(tx_id, peers):
                    for peer in peers:
                        self._send(_DeliverBody(peer, node, tx_id))
                case FetchBody(tx_id, source):
                    if tx_id in self._nodes[node].durable.bodies:
                        self._at(self._now, _DeliverBody(node, node, tx_id))
                    else:
                        self._send(_FetchRequest(source, node, tx_id))

    def _check_promise(self, node: NodeId, post: Post) -> None:
        core = self._nodes[node].core
        assert core is not None, "a node that is down sends nothing"
        own = [meta for meta in core.incoming_metas() if meta.origin == node]
        self.checker.on_post_sent(node, post.counter, own)

    def _body_held_somewhere(self, tx_id: TxId) -> bool:
        return any(tx_id in sim_node.durable.bodies for sim_node in self._nodes.values())

    # --- the network -----------------------------------------------------------------------

    def _linked(self, sender: NodeId, receiver: NodeId) -> bool:
        return (sender, receiver) not in self._blocked

    def _send(self, event: _NetworkEvent) -> None:
        self.stats.messages += 1
        faulty = self._faults_on
        if faulty and self._drop_p and self._rng.random() < self._drop_p:
            self.stats.dropped += 1
            return
        copies = 1
        if faulty and self._dup_p and self._rng.random() < self._dup_p:
            copies = 2
            self.stats.duplicated += 1
        for _ in range(copies):
            self._at(self._arrival_ms(event.sender, event.to), event)

    def _arrival_ms(self, sender: NodeId, to: NodeId) -> int:
        arrival = self._now + self._rng.randint(*self._delay_ms)
        if self.config.faults.reorder:
            return arrival
        link = (sender, to)
        arrival = max(arrival, self._link_clock.get(link, 0))  # FIFO links, like TCP
        self._link_clock[link] = arrival
        return arrival

    def _arm_timer(self, sim_node: _SimNode, at: int) -> None:
        at = max(at, self._now + 1)  # a timer due now already ran in this step
        if sim_node.tick_at is None or at < sim_node.tick_at:
            sim_node.tick_at = at
            self._at(at, _Timer(sim_node.node_id))

    def _at(self, at: int, event: _SimEvent) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, event))


def _base_of(synced: list[TxMeta], length: int) -> MergeBase:
    if length == 0:
        return MergeBase.genesis()
    return MergeBase(length, synced[length - 1].tx_id)
