"""The sync-coordinator's loop: the protocol core's shell over gRPC, and the state
every part of ``Coordinator`` (``coordinator.py``) works on.

One task owns the ``ProtocolNode``, inside the pure ``Shell`` (``shell.py``), which
decides when what the core asked for may be written and sent. The task takes events from
a bounded queue (peers' posts and catch-up, acquired bodies, local submits, timer ticks)
and steps them through the shell; this module is the shell's adapters. Writes go on the
transaction-store's ``PersistSteps`` stream; its answers go back to the shell, which then
releases the sends of every batch durable in order. The loop does not wait for the disk:
it steps the next events while earlier steps are written (as etcd's raft does with
asynchronous storage writes), so an event that arrives during a write costs one write,
not two.

The loop's sends go out on the peers' links, and what needs a store read first (body
pushes, catch-up from the txlog) runs beside the loop, never inside it
(``peer_traffic``); the store's streams feed the loop (``store_followers``); the admin
API and the store's truncation read what the loop knows (``coordinator_status``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from txsync.codec import MetaInterner
from txsync.protocol import (
    Limits,
    LocalTx,
    MergeBase,
    ProtocolNode,
    QuorumState,
    Ready,
    Tick,
    Timing,
)
from txsync.rpc import new_channel
from txsync.settings import DC_COPY_BYTES_PER_S_DEFAULT
from txsync.sync_coordinator.bodies import BodyFetches
from txsync.sync_coordinator.effects import ArrivedBody
from txsync.sync_coordinator.let_go import ServedPeers
from txsync.sync_coordinator.outcomes import OutcomeLedger
from txsync.sync_coordinator.peer_link import PeerLink, TlsFiles
from txsync.sync_coordinator.post_deltas import KnownPosts
from txsync.sync_coordinator.rounds import RoundTracker
from txsync.sync_coordinator.shell import Shell, ShellEvent, ShellOutput
from txsync.sync_coordinator.store_wire import durable_from_proto, persist_request
from txsync.telemetry import Metrics
from txsync.telemetry.lag_clock import LagClock
from txsync.telemetry.logs import event as log_event
from txsync.v1 import peer_pb2, peer_pb2_grpc, store_pb2, store_pb2_grpc, worker_pb2_grpc

log = logging.getLogger(__name__)


EVENTS_MAX = 10_000
"""Events waiting for the loop; peers' calls wait (backpressure) beyond it."""
EVENTS_PER_STEP_BATCH_MAX = 256
"""Events taken from the queue and stepped together."""
PERSIST_TIMEOUT_S = 30.0
"""A step not durable after this long means the store is stuck: the coordinator stops
(to be restarted from durable state) rather than hold every send forever."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CoordinatorConfig:
    node_id: str
    peers: dict[str, str]
    """Peer node id -> host:port of its PeerService."""
    store_address: str
    weights: dict[str, int] = field(default_factory=dict)
    """Node id -> vote weight (default 1 each); a view needs a weight majority."""
    joining: bool = False
    """This node joins a running cluster: it is not in the initial configuration (an
    operator adds it with a membership change); ignored once a view is installed."""
    timing: Timing = field(default_factory=Timing)
    limits: Limits = field(default_factory=Limits)
    rpc_timeout_s: float = 2.0
    dc_copy_bytes_per_s: int = DC_COPY_BYTES_PER_S_DEFAULT
    """A copy of this DC sent to another goes at most this fast (``dc_copies.CopyPace``)."""
    tls: TlsFiles | None = None
    """None only when plaintext was asked for explicitly (local development)."""


@dataclass(slots=True)
class DcCopyProgress:
    """A copy of another DC's testing worker on its way here (``dc_copies``)."""

    source: str
    started_s: float
    position: int = 0
    """The copy's position (0: not known yet)."""
    bytes_done: int = 0
    bytes_total: int = 0

    def describe(self, now_s: float) -> str:
        """The copy as ``txsync status`` warns of it while it runs."""
        where = f" at position {self.position}" if self.position else ""
        done = f"{self.bytes_done / 2**20:.1f} of {self.bytes_total / 2**20:.1f} MiB"
        return (
            f"COPYING: this DC is behind its peers' history and starts from {self.source}'s "
            f"copy{where}: {done} after {now_s - self.started_s:.0f} s"
        )


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


