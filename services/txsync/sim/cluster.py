"""A whole cluster of protocol cores in one thread, driven by one seeded random source.

Everything that happens is an event on one time-ordered heap: a message or body arriving,
a node's timer, a client's submit, a crash or restart, a partition or its healing. The
same seed always yields the same run, so any failure replays from its seed alone.

Each node runs the coordinator's own ``Shell`` around its core: the shell merges the
core's durable effects into writes, keeps a few in flight and releases sends only once
they are durable. Its transaction-store is the store's own state and rules
(``sim/store.py``): each write is checked and staged as the store does it, answered
after a drawn delay, in order, and kept as the txlog's frames (a peer's body with the
step that acquired it, as the coordinator writes it); after a crash the node restarts
from what the frames replay to, alone. A crash may come with writes in flight (the
store kept a random prefix of them, and maybe part of the next frame) or between a
write's answer and the sends it releases.

A node behind where a peer's history starts is told so by that peer, and starts from a
copy of the peer's testing worker: its store adopts the copy's base (``BaseAdopted``)
and it restarts onto it (docs/dc-snapshots.md).
"""

from __future__ import annotations

import dataclasses
import heapq
import random
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from txsync.codec import proposal_to_proto
from txsync.protocol import (
    Ballot,
    BodyAcquired,
    ConfigChange,
    ConfigChangeSynced,
    FetchBody,
    HistoryTruncated,
    Limits,
    LocalTx,
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
    TxState,
    ViewAccepted,
    ViewMessageReceived,
    ViewPromise,
    ViewProposal,
)
from txsync.protocol.model import Message
from txsync.refusals import Refusal, Refused
from txsync.sim.faults import FaultMix
from txsync.sim.invariants import InvariantChecker, InvariantViolation
from txsync.sim.links import (
    QueueFactory,
    SimLinks,
    StreamAnswer,
    StreamEvent,
    StreamMessage,
    StreamReopen,
)
from txsync.sim.store import SimStore, Stamped, StateFactory, Verdict, Write
from txsync.sim.workers import HistoryEntry, Judge, MachineFactory, WorkerEvent, WorkerSide
from txsync.sync_coordinator.effects import ArrivedBody, MergedPersist
from txsync.sync_coordinator.fetch_queue import FetchQueue
from txsync.sync_coordinator.let_go import ServedPeers
from txsync.sync_coordinator.peer_queue import PeerQueue
from txsync.sync_coordinator.shell import Shell, ShellEvent, ShellOutput, StepWrite
from txsync.transaction_store.state import Moved, StoreState
from txsync.transaction_store.step_rules import (
    BaseAdoption,
    check_membership_change,
    read_synced,
)
from txsync.v1 import common_pb2, txlog_pb2
from txsync.worker_dispatch.health import judge
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
    incoming_txs_max=32,
    post_txs_max=64,
    catchup_entries_max=4,
    synced_window_max=8,
    local_admit_txs_max=2,
    pending_fetches_max=2,
    early_bodies_max=2,
)
"""Small enough that posts are cut, catch-up comes in chunks, old entries leave memory,
and local submits wait for room in the core (``_feed_locals``: 2 own metas, so that
queues of 32 hold every origin's, as ``Limits`` requires). With the window at 64,
the 20 transactions of a schedule never left it, and no lagger was ever served from the
txlog (none in 40 seeds). At 8 (catch-up chunks of 4, as ``Limits`` wants them no
larger), 37 of the first 100 seeds of `crash` serve one, and the first 20 found a lagger
posting from the window's very start taken for a fork for ever (``_serve_lagger``; now
served from the txlog, `tests/protocol/scripts/window.txt`). The fetch table and the early
bodies were never full either (65,536 and 4,096); with 2, the first seed of `crash` lost
a body a catch-up wanted beyond the table (`tests/protocol/scripts/fetch_table.txt`)."""

FETCH_TIMEOUT_MS = 200
"""A body fetch call's deadline: the coordinator's ``rpc_timeout_s`` (2 s) divided by
ten. A call dropped on the way, or whose answer is, ends with it."""

PROGRESS_REPORT_MS = 100
"""The coordinator's and dispatch's ``PROGRESS_REPORT_S`` of 1 s divided by ten, as the
simulator divides the services' other times. The services report every 0.25 s since
2026-12-01 (for flow control's sake, which the simulator does not model); the simulated
reports stay at 100 ms: the seeds its regression tests name were found with it, and a
slower report only truncates later, never further."""
SIM_SERVED_HOLD_MS = 500
"""``let_go.SERVED_HOLD_MS`` scaled to the simulated network: its messages take at most
80 ms (``_delay_ms``), and a schedule lasts seconds."""

MEMBERSHIP_ASK_AGAIN_MS = 300
MEMBERSHIP_ASKS_MAX = 20
"""An operator whose membership change is refused asks again this much later, this many
times at most (a change refused while another is applied, or a node catches up)."""

SIM_FLUSH_METAS = 24
SIM_FLUSH_CHANGES = 48
"""Far below the coordinator's, so that gatherings are sealed on size and the shell stops
taking events until a write slot frees, as under heavy load."""
ROTATION_MS = (5, 150)
"""How long a store's rotation takes from its snapshot to its commit."""
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

DC_COPY_MS = (20, 400)
"""How long a copy of another DC's testing worker takes to arrive and be imported."""

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
    peer_streams: bool | None = None
    """Peers' messages go through the coordinator's ``PeerQueue`` on simulated streams
    (``sim/links.py``); False: the core's messages are delivered one by one, each
    dropped, duplicated and reordered on its own. None: streams, unless the mix
    duplicates or reorders (a network worse than streams, which the core must survive
    too). The regression seeds replay as they were found, one by one."""
    stamped_submits: bool = True
    """The store stamps each local submit's timestamp as it writes it, and hands it to the
    coordinator once durable, as the services do (docs/protocol.md, "The submit's
    counter, stamped by the store"); False: it writes and hands over every one
    unstamped, and the core stamps it and writes the meta before its first post, as
    the services did before (the regression seeds found then replay so)."""
    peer_hold_max: int = 0
    """Each store's ``--peer-hold-max`` (0: no bound, as the default mixes run): a peer
    further behind is let go, truncated past, and starts from a copy when back."""


@dataclass(slots=True)
class _SimNode:
    node_id: NodeId
    store: SimStore
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
    handing: dict[TxId, None] = field(default_factory=dict)
    """Durable stamped submits the core has not stepped yet (on their way, waiting for
    room in the core, or waiting while the shell takes no events)."""
    locals_waiting: deque[LocalTx] = field(default_factory=deque)
    """Submits the store's watch handed over while the core had no room for more local
    metas: stepped in order as room frees, as the coordinator does
    (``Coordinator._wait_room_for_local``)."""
    last_hand_ms: int = 0
    peer_posts: dict[NodeId, tuple[int, int]] = field(default_factory=dict)
    """Each peer's latest post this coordinator took, since it started: the synced length
    it says and the bodies its sender held by then (``Coordinator.peers_progress``)."""
    fetches: FetchQueue = field(default_factory=FetchQueue)
    """The coordinator's own decisions of which bodies to fetch from whom, in batches
    (``bodies.BodyFetches`` over the same machine); gone with the process."""
    served: ServedPeers = field(default_factory=lambda: ServedPeers(0, SIM_SERVED_HOLD_MS))
    """When this coordinator last sent each peer a post, catch-up or view message
    (``let_go``); gone with the process."""
    orders_recorded: dict[NodeId, int] = field(default_factory=dict)
    """How far each peer's order came as its store recorded it, from its latest progress
    answer (``Coordinator.peers_recorded``); gone with the process."""
    fetch_calls: dict[int, tuple[NodeId, tuple[TxId, ...]]] = field(default_factory=dict)
    """This incarnation's fetch calls not answered yet: the holder and the batch taken."""
    copying: bool = False
    """A copy of another DC's testing worker is on its way here (one at a time)."""
    adopting: _DcCopied | None = None
    """A copy the DC restarts onto: adopted when it starts again."""

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
    """A ``GetBodies`` call: ``call`` names it at the caller."""

    to: NodeId
    sender: NodeId
    tx_ids: tuple[TxId, ...]
    call: int


@dataclass(frozen=True, slots=True)
class _FetchAnswer:
    """The holder's answer: the bodies it held of those asked."""

    to: NodeId
    sender: NodeId
    tx_ids: tuple[TxId, ...]
    call: int


@dataclass(frozen=True, slots=True)
class _FetchTimeout:
    """A fetch call's deadline (``rpc_timeout_s``, divided by ten)."""

    node: NodeId
    call: int


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
class _StoreAnswer:
    """The store made its oldest staged write durable."""

    node: NodeId
    epoch: int
    """The incarnation that handed the write over: an answer to a crashed one is void."""


@dataclass(frozen=True, slots=True)
class _HandOver:
    """The store's watch hands a durable local submit to the coordinator."""

    node: NodeId
    epoch: int
    submit: Stamped


@dataclass(frozen=True, slots=True)
class _ProgressReport:
    """The coordinator tells its store how far every peer DC has come."""

    node: NodeId
    epoch: int


@dataclass(frozen=True, slots=True)
class _RotationCommit:
    """The store's new file is written and synced: it replaces the current one."""

    node: NodeId
    epoch: int
    """The incarnation that started the rotation: a crash discarded it."""


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


@dataclass(frozen=True, slots=True)
class _HistoryTold:
    """The node's store staged a truncation: its core hears where the history starts
    (``HistoryTruncated``), in this incarnation."""

    node: NodeId
    epoch: int


@dataclass(frozen=True, slots=True)
class _SnapshotNeeded:
    """A peer's coordinator could not serve ``to`` catch-up: its history starts at
    ``history_from``, past ``to``'s synced end (docs/dc-snapshots.md)."""

    to: NodeId
    sender: NodeId
    history_from: int


@dataclass(frozen=True, slots=True)
class _DcCopied:
    """A copy of ``source``'s testing worker, taken for ``node``'s incarnation ``epoch``,
    has arrived there."""

    node: NodeId
    epoch: int
    source: NodeId
    adoption: BaseAdoption
    history: tuple[HistoryEntry, ...]