StepStream = grpc.aio.StreamStreamCall[
    store_pb2.PersistStepsRequest, store_pb2.PersistStepsResponse
]


class CoordinatorCore(ABC):
    def __init__(self, config: CoordinatorConfig, metrics: Metrics | None = None) -> None:
        self.config = config
        self.events: asyncio.Queue[ShellEvent] = asyncio.Queue(maxsize=EVENTS_MAX)
        self._store_channel = new_channel(config.store_address, as_service=True)
        self.store = store_pb2_grpc.StoreInternalServiceStub(self._store_channel)
        self.dispatch: worker_pb2_grpc.DispatchServiceAsyncStub | None = None
        """This DC's worker-dispatch, as its store names it (``start``): a DC behind its
        peers' history imports a peer's copy through it, and peers export this DC's
        (``dc_copies``). None: neither (a witness, or a store of an earlier release)."""
        self._dispatch_channel: grpc.aio.Channel | None = None
        self.links = {
            peer: PeerLink(peer, address, config.tls) for peer, address in config.peers.items()
        }
        self.node: ProtocolNode | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.failed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        """Resolved with the reason if the protocol loop dies: the process must then stop
        (and be restarted from durable state), not linger as a healthy-looking zombie."""
        self.shell: Shell | None = None
        """The core inside the rules of when to write and when to send (``shell``)."""
        self._next_tick_ms: int | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._pushes: dict[str, tuple[str, ...]] = {}
        """Bodies to push that must be read from the store first (tx id -> peers), sent
        together by ``_push_bodies``."""
        self._local_bodies: dict[str, peer_pb2.PushBodyRequest] = {}
        """Local submits' bodies as the store streamed them, until the core asks for
        their push (at most LOCAL_BODIES_MAX, oldest dropped)."""
        self._pushes_waiting = asyncio.Event()
        self._locals_queued = 0
        """LocalTx events put on the queue and not stepped yet: they count against the
        core's room for local metas (``_wait_room_for_local``)."""
        self._room_for_locals = asyncio.Event()
        self.rejections = 0
        joining = () if config.joining else (config.node_id,)
        self.weights = {node: config.weights.get(node, 1) for node in (*joining, *config.peers)}
        self.outcomes = OutcomeLedger(config.node_id)
        self._retired_links: list[PeerLink] = []
        """Links to removed nodes, closed at stop (they may still be told a view)."""
        self.quorum_listeners: list[Callable[[QuorumState], None]] = []
        """Called (in the loop) whenever the quorum state changes, and once at start."""
        self.refused_peers: dict[str, int] = {}
        """Calls refused because of who made them, by reason (logged as well)."""
        self.rounds = RoundTracker(config.node_id, metrics)
        self.paused = False
        """Set by an operator (``PauseSync``): this DC neither sends nor takes peer
        messages, as if cut off. The others exclude it after the exclusion timeout and go
        on if they hold a majority; its own submits stay INCOMING. Not kept across a
        restart (a restarted coordinator takes part again)."""
        self.peer_posts: dict[str, tuple[int, MergeBase]] = {}
        """Counter and merge base of each peer's latest post: how far along it is."""
        self.lag_clock = LagClock()
        self.peer_bodies_held: dict[str, int] = {}
        """How far each peer holds every synced body, from its latest post: the store
        keeps the bodies past it, which that peer may still fetch from this DC."""
        self.bodies_held_len = 0
        """How far this DC's store holds every synced body (its latest progress answer),
        for the posts."""
        self.history_from = 0
        """The first synced position the store holds, as its latest progress answer
        said: a lagger behind it needs a copy of a DC (``dc_copies``)."""
        self.copy_told: dict[str, int] = {}
        """Laggers told they need a copy, with the history start they were told of."""
        self.history_told = 0
        """The synced length the core was last told the history may start past
        (``HistoryTruncated``: what the store may truncate)."""
        self.served = ServedPeers(now_ms())
        """When this DC last sent each peer a post, catch-up or view message: its store
        lets go of none served lately (``--peer-hold-max``, ``let_go``)."""
        self.peers_recorded: dict[str, int] = {}
        """How far each peer's order came as the store recorded it (its latest progress
        answer): a peer not heard from since this coordinator started is named at that
        length for letting go (``let_go.ServedPeers.orders``)."""
        self.bodies_arriving: set[str] = set()
        """Bodies a peer pushed that wait for the loop (``take_bodies``)."""
        self._arrived_bytes = 0
        """Bytes of pushed bodies taken and not durable yet (ARRIVED_BODY_BYTES_MAX)."""
        self._arrived_room = asyncio.Condition()
        self.fetches = BodyFetches(
            config.node_id,
            stub_of=self._peer_stub,
            wanted=self._body_wanted,
            take=self.take_bodies,
            timeout_s=config.rpc_timeout_s,
        )
        self.known_posts = KnownPosts()
        """Peers' recent posts, which their next posts may name as references."""
        self.metas = MetaInterner()
        """One object per meta decoded from the peers (``codec.MetaInterner``)."""
        self._persists: StepStream | None = None
        """The PersistSteps stream, open while running."""
        self._writes: asyncio.Queue[store_pb2.PersistStepRequest] = asyncio.Queue()
        """Steps for the stream, in the shell's order (at most its writes in flight)."""
        self._written: deque[tuple[int, float, int]] = deque()
        """(seq, monotonic time handed over, pushed body bytes) of each write the store
        has not answered."""
        self._accepting = asyncio.Event()
        """Set when the shell takes events again after waiting for a free write slot."""
        self.dc_copy: DcCopyProgress | None = None
        """The copy of another DC this DC is taking (``dc_copies``), while it runs."""
        self.dc_copy_impossible = False
        """A peer said this DC needs a copy, which it cannot take (no ``--dispatch``)."""
        self.dc_copy_after_s = 0.0
        """Monotonic time before which no new copy is tried (after one failed)."""
        self.synced_end_seen = (-1, 0.0)
        """(this DC's synced end, monotonic time it was first seen there): a copy is
        taken only once the end stood still for ``DC_COPY_STALLED_S``."""
        self.restarting = ""
        """Why the process ends to be restarted (not a failure): it adopted a copy."""

    async def start(self) -> None:
        """Load the durable protocol state from the store and start the loop."""
        state = await self.store.LoadProtocolState(
            store_pb2.LoadProtocolStateRequest(
                local_admit_txs_max=self.config.limits.local_admit_txs_max
            )
        )
        if state.node_id and state.node_id != self.config.node_id:
            raise RuntimeError(
                f"the store at {self.config.store_address} belongs to {state.node_id}, "
                f"not {self.config.node_id}"
            )
        durable = durable_from_proto(state)
        if state.dispatch_address and self._dispatch_channel is None:
            self._dispatch_channel = new_channel(state.dispatch_address, as_service=True)
            self.dispatch = worker_pb2_grpc.DispatchServiceStub(self._dispatch_channel)
        # A joining node is not in the configuration it starts from: it asks the peers
        # for the current view until a membership entry has added it.
        joining = [] if self.config.joining else [self.config.node_id]
        configuration = sorted([*joining, *self.config.peers])
        self.node = ProtocolNode(
            self.config.node_id,
            configuration,
            now_ms=now_ms(),
            durable=durable,
            limits=self.config.limits,
            timing=self.config.timing,
            weights=self.weights,
            addresses=self.config.peers,
        )
        self.shell = Shell(self.node)
        self._view_no = self.node.view_no
        self._quorum = self.node.quorum_state()
        for link in self.links.values():
            link.start()
        # The links follow the installed configuration from the start, not only from the
        # next view: a node a membership entry added is in no --peer flag, and a
        # coordinator restarted without dialling it stayed in VIEW_CHANGE while a third
        # DC was down (docs/operations.md, "Restarting a DC while another is down").
        self._sync_links()
        self._persists = self.store.PersistSteps()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._run(), name="protocol-loop"),
            loop.create_task(self._write_steps(), name="step-writes"),
            loop.create_task(self._read_durable(), name="durable-steps"),
            loop.create_task(self._watch_local_submits(), name="local-submits"),
            loop.create_task(self._follow_membership(), name="membership"),
            loop.create_task(self._follow_outcomes(), name="outcomes"),
            loop.create_task(self._push_bodies(), name="body-pushes"),
            loop.create_task(self._report_progress(), name="progress-reports"),
        ]
        for task in self._tasks:
            task.add_done_callback(self._on_task_done)
        log.info(
            "%s starts in view %d %s at merge base %s, counter %d, epoch %d, %d incoming; peers %s",
            self.config.node_id,
            self.node.view_no,
            list(self.node.members),
            self.node.merge_base,
            durable.counter,
            durable.epoch,
            len(durable.incoming),
            ", ".join(f"{p}={a}" for p, a in self.config.peers.items()),
        )

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self.failed.done():
            return
        error = task.exception()
        reason = f"{task.get_name()} ended: {error!r}" if error else f"{task.get_name()} ended"
        log.critical("%s", reason, exc_info=error)
        self.failed.set_result(reason)

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)  # the loop holds tasks only weakly
        task.add_done_callback(self._background.discard)

    async def stop(self) -> None:
        if self._persists is not None:
            self._persists.cancel()
        tasks = [*self._tasks, *self._background]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # a failure was logged already
        for link in [*self.links.values(), *self._retired_links]:
            await link.close()
        await self._store_channel.close()
        if self._dispatch_channel is not None:
            await self._dispatch_channel.close()

    async def _run(self) -> None:
        shell = self.shell
        assert shell is not None, "started"
        self._step_batch([])
        while True:
            while not shell.accepting:
                # A big gathering waits for a write slot: take no events meanwhile (the
                # queue's bound pushes back on the peers' calls).
                self._accepting.clear()
                async with asyncio.timeout(PERSIST_TIMEOUT_S):
                    await self._accepting.wait()
            timeout = None
            if self._next_tick_ms is not None:
                timeout = max(0.0, (self._next_tick_ms - now_ms()) / 1000)
            try:
                # Not asyncio.wait_for: on Python 3.11 it can swallow a cancellation that
                # lands as the event arrives, and stop() then waited for ever (1 in ~40
                # in-process test runs).
                async with asyncio.timeout(timeout):
                    first = await self.events.get()
            except TimeoutError:
                batch: list[ShellEvent] = []  # a timer is due: the shell steps the clock
            else:
                # One turn of the event loop first: producers woken with this event (the
                # local-submit watch, peers' calls) add theirs, and the batch takes them
                # (asyncio.wait_for gave that turn, and more, by running get() as a task).
                await asyncio.sleep(0)
                batch = [first]
                while len(batch) < EVENTS_PER_STEP_BATCH_MAX and not self.events.empty():
                    batch.append(self.events.get_nowait())
            self._step_batch(batch)
            # Until the writes are on the stream: events that arrive meanwhile gather
            # into the next batch (one write, one release, one push per peer for all of
            # them), as when the loop wrote itself. Without it, single submits cost 25%
            # more PushBodies and 9% more posts per transaction (make bench-rpcs).
            await self._writes.join()

    def _step_batch(self, events: list[ShellEvent]) -> None:
        shell, node = self.shell, self.node
        assert shell is not None and node is not None, "started"
        if self._written and time.monotonic() - self._written[0][1] > PERSIST_TIMEOUT_S:
            raise RuntimeError(f"a step was not durable within {PERSIST_TIMEOUT_S:.0f} s")
        for event in events:
            if isinstance(event, ArrivedBody):
                self.bodies_arriving.discard(event.tx_id)  # the core knows it now
            elif isinstance(event, LocalTx):
                self._locals_queued -= 1
        out = shell.step(events, now_ms=now_ms())
        if node.has_room_for_local(self._locals_queued):
            self._room_for_locals.set()
        for rejection in out.rejections:
            self.rejections += 1
            level = logging.ERROR if "FORK" in rejection.reason else logging.DEBUG
            log.log(level, "refused %s: %s", rejection.what, rejection.reason)
        self._apply(out)
        self._next_tick_ms = out.next_tick_ms
        self._log_view_changes(node)

    def _apply(self, out: ShellOutput) -> None:
        """Hand the shell's writes to the stream's writer and make its released sends."""
        if out.step_due:
            # Wake the loop: it steps what waits, and the gathering goes out with it
            # (the Tick only wakes it: the shell steps the batch's own clock first).
            with contextlib.suppress(asyncio.QueueFull):
                self.events.put_nowait(Tick(now_ms()))
        for write in out.writes:
            self._written.append((write.seq, time.monotonic(), write.merged.body_bytes))
            self._writes.put_nowait(persist_request(write.merged))
        for release in out.releases:
            if release.installed:
                self._sync_links()
            if not self.silent:
                self._push_local_bodies(release.readies)
            for ready in release.readies:
                self._send(ready)

    def _log_view_changes(self, node: ProtocolNode) -> None:
        """One line when the view or the quorum state changes (operators grep for these)."""
        if node.view_no != self._view_no:
            self._view_no = node.view_no
            excluded = sorted(set(node.configuration) - set(node.members))
            log.warning(
                "VIEW %d installed: members %s%s",
                node.view_no,
                ", ".join(node.members),
                f"; excluded {', '.join(excluded)}" if excluded else "",
                extra=log_event("view.installed", view=node.view_no, excluded=",".join(excluded)),
            )
        quorum = node.quorum_state()
        if quorum is not self._quorum:
            self._quorum = quorum
            level = logging.WARNING if quorum is QuorumState.MINORITY else logging.INFO
            log.log(
                level, "QUORUM %s in view %d", quorum.name, node.view_no,
                extra=log_event("quorum.changed", quorum=quorum.name, view=node.view_no),
            )  # fmt: skip
            for listener in self.quorum_listeners:
                listener(quorum)

    async def _write_steps(self) -> None:
        """The only writer of the PersistSteps stream: steps go in the shell's order."""
        assert self._persists is not None, "started"
        while True:
            step = await self._writes.get()
            await self._persists.write(store_pb2.PersistStepsRequest(step=step))
            self._writes.task_done()

    async def _read_durable(self) -> None:
        """The store answers each step once it is durable, in the order sent."""
        shell = self.shell
        assert self._persists is not None and shell is not None, "started"
        async for _ in self._persists:
            seq, _, body_bytes = self._written.popleft()
            self._apply(shell.write_durable(seq))
            if body_bytes:
                async with self._arrived_room:
                    self._arrived_bytes -= body_bytes
                    self._arrived_room.notify_all()
            if shell.accepting:
                self._accepting.set()
        # A failure here is fatal for this incarnation: memory ran ahead of the disk.
        raise RuntimeError("the store ended the stream of protocol steps")

    @property
    def silent(self) -> bool:
        """This DC takes no part in the protocol for now: it sends nothing to its peers
        and refuses their calls. An operator paused it, or it is taking a copy of
        another DC (``dc_copies``): a DC behind its peers' history cannot follow a
        round, and while it stayed in the view, posting at its old base, every round of
        the others ended empty until it was restarted onto its copy: no transaction was
        ordered anywhere for as long as the copy travelled. Silent, it is excluded
        after ``--exclusion-timeout-ms`` and the others go on without it."""
        return bool(self.silence)

    @property
    def silence(self) -> str:
        """Why this DC is ``silent`` ("" when it is not), as its peers' calls are told."""
        if self.paused:
            return "sync is paused at this DC"
        if self.dc_copy is not None:
            return (
                f"this DC is taking a copy of {self.dc_copy.source}, and takes part again "
                "once restarted onto it"
            )
        return ""

    def set_paused(self, paused: bool) -> None:
        if paused != self.paused:
            log.warning(
                "SYNC %s by an operator", "PAUSED" if paused else "RESUMED",
                extra=log_event("sync.paused" if paused else "sync.resumed"),
            )  # fmt: skip
        self.paused = paused

    # --- what the parts do (``coordinator.Coordinator`` joins them) -----------------------

    @abstractmethod
    def _sync_links(self) -> None: ...

    @abstractmethod
    def _push_local_bodies(self, readies: tuple[Ready, ...]) -> None: ...

    @abstractmethod
    def _send(self, ready: Ready) -> None: ...

    @abstractmethod
    def _peer_stub(self, node_id: str) -> peer_pb2_grpc.PeerServiceAsyncStub | None: ...

    @abstractmethod
    def _body_wanted(self, tx_id: str) -> bool: ...

    @abstractmethod
    async def take_bodies(self, bodies: Sequence[ArrivedBody]) -> None: ...

    @abstractmethod
    async def _push_bodies(self) -> None: ...

    @abstractmethod
    async def _watch_local_submits(self) -> None: ...

    @abstractmethod
    async def _follow_membership(self) -> None: ...

    @abstractmethod
    async def _follow_outcomes(self) -> None: ...

    @abstractmethod
    async def _report_progress(self) -> None: ...