_NetworkEvent = _Deliver | _DeliverBody | _FetchRequest | _FetchAnswer | _SnapshotNeeded
_SimEvent = (
    _NetworkEvent
    | StreamEvent
    | _Timer
    | _Submit
    | _ChangeMembership
    | _StoreAnswer
    | _HandOver
    | _ProgressReport
    | _RotationCommit
    | _Crash
    | _Restart
    | _FetchTimeout
    | _Partition
    | _Heal
    | _HistoryTold
    | _DcCopied
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
    truncations: int = 0
    """Truncations in place the stores staged."""
    rotations: int = 0
    """Rotations the stores committed."""
    rotated_away: int = 0
    """Transactions those rotations truncated."""
    rotations_abandoned: int = 0
    """Rotations a crash met between their snapshot and their commit."""
    fetch_calls: int = 0
    """Body fetch calls the coordinators' fetch queues made."""
    fetch_calls_failed: int = 0
    """Of those, calls whose deadline passed before an answer (dropped or cut off)."""
    dc_copies: int = 0
    """DCs started from a copy of another DC's testing worker, past the synced end
    where a peer's history started beyond theirs (docs/dc-snapshots.md)."""
    dc_copies_refused: int = 0
    """Copies asked for that the source could not give then (asked again later)."""
    left_with_removed: int = 0
    """Acknowledged transactions of a node since removed that were never synced."""
    membership_refused: int = 0
    """Membership changes the admin API refused (``check_membership_change``)."""
    end_ms: int = 0

    def add(self, other: SimStats) -> None:
        """Sum ``other``'s counters into these (a mix's totals); ``end_ms`` is the latest."""
        for name in (f.name for f in dataclasses.fields(self)):
            if name == "end_ms":
                self.end_ms = max(self.end_ms, other.end_ms)
            else:
                setattr(self, name, getattr(self, name) + getattr(other, name))


class Simulation:
    def __init__(
        self,
        config: SimConfig,
        node_factory: NodeFactory = ProtocolNode,
        shell_factory: ShellFactory = Shell,
        machine_factory: MachineFactory = PipelineMachine,
        *,
        state_factory: StateFactory = StoreState,
        queue_factory: QueueFactory = PeerQueue,
        fetch_factory: Callable[[], FetchQueue] = FetchQueue,
        health_judge: Judge = judge,
        check_sends: bool = True,
    ) -> None:
        """``check_sends=False`` leaves out rule 9 (persist before send), to show what a
        broken shell's sends lead to further on; ``state_factory`` builds each store's
        state, ``queue_factory`` each peer link's queue, ``fetch_factory`` each
        coordinator's body fetch queue, ``health_judge`` judges each DC's workers
        (tests/sim: broken ones)."""
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
        self._truncates = config.seed // 2 % 2 == 1
        """Stores truncate in place on half the seeds. The membership mixes add the spare
        on every seed: where its peers truncated, it starts from a copy (``_copy_from``)."""
        self._rotates = config.seed // 4 % 2 == 1
        """Stores rotate their disks on half the seeds (truncating too on those that
        truncate); the others' schedules stay as they were found."""
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
        self._fetch_factory = fetch_factory
        self._fetch_call = 0
        self._nodes = {
            node: _SimNode(
                node,
                SimStore(node, state_factory, self._membership, config.peer_hold_max),
                None,
            )
            for node in self._ids
        }
        for node in spare:  # it knows the configuration it is not part of yet
            initial = ViewProposal.initial(dict.fromkeys(self._initial, 1))
            installed = txlog_pb2.ViewInstalled(installed=proposal_to_proto(initial))
            entry = txlog_pb2.LogEntry(view_installed=installed)
            self._nodes[node].store.write_at_once(entry)
        self._blocked: frozenset[tuple[NodeId, NodeId]] = frozenset()
        self._post_bodies: dict[tuple[NodeId, int, int], int] = {}
        """The bodies each post's sender held when it sent it, by (sender, epoch, seq):
        the wire field the simulated network does not carry."""
        self._link_clock: dict[tuple[NodeId, NodeId], int] = {}
        self._faults_on = True
        self.checker = InvariantChecker(self._ids)
        self.workers = WorkerSide(
            self._ids,
            rng=self._rng,
            at=self._at,
            checker=self.checker,
            store=lambda node: self._nodes[node].store,
            record=self._record_verdict,
            report=self._report_workers,
            machine_factory=machine_factory,
            health_judge=health_judge,
            workers_crash=config.faults.crash,
        )
        faults = config.faults
        self._drop_p = self._rng.uniform(0.02, 0.2) if faults.drop else 0.0
        self._dup_p = self._rng.uniform(0.02, 0.2) if faults.duplicate else 0.0
        self._delay_ms = (5, 80) if faults.delay else (1, 5)
        streams = config.peer_streams
        if streams is None:
            streams = not (faults.duplicate or faults.reorder)
        self._links = (
            SimLinks(
                self._ids,
                SIM_LIMITS,
                rng=self._rng,
                now=lambda: self._now,
                at=self._at,
                arrival=self._arrival_ms,
                up=lambda node: self._nodes[node].core is not None,
                linked=self._linked,
                deliver=self._deliver,
                body=self._deliver_body,
                drop_p=self._drop_p,
                queue_factory=queue_factory,
            )
            if streams
            else None
        )

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
                self.stats.left_with_removed = self.checker.acked_left_with_removed(
                    self._configured()
                )
                if self._links is not None:  # what went on streams counts as sent
                    self.stats.messages += self._links.messages
                    self.stats.dropped += self._links.lost
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
            if sim_node.handing or sim_node.store.unwritten:  # a submit on its way to the core
                return False
            if sim_node.store.durable.bodies_held_len() < target:
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
            case StreamMessage() | StreamAnswer() | StreamReopen():
                assert self._links is not None
                self._links.handle(event)
            case _Timer(node):
                sim_node = self._nodes[node]
                if sim_node.core is not None and sim_node.tick_at == self._now:
                    sim_node.tick_at = None
                    self._step(node, Tick(self._now))
            case _Deliver(to, sender, message):
                if self._nodes[to].core is not None and self._linked(sender, to):
                    self._deliver(to, sender, message)
            case _DeliverBody(to, sender, tx_id):
                if self._nodes[to].core is not None and self._linked(sender, to):
                    self._deliver_body(to, sender, tx_id)
            case _FetchRequest(to, sender, tx_ids, call):
                holder = self._nodes[to]
                if holder.core is not None and self._linked(sender, to):
                    held = tuple(t for t in tx_ids if holder.store.body_held(t))
                    self._send(_FetchAnswer(sender, to, held, call))
            case _FetchAnswer(to, sender, tx_ids, call):
                if self._linked(sender, to):
                    self._fetch_answered(to, call, tx_ids)
            case _FetchTimeout(node, call):
                self._fetch_answered(node, call, None)
            case _SnapshotNeeded(to, sender, history_from):
                if self._nodes[to].core is not None and self._linked(sender, to):
                    self._copy_from(to, sender, history_from)
            case _HistoryTold(node, epoch):
                sim_node = self._nodes[node]
                if epoch == sim_node.store.durable.epoch and sim_node.core is not None:
                    self._step(node, HistoryTruncated(sim_node.store.state.synced_offset))
            case _DcCopied():
                self._copied(event)
            case _StoreAnswer(node, epoch):
                sim_node = self._nodes[node]
                if epoch == sim_node.store.durable.epoch and sim_node.core is not None:
                    self._answer(node)  # else _crash settled it
            case _RotationCommit(node, epoch):
                store = self._nodes[node].store
                if epoch == store.durable.epoch and store.rotating:  # else a crash discarded it
                    truncated, moved = store.commit_rotation()
                    self._check_moved(node, moved)
                    self.stats.rotated_away += truncated
                    self.stats.rotations += 1
            case _HandOver(node, epoch, submit):
                sim_node = self._nodes[node]
                if epoch == sim_node.store.durable.epoch and sim_node.core is not None:
                    local = LocalTx(submit.tx_id, submit.stamp, submit.local_seq)
                    sim_node.locals_waiting.append(local)
                    self._feed_locals(node)
            case _ProgressReport(node, epoch):
                sim_node = self._nodes[node]
                if epoch == sim_node.store.durable.epoch and sim_node.core is not None:
                    self._report_peers(node)
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
                    if self._links is not None:
                        self._links.faults_on = False

    def _deliver(self, to: NodeId, sender: NodeId, message: Message) -> None:
        """A peer's message reaches ``to``'s core (which is up)."""
        if isinstance(message, SyncedEntries):
            self._step(to, SyncedEntriesReceived(message))
        elif isinstance(message, Post):
            # What the coordinator notes of a post that passed the wire's checks, before
            # its core sees it (``post_accepted``).
            bodies = self._post_bodies.get((message.sender, message.epoch, message.seq), 0)
            self._nodes[to].peer_posts[sender] = (message.base.synced_len, bodies)
            self._step(to, PostReceived(message))
        else:
            self._step(to, ViewMessageReceived(message))

    def _deliver_body(self, to: NodeId, sender: NodeId, tx_id: TxId) -> None:
        """A body pushed or fetched reaches ``to`` (which is up). One we already hold is
        news only when we fetched it from ourselves."""
        if not self._nodes[to].store.body_held(tx_id) or sender == to:
            # A peer's body is durable with the write of the step that acquires it, as
            # the coordinator writes it (``ArrivedBody``).
            arrived = ArrivedBody(tx_id, b"", b"")
            self._step(to, BodyAcquired(tx_id) if sender == to else arrived)

    def _submit(self, tx_id: TxId, attempt: int) -> None:
        up = [node for node in self._configured() if self._nodes[node].core is not None]
        if not up:
            self._at(self._now + 50, _Submit(tx_id, attempt + 1))
            return
        node = self._rng.choice(up)
        self._local_tx(node, tx_id)

    def _local_tx(self, node: NodeId, tx_id: TxId) -> None:
        """A client's submit reaches ``node``: its store stamps it above every counter
        and timestamp it has staged (at least its clock under load, on odd seeds) and
        writes it; the client is answered, and the core hears, once that is durable."""
        sim_node = self._nodes[node]
        store = sim_node.store
        self._received[tx_id] = (node, store.durable.epoch)
        clock_us = 0
        if self._stamp_clock:
            clock_us = self._now * 1_000 + self._ids.index(node) * STAMP_CLOCK_SKEW_US % 50_000
        store.submit(
            tx_id,
            self._now,
            clock_us,
            stamped=self.config.stamped_submits,
            membership=tx_id in self._membership,
        )
        self._at(self._answer_ms(sim_node), _StoreAnswer(node, store.durable.epoch))

    def _change_membership(self, attempt: int) -> None:
        """An operator's membership entry at a configured node that is up: add the spare,
        else remove a node (keeping three), else change a weight."""
        configured = self._configured()
        up = [node for node in configured if self._nodes[node].core is not None]
        if not up:
            self._at(self._now + 50, _ChangeMembership(attempt + 1))
            return
        rng = self._rng
        at = rng.choice(up)
        spare = [node for node in self._ids if node not in configured and node not in self._initial]
        if spare:
            change = ConfigChange(spare[0], 1)
        elif len(configured) > 3:
            change = ConfigChange(rng.choice(configured), 0)
        else:
            change = ConfigChange(rng.choice(configured), rng.choice((1, 2)))
        after = self._membership_taken(at, change, adds=change.node in spare)
        if after is None:
            # As an operator does: ask again a little later (the change, drawn anew).
            if attempt < MEMBERSHIP_ASKS_MAX:
                self._at(self._now + MEMBERSHIP_ASK_AGAIN_MS, _ChangeMembership(attempt + 1))
            return
        tx_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        self._membership[tx_id] = dataclasses.replace(change, after_position=after)
        self._local_tx(at, tx_id)

    def _membership_taken(self, at: NodeId, change: ConfigChange, *, adds: bool) -> int | None:
        """The admin API's checks at ``at`` (``check_membership_change``): the position
        the change is taken against, or None if refused."""
        store = self._nodes[at].store
        asked = common_pb2.MembershipChange(node_id=change.node, weight=change.weight)
        try:
            return check_membership_change(
                store.state,
                asked,
                store.progress.peer_synced_len,
                adds=adds,
                joins_from_snapshot=True,
            )
        except Refusal:
            self.stats.membership_refused += 1
            return None

    def _report_peers(self, node: NodeId) -> None:
        """``Coordinator._report_progress``: every peer of the configuration, with the
        least of the synced length its latest post says and the bodies it held (0 for
        one not heard from since this coordinator started)."""
        sim_node = self._nodes[node]
        core = sim_node.core
        assert core is not None
        posts = sim_node.peer_posts
        configured = [peer for peer in core.configuration if peer != node]
        peers = {peer: min(*posts[peer]) if peer in posts else 0 for peer in configured}
        posted = {peer: synced_len for peer, (synced_len, _) in posts.items() if peer in peers}
        ordered = sim_node.served.orders(posted, configured, self._now, sim_node.orders_recorded)
        store = sim_node.store
        if store.report_progress(
            peers, None, self._now, truncate=self._truncates, ordered=ordered, posted=posted
        ):
            self._truncated(node)
        sim_node.orders_recorded = dict(store.state.peers_ordered)
        epoch = sim_node.store.durable.epoch
        self._at(self._now + PROGRESS_REPORT_MS, _ProgressReport(node, epoch))

    def _report_workers(self, node: NodeId, workers_min: int | None) -> int:
        """Dispatch's report to the store; its answer is where the history starts."""
        store = self._nodes[node].store
        if store.report_progress(None, workers_min, self._now, truncate=self._truncates):
            self._truncated(node)
        return store.history_from()

    def _truncated(self, node: NodeId) -> None:
        """The store staged a truncation in place: it is written after the writes
        before it, and answered like them."""
        sim_node = self._nodes[node]
        self.stats.truncations += 1
        epoch = sim_node.store.durable.epoch
        self._at(self._answer_ms(sim_node), _StoreAnswer(node, epoch))
        self._at(self._now, _HistoryTold(node, epoch))

    def _record_verdict(self, node: NodeId, tx_id: TxId, state: TxState, digest: bytes) -> None:
        """worker-dispatch records a state at the node's store, in log order."""
        sim_node = self._nodes[node]
        if sim_node.store.record_verdict(tx_id, state, digest, self._now):
            self._at(self._answer_ms(sim_node), _StoreAnswer(node, sim_node.store.durable.epoch))

    def _feed_membership(self, node: NodeId) -> None:
        """What the coordinator's follower does: in synced order, without gaps, tell the
        core of each membership entry whose body is held."""
        sim_node = self._nodes[node]
        durable = sim_node.store.durable
        # Positions truncated are skipped (``skip_truncated``): the store truncates none
        # this DC has not finished, and a membership entry is fed once ENQUEUED.
        sim_node.fed_position = max(sim_node.fed_position, durable.synced_offset)
        while sim_node.core is not None and sim_node.fed_position < durable.synced_len:
            meta = durable.synced_at(sim_node.fed_position)
            assert meta is not None, "held: past the truncation point"
            if not sim_node.store.body_held(meta.tx_id):
                return
            sim_node.fed_position += 1
            change = self._membership.get(meta.tx_id)
            if change is not None:
                self._step(node, ConfigChangeSynced(sim_node.fed_position, change))

    # --- a DC started from another DC's snapshot (docs/dc-snapshots.md) -------------------

    def _copy_from(self, node: NodeId, source: NodeId, history_from: int) -> None:
        """``node``'s dispatch asks ``source`` for a copy of its testing worker, unless
        it holds the base ``source`` serves from (``history_from - 1``) or a copy is on
        its way. The copy is the source's now, and arrives later."""
        sim_node = self._nodes[node]
        if sim_node.copying or sim_node.store.durable.synced_len >= history_from - 1:
            return
        copy = self.workers.export_copy(source)
        if copy is None or self._nodes[source].core is None:
            self.stats.dc_copies_refused += 1
            return
        position, final_state, history = copy
        try:
            adopter_len = sim_node.store.durable.synced_len
            adoption = self._nodes[source].store.export_base(
                position, final_state, node, adopter_len, self._now
            )
        except Refusal:
            self.stats.dc_copies_refused += 1
            return
        meta = adoption.meta
        assert history[-1][0] == meta.tx_id, "a worker applies the synced order"
        if position <= sim_node.store.durable.synced_len:
            return  # the tester is behind us: no use
        sim_node.copying = True
        epoch = sim_node.store.durable.epoch
        arrival = self._now + self._rng.randint(*DC_COPY_MS)
        self._at(arrival, _DcCopied(node, epoch, source, adoption, tuple(history)))

    def _copied(self, copied: _DcCopied) -> None:
        """The copy arrived: the DC restarts onto it (its processes stop, as in a crash
        but for the copy; ``_start`` adopts it), unless it died meanwhile or caught up."""
        sim_node = self._nodes[copied.node]
        sim_node.copying = False
        store = sim_node.store
        if copied.epoch != store.durable.epoch or sim_node.core is None:
            return  # the copy was lost with the process that asked for it
        if not self._linked(copied.source, copied.node):
            return
        if store.durable.synced_len > copied.adoption.before.synced_len:
            return  # caught up meanwhile
        if not store.may_adopt(copied.adoption, self._now):
            self.stats.dc_copies_refused += 1
            return
        self._crash(copied.node)
        sim_node.adopting = copied

    def _adopt(self, node: NodeId, copied: _DcCopied) -> None:
        """The store adopts the copy's base, then its workers take the copy."""
        store = self._nodes[node].store
        adoption = copied.adoption
        if store.durable.synced_len > adoption.before.synced_len:
            return
        durable = store.durable
        synced_own = {tx_id for _, tx_id in adoption.synced_own}
        forgotten = [t for t, meta in durable.incoming.items() if meta.origin != node]
        own_synced = [t for t, meta in durable.incoming.items() if t in synced_own]
        try:
            store.adopt_base(adoption, self._now)
        except Refusal as refusal:
            raise InvariantViolation(0, f"{node}: its copy refused: {refusal}") from refusal
        length = adoption.before.synced_len + 1
        meta = adoption.meta
        self.checker.on_adopted(
            node, length, meta.tx_id, adoption.final_state, forgotten, own_synced
        )
        self.workers.adopt_copy(node, list(copied.history))
        self.stats.dc_copies += 1

    def _start(self, node: NodeId) -> None:
        sim_node = self._nodes[node]
        if sim_node.adopting is not None:
            self._adopt(node, sim_node.adopting)
            sim_node.adopting = None
        # The epoch's entry settles the stamps the last core can have posted and voids the
        # rest (handed over again, to be stamped anew): the restarted core holds the kept
        # ones as restored, and its writes count local submits from here.
        durable = sim_node.store.load_protocol_state(self._now, SIM_LIMITS.local_admit_txs_max)
        sim_node.open_round = None  # a restarted core counts rounds from 0 again
        view = durable.view
        sim_node.fed_position = view.configuration.applied_position if view is not None else 0
        core = self._factory(
            node,
            self._initial,
            now_ms=self._now,
            durable=durable,
            limits=SIM_LIMITS,
            timing=SIM_TIMING,
        )
        sim_node.shell = self._shell_factory(
            core,
            writes_in_flight_max=self._writes_in_flight_max,
            flush_metas=SIM_FLUSH_METAS,
            flush_changes=SIM_FLUSH_CHANGES,
        )
        self.checker.on_restart(node, durable.counter)
        sim_node.peer_posts = {}
        sim_node.served = ServedPeers(self._now, SIM_SERVED_HOLD_MS)
        sim_node.orders_recorded = {}
        sim_node.fetches = self._fetch_factory()
        sim_node.fetch_calls = {}
        self._at(self._now + PROGRESS_REPORT_MS, _ProgressReport(node, durable.epoch))
        sim_node.tick_at = None
        sim_node.waiting.clear()
        sim_node.last_answer_ms = self._now
        self.workers.dc_started(node, self._now)
        restamp = sim_node.store.pending_local()
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
        """The node's processes die. Of the writes its store had staged, any prefix may
        be durable, and part of the next frame may be on the disk (a torn tail)."""
        sim_node = self._nodes[node]
        assert sim_node.shell is not None
        store = sim_node.store
        for _ in range(self._rng.randint(0, store.unwritten)):
            self._made_durable(node)
        torn_bytes = self._rng.randint(1, 64) if store.unwritten and self._rng.random() < 0.5 else 0
        self.stats.rotations_abandoned += store.rotating
        store.crash(torn_bytes)
        # A submit the dead incarnation never acknowledged was never written, nor (the
        # shell's rule) told to anyone: its client times out and submits it again.
        epoch = store.durable.epoch
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
        if self._links is not None:
            self._links.crashed(node)
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
        if isinstance(event, LocalTx) and out.rejections and not core.is_incoming(event.tx_id):
            # Handed over only once durable, so acknowledged: a refusal loses it.
            raise InvariantViolation(3, f"{node} refused its acknowledged {event.tx_id}")
        if core.own_incoming_len > SIM_LIMITS.local_admit_txs_max:
            # What keeps every queue able to take every origin's metas, which ADD needs
            # (Limits.local_admit_txs_max); a restart once took back 25 where 8 fit.
            raise InvariantViolation(
                5, f"{node} holds {core.own_incoming_len} own incoming metas, over "
                f"local_admit_txs_max {SIM_LIMITS.local_admit_txs_max}",
            )  # fmt: skip
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
            sim_node.store.stage_step(write, self._now)
            self._at(self._answer_ms(sim_node), _StoreAnswer(node, sim_node.store.durable.epoch))
        for release in out.releases:
            for ready in release.readies:
                self._check_round_reports(sim_node, ready)
                self._send_effects(node, ready)

    def _answer_ms(self, sim_node: _SimNode) -> int:
        answer = max(self._now + self._rng.randint(*self._disk_ms), sim_node.last_answer_ms)
        sim_node.last_answer_ms = answer
        return answer

    def _answer(self, node: NodeId) -> None:
        """The store made its oldest staged write durable and answers it: a step's to the
        shell, which may release sends, hand over the next write and take events again;
        a submit's to the client, and the watch hands the submit to the core."""
        sim_node = self._nodes[node]
        shell = sim_node.shell
        assert shell is not None
        write = self._made_durable(node)
        match write:
            case StepWrite(seq=seq):
                out = shell.write_durable(seq)
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
            case Stamped(tx_id=tx_id):
                sim_node.handing[tx_id] = None
                hand_at = max(self._now + self._rng.randint(*self._hand_ms), sim_node.last_hand_ms)
                sim_node.last_hand_ms = hand_at
                self._at(hand_at, _HandOver(node, sim_node.store.durable.epoch, write))
            case Verdict() | None:
                pass

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

    def _made_durable(self, node: NodeId) -> Write | None:
        """The store writes its oldest staged write; the checker hears what the disk now
        holds (a step's synced append, forgotten metas and installed view; every
        transition the store recorded; a submit's answer to its client)."""
        store = self._nodes[node].store
        write, moved = store.write_next()
        if isinstance(write, StepWrite):
            self._check_step(node, write.merged)
        self._check_moved(node, moved)
        if isinstance(write, Stamped):
            self.checker.on_acked(node, write.tx_id)  # the client's submit is answered
        self.workers.synced_changed(node, self._now)
        if self._rotates and store.rotation_due():
            store.start_rotation(self._now, truncate=self._truncates)
            # A whole file written and synced, outside the store's lock: writes go on
            # meanwhile (copied on at the commit), and a crash may meet it.
            commit_at = self._now + self._rng.randint(*ROTATION_MS)
            self._at(commit_at, _RotationCommit(node, store.durable.epoch))
            self._at(self._now, _HistoryTold(node, store.durable.epoch))
        return write

    def _check_step(self, node: NodeId, merged: MergedPersist) -> None:
        if merged.forgotten:
            self.checker.on_forgotten(node, merged.forgotten)
            durable = self._nodes[node].store.durable
            for tx_id in merged.forgotten:
                kept = durable.txs.get(tx_id)  # a body arrived: the store keeps the record
                if kept is not None and kept.state is not None:
                    self.checker.on_state(node, tx_id, kept.state)
        if merged.synced:
            start = merged.synced_start
            assert start is not None, "a synced append has a start"
            held = all(self._body_held_somewhere(synced.tx_id) for synced in merged.synced)
            self.checker.on_synced(node, start.synced_len, merged.synced, held)
        if merged.installed is not None:
            self.checker.on_view(node, merged.installed)
            self.stats.views = self.checker.views_installed

    def _check_moved(self, node: NodeId, moved: list[Moved]) -> None:
        for transition in moved:
            self.checker.on_state(node, transition.record.tx_id, transition.step.state)

    def _check_durable(self, node: NodeId, message: Message) -> None:
        """Persist before send (the ``Ready`` contract, rule 1): what a message claims
        of its sender's state, its sender holds durably. A crash right after the send
        must not make the node take back what its peers heard."""
        if not self._check_sends:
            return
        store = self._nodes[node].store
        durable = store.durable
        vote = durable.vote
        problem = None
        match message:
            case Post(base=base, queue=queue) | ViewPromise(base=base, queue=queue):
                if base.synced_len > durable.synced_len:
                    problem = f"base {base.synced_len} with {durable.synced_len} synced durably"
                lost = next((meta.tx_id for meta in queue if not store.known(meta.tx_id)), None)
                if lost is not None:
                    problem = f"{lost} in its queue, not durable"
                promised = vote.promised if vote is not None else None
                if isinstance(message, ViewPromise) and not self._voted(
                    durable, promised, message.ballot
                ):
                    problem = f"a promise of {message.ballot}, {promised} durably"
            case SyncedEntries(start=start, entries=entries):
                end = start.synced_len + len(entries)
                if end > durable.synced_len:
                    problem = f"entries up to {end} with {durable.synced_len} synced durably"
            case ViewAccepted(ballot=ballot):
                accepted = vote.accepted_ballot if vote is not None else None
                if not self._voted(durable, accepted, ballot):
                    problem = f"accepted {ballot}, {accepted} durably"
        if problem is not None:
            kind = type(message).__name__
            raise InvariantViolation(9, f"{node} sent a {kind} claiming {problem}")

    @staticmethod
    def _voted(durable: StoreState, vote: Ballot | None, ballot: Ballot) -> bool:
        """The vote is durable, or the view it was for is installed already (an install
        in the same write voids the vote, and is the stronger fact)."""
        return (vote is not None and vote >= ballot) or durable.view_no >= ballot.view_no

    def _send_effects(self, node: NodeId, ready: Ready) -> None:
        """What the coordinator does with a released ``Ready``: on links, pushes first
        (so that a body travels ahead of the post naming it), then the messages, then
        fetches; one by one, the messages first (the order the seeds were found with)."""
        links = self._links
        for body in ready.bodies:
            if isinstance(body, PushBody) and links is not None:
                links.push(node, body.to, body.tx_id)
        promised: Post | None = None
        for message in ready.messages:
            match message:
                case SendPost(to, post):
                    self._check_durable(node, post)
                    self._nodes[node].served.served(to, self._now)
                    if post is not promised:  # one post goes to each peer
                        promised = post
                        self._check_promise(node, post)
                    self._send_message(node, to, post)
                case SendSyncedEntries(to, entries):
                    self._check_durable(node, entries)
                    self._nodes[node].served.served(to, self._now)
                    self._send_message(node, to, entries)
                case ServeCatchUpFromLog(to, from_len, count_max):
                    self._serve_from_log(node, to, from_len, count_max)
                case SendViewMessage(to, view_message):
                    self._check_durable(node, view_message)
                    self._nodes[node].served.served(to, self._now)  # an install has a seal
                    self._send_message(node, to, view_message)
        for body in ready.bodies:
            match body:
                case PushBody(tx_id, peers) if links is None:
                    for peer in peers:
                        self._send(_DeliverBody(peer, node, tx_id))
                case FetchBody(tx_id, source):
                    sim_node = self._nodes[node]
                    if sim_node.store.body_held(tx_id):
                        self._at(self._now, _DeliverBody(node, node, tx_id))
                    elif sim_node.fetches.ask(tx_id, source):
                        self._fetch_next(node, source)

    def _fetch_next(self, node: NodeId, holder: NodeId) -> None:
        """One caller of ``node``'s fetch queue for ``holder`` calls again, or ends
        (``BodyFetches.drain``): the ids the core no longer wants are not asked."""
        sim_node = self._nodes[node]
        core = sim_node.core
        assert core is not None, "a node that is down fetches nothing"
        while batch := sim_node.fetches.next_batch(holder):
            wanted = tuple(tx_id for tx_id in batch if core.wants_body(tx_id))
            if not wanted:
                sim_node.fetches.answered(holder, batch)
                continue
            self._fetch_call += 1
            self.stats.fetch_calls += 1
            sim_node.fetch_calls[self._fetch_call] = (holder, tuple(batch))
            self._send(_FetchRequest(holder, node, wanted, self._fetch_call))
            self._at(self._now + FETCH_TIMEOUT_MS, _FetchTimeout(node, self._fetch_call))
            return

    def _fetch_answered(self, node: NodeId, call: int, arrived: tuple[TxId, ...] | None) -> None:
        """A fetch call of ``node`` is answered (None: its deadline passed first). The
        first of the two ends it; an answer to a dead incarnation's call finds none."""
        sim_node = self._nodes[node]
        taken = sim_node.fetch_calls.pop(call, None)
        if taken is None or sim_node.core is None:
            return
        holder, batch = taken
        if arrived is None:
            self.stats.fetch_calls_failed += 1
            sim_node.fetches.failed(holder, batch)
        else:
            for tx_id in arrived:
                self._deliver_body(node, holder, tx_id)
            sim_node.fetches.answered(holder, batch)
        self._fetch_next(node, holder)

    def _serve_from_log(self, node: NodeId, to: NodeId, from_len: int, count_max: int) -> None:
        """What the coordinator does: the store's ``read_synced`` (its staged state, cut
        where the appends stop being durable), and nothing when it refuses or has none."""
        store = self._nodes[node].store
        try:
            start, chunk = read_synced(store.state, from_len, count_max, store.synced_durably)
        except Refusal as refusal:
            if refusal.kind is Refused.TRUNCATED:
                # It can only start from a copy of a DC's database past our history.
                self._send(_SnapshotNeeded(to, node, store.history_from()))
            return  # else the coordinator logs it; the lagger asks again
        if not chunk:
            return
        self._nodes[node].served.served(to, self._now)
        core = self._nodes[node].core
        entries = SyncedEntries(core.view_no if core is not None else 0, node, start, tuple(chunk))
        self._check_durable(node, entries)
        self._send_message(node, to, entries)

    def _check_promise(self, node: NodeId, post: Post) -> None:
        core = self._nodes[node].core
        assert core is not None, "a node that is down sends nothing"
        own = [meta for meta in core.incoming_metas() if meta.origin == node]
        self.checker.on_post_sent(node, post.counter, own)

    def _body_held_somewhere(self, tx_id: TxId) -> bool:
        return any(sim_node.store.body_held(tx_id) for sim_node in self._nodes.values())

    # --- the network -----------------------------------------------------------------------

    def _send_message(self, sender: NodeId, to: NodeId, message: Message) -> None:
        """To the peer's link (a stream), or onto the network alone. A post carries the
        bodies its sender's store holds on disk (``bodies_held_len``)."""
        if isinstance(message, Post):
            key = (sender, message.epoch, message.seq)
            self._post_bodies[key] = self._nodes[sender].store.bodies_held_len()
        links = self._links
        if links is None:
            self._send(_Deliver(to, sender, message))
        elif isinstance(message, Post):
            links.post(sender, to, message)
        else:
            links.send(sender, to, message)

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
