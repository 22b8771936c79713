"""The sync-coordinator's loop: the protocol core's shell over gRPC.

One task owns the ``ProtocolNode``, inside the pure ``Shell`` (``shell.py``), which
decides when what the core asked for may be written and sent. The task takes events from
a bounded queue (peers' posts and catch-up, acquired bodies, local submits, timer ticks)
and steps them through the shell; this module is the shell's adapters. Writes go on the
transaction-store's ``PersistSteps`` stream; its answers go back to the shell, which then
releases the sends of every batch durable in order. The loop does not wait for the disk:
it steps the next events while earlier steps are written (as etcd's raft does with
asynchronous storage writes), so an event that arrives during a write costs one write,
not two.

Peers are reached through one sender task each (``peer_link.PeerLink``), so a slow or
dead peer never blocks the loop: of its queued posts the newest per merge base is kept,
and other messages wait in a bounded queue that drops the oldest when full (the
protocol retries everything it needs).
Sends that need a store read first (body pushes, catch-up from the txlog) run beside the
loop, never inside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from txsync.codec import (
    MetaInterner,
    config_change_from_proto,
)
from txsync.protocol import (
    ConfigChangeSynced,
    FetchBody,
    Limits,
    LocalTx,
    MergeBase,
    Mode,
    Post,
    ProtocolNode,
    PushBody,
    QuorumState,
    Ready,
    SendPost,
    SendSyncedEntries,
    SendViewMessage,
    ServeCatchUpFromLog,
    SyncedEntries,
    Tick,
    Timing,
)
from txsync.rpc import new_channel
from txsync.settings import PROGRESS_REPORT_S
from txsync.sync_coordinator.bodies import BodyFetches
from txsync.sync_coordinator.effects import ArrivedBody
from txsync.sync_coordinator.outcomes import OUTCOMES_PER_POST, Finished, OutcomeLedger
from txsync.sync_coordinator.peer_link import PeerLink, TlsFiles
from txsync.sync_coordinator.post_deltas import KnownPosts
from txsync.sync_coordinator.rounds import RoundTracker
from txsync.sync_coordinator.shell import Shell, ShellEvent, ShellOutput
from txsync.sync_coordinator.store_wire import durable_from_proto, persist_request
from txsync.sync_coordinator.wire import (
    base_from_proto,
    entries_to_proto,
    meta_from_proto,
    post_to_proto,
    view_message_to_proto,
)
from txsync.telemetry import Metrics
from txsync.telemetry.lag_clock import LagClock
from txsync.telemetry.logs import event as log_event
from txsync.transaction_store.validation import BODIES_PER_CALL_MAX, READ_SYNCED_MAX
from txsync.v1 import (
    common_pb2,
    peer_pb2,
    peer_pb2_grpc,
    store_pb2,
    store_pb2_grpc,
)

log = logging.getLogger(__name__)

EVENTS_MAX = 10_000
"""Events waiting for the loop; peers' calls wait (backpressure) beyond it."""
EVENTS_PER_STEP_BATCH_MAX = 256
"""Events taken from the queue and stepped together."""
ARRIVED_BODY_BYTES_MAX = 64 * 1024 * 1024
"""Pushed bodies taken and not yet durable (queued for the loop, or in a write); a
peer's stream waits beyond it. Each is held in memory until its write is durable."""
LOCAL_BODIES_MAX = 65_536
"""Local submits' bodies held until the core asks for their push; the oldest is dropped
beyond it (then read back from the store)."""
OUTCOMES_GATHER_MS = 100
"""The outcome follower's pause between the store's messages: outcomes only ride posts
and only delay divergence detection by it, while one message (and one wakeup of this
process) per finished transaction were 6% of the gRPC messages at low load (docs/
benchmarks.md, Tuning 15)."""
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
    tls: TlsFiles | None = None
    """None only when plaintext was asked for explicitly (local development)."""


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


_StepStream = grpc.aio.StreamStreamCall[
    store_pb2.PersistStepsRequest, store_pb2.PersistStepsResponse
]


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerSnapshot:
    node_id: str
    address: str
    weight: int
    heard_ms: int
    """When the core last heard from it (the core's clock)."""
    last_post: tuple[int, MergeBase] | None
    """Counter and merge base of its latest accepted post."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CoordinatorSnapshot:
    """This DC's part in the protocol at one moment, for the admin API: a copy, so that
    readers never hold the core or the coordinator's mutable state."""

    node_id: str
    view_no: int
    members: tuple[str, ...]
    mode: Mode
    quorum: QuorumState
    merge_base: MergeBase
    counter: int
    incoming_len: int
    lag: int
    now_ms: int
    paused: bool
    peers: tuple[PeerSnapshot, ...]
    divergence_alarms: tuple[str, ...]
    divergence_alarm_count: int


class Coordinator:
    def __init__(self, config: CoordinatorConfig, metrics: Metrics | None = None) -> None:
        self.config = config
        self.events: asyncio.Queue[ShellEvent] = asyncio.Queue(maxsize=EVENTS_MAX)
        self._store_channel = new_channel(config.store_address, as_service=True)
        self.store = store_pb2_grpc.StoreInternalServiceStub(self._store_channel)
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
        self._persists: _StepStream | None = None
        """The PersistSteps stream, open while running."""
        self._writes: asyncio.Queue[store_pb2.PersistStepRequest] = asyncio.Queue()
        """Steps for the stream, in the shell's order (at most its writes in flight)."""
        self._written: deque[tuple[int, float, int]] = deque()
        """(seq, monotonic time handed over, pushed body bytes) of each write the store
        has not answered."""
        self._accepting = asyncio.Event()
        """Set when the shell takes events again after waiting for a free write slot."""

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
        # A joining node is not in the configuration it starts from: it asks the peers
        # for the current view until a membership entry has added it.
        joining = [] if self.config.joining else [self.config.node_id]
        configuration = sorted([*joining, *self.config.peers])
        self.node = ProtocolNode(
            self.config.node_id,
            configuration,
            now_ms=_now_ms(),
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

    # --- the loop --------------------------------------------------------------------------

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
                timeout = max(0.0, (self._next_tick_ms - _now_ms()) / 1000)
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
        out = shell.step(events, now_ms=_now_ms())
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
                self.events.put_nowait(Tick(_now_ms()))
        for write in out.writes:
            self._written.append((write.seq, time.monotonic(), write.merged.body_bytes))
            self._writes.put_nowait(persist_request(write.merged))
        for release in out.releases:
            if release.installed:
                self._sync_links()
            if not self.paused:
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

    def _push_local_bodies(self, readies: tuple[Ready, ...]) -> None:
        """The batch's pushes of bodies we hold in memory, as few calls per peer as fit,
        queued before the batch's posts (``PeerLink``); the rest are read from the store
        by ``_push_bodies``."""
        held: list[tuple[peer_pb2.PushBodyRequest, tuple[str, ...]]] = []
        for ready in readies:
            for body in ready.bodies:
                if not isinstance(body, PushBody):
                    continue
                push = self._local_bodies.pop(body.tx_id, None)
                if push is None:
                    self._pushes[body.tx_id] = body.to
                    self._pushes_waiting.set()
                else:
                    held.append((push, body.to))
        self._send_pushes(held)

    def _send_pushes(self, pushes: list[tuple[peer_pb2.PushBodyRequest, tuple[str, ...]]]) -> None:
        """Each (body, peers) to its peers: each peer's link merges them into as few
        PushBodies messages as fit (``PeerLink.push``)."""
        sender = self.config.node_id
        for push, peers in pushes:
            for peer in peers:
                if link := self._link(peer):
                    link.push(sender, push)

    def _sync_links(self) -> None:
        """Links follow the configuration: a node added by a membership entry is dialled
        at the address the entry gave; a removed one is hung up on (after this batch's
        sends: it is told of the view that removes it)."""
        node = self.node
        assert node is not None
        configuration = node.installed_view.configuration
        addresses = dict(configuration.addresses)
        wanted = {n for n, _ in configuration.weights if n != self.config.node_id}
        for peer in sorted(wanted - set(self.links)):
            address = addresses.get(peer)
            if address is None:
                log.error("no address for %s, added to the configuration: cannot reach it", peer)
                continue
            link = PeerLink(peer, address, self.config.tls)
            link.start()
            self.links[peer] = link
            self.weights[peer] = dict(configuration.weights)[peer]
            log.warning(
                "MEMBERSHIP: %s added at %s", peer, address,
                extra=log_event("membership.added", peer=peer, address=address),
            )  # fmt: skip
        for peer in sorted(set(self.links) - wanted):
            log.warning(
                "MEMBERSHIP: %s removed", peer, extra=log_event("membership.removed", peer=peer)
            )
            self._retired_links.append(self.links.pop(peer))
        self.weights.update(configuration.weights)

    def post_accepted(
        self, post: Post, finished: list[Finished], round_traceparent: str, bodies_held_len: int
    ) -> None:
        """A peer's post passed every check (``PeerServicer.Exchange``): only now does it
        change what this coordinator knows of that peer. The core hears of it through
        the event queue."""
        self.known_posts.remember(post.sender, post.epoch, post.seq, post.queue)
        self.rounds.peer_round(post.sender, round_traceparent)
        self.peer_posts[post.sender] = (post.counter, post.base)
        self.lag_clock.reached(post.base.synced_len, time.monotonic())
        self.peer_bodies_held[post.sender] = bodies_held_len
        for outcome in finished:
            self.outcomes.add_theirs(post.sender, outcome)

    def caller_refused(self, kind: str) -> None:
        self.refused_peers[kind] = self.refused_peers.get(kind, 0) + 1

    def snapshot(self) -> CoordinatorSnapshot | None:
        """What the admin API shows, copied at one moment (None while loading)."""
        node = self.node
        if node is None:
            return None
        heard = node.last_heard_ms()
        peers = tuple(
            PeerSnapshot(
                node_id=peer,
                address=self.config.peers.get(peer, ""),
                weight=self.weights.get(peer, 0),
                heard_ms=heard[peer],
                last_post=self.peer_posts.get(peer),
            )
            for peer in sorted(heard)
            if peer != node.node_id
        )
        return CoordinatorSnapshot(
            node_id=node.node_id,
            view_no=node.view_no,
            members=node.members,
            mode=node.mode,
            quorum=node.quorum_state(),
            merge_base=node.merge_base,
            counter=node.counter,
            incoming_len=node.incoming_len,
            lag=self.lag(),
            now_ms=node.now_ms,
            paused=self.paused,
            peers=peers,
            divergence_alarms=tuple(self.outcomes.alarms),
            divergence_alarm_count=self.outcomes.alarm_count,
        )

    def peers_progress(self) -> dict[str, int]:
        """Every peer of the configuration with how far its latest post says it has come:
        its synced length, or less where it still lacks bodies, which it fetches from the
        others (a peer of an earlier release says 0). 0 for one not heard from since this
        coordinator started, which may need any of the history: each holds truncation
        back until it has all of it."""
        assert self.node is not None
        me = self.node.node_id
        return {
            peer: min(post[1].synced_len, self.peer_bodies_held.get(peer, 0))
            if (post := self.peer_posts.get(peer))
            else 0
            for peer in self.node.configuration
            if peer != me
        }

    async def _report_progress(self) -> None:
        """Tell the store how far every peer DC has come, so that it truncates the
        history all of them (and this DC's workers) passed. A failed report is tried
        again at the next one: until then the store truncates less, never more."""
        while True:
            request = store_pb2.ReportProgressRequest(
                peer_synced_len=self.peers_progress(), peers_reported=True
            )
            try:
                answer = await self.store.ReportProgress(request, timeout=PERSIST_TIMEOUT_S)
                self.bodies_held_len = answer.bodies_held_len
            except grpc.aio.AioRpcError as error:
                log.info("progress report to the store failed: %s", error.code().name)
            await asyncio.sleep(PROGRESS_REPORT_S)

    def lag(self) -> int:
        """Synced entries behind the most advanced peer whose post we have (0 if none
        is ahead)."""
        assert self.node is not None
        ours = self.node.merge_base.synced_len
        return max([0, *(base.synced_len - ours for _, base in self.peer_posts.values())])

    def lag_seconds(self) -> float:
        """How long ago a peer first had a synced position this DC still lacks."""
        assert self.node is not None
        ours = self.node.merge_base.synced_len
        self.lag_clock.forget_up_to(ours)
        return self.lag_clock.seconds_behind(ours, time.monotonic())

    def is_known_peer(self, node_id: str) -> bool:
        """A node we may take calls from: a peer of the configuration, or one we still
        tell about a newer view (it may just have been added or removed)."""
        return node_id in self.links or (
            self.node is not None and node_id in self.node.configuration
        )

    def _link(self, to: str) -> PeerLink | None:
        link = self.links.get(to) or next(
            (retired for retired in self._retired_links if retired.node_id == to), None
        )
        if link is None:
            log.debug("no link to %s (not configured)", to)
        return link

    def set_paused(self, paused: bool) -> None:
        if paused != self.paused:
            log.warning(
                "SYNC %s by an operator", "PAUSED" if paused else "RESUMED",
                extra=log_event("sync.paused" if paused else "sync.resumed"),
            )  # fmt: skip
        self.paused = paused

    def _send(self, ready: Ready) -> None:
        self.rounds.on_reports(ready.rounds)
        if self.paused:
            return
        for message in ready.messages:
            match message:
                case SendPost(to, post):
                    if link := self._link(to):
                        outgoing = post_to_proto(post, with_queue=False)
                        outgoing.round_traceparent = self.rounds.traceparent
                        outgoing.bodies_held_len = self.bodies_held_len
                        for finished in self.outcomes.since(link.outcomes_sent):
                            outgoing.outcomes.add(
                                position=finished.position,
                                tx_id=finished.tx_id,
                                state=common_pb2.TX_STATE_OK
                                if finished.ok
                                else common_pb2.TX_STATE_FAILED,
                                state_digest=finished.state_digest,
                            )
                            link.outcomes_sent = finished.position
                        link.post(outgoing, post)
                case SendSyncedEntries(to, entries):
                    if link := self._link(to):
                        link.send(entries_to_proto(entries))
                case ServeCatchUpFromLog(to, from_len, count_max):
                    self._in_background(self._serve_from_log(to, from_len, count_max))
                case SendViewMessage(to, view_message):
                    if link := self._link(to):
                        link.send(view_message_to_proto(view_message))
        for body in ready.bodies:
            # pushes went out first (_push_local_bodies); a fetch of a body being stored
            # now would fetch it twice
            if (
                isinstance(body, FetchBody)
                and body.tx_id not in self.bodies_arriving
                and self.fetches.ask(body.tx_id, body.source)
            ):
                self._in_background(self.fetches.drain(body.source))

    async def _serve_from_log(self, to: str, from_len: int, count_max: int) -> None:
        try:
            answer = await self.store.ReadSynced(
                store_pb2.ReadSyncedRequest(
                    from_len=from_len, count_max=min(count_max, READ_SYNCED_MAX)
                )
            )
        except grpc.aio.AioRpcError as error:
            log.warning("cannot serve %s from the txlog at %d: %s", to, from_len, error.details())
            return
        link = self._link(to)
        if answer.entries and link is not None:
            entries = SyncedEntries(
                self.node.view_no if self.node is not None else 0,
                self.config.node_id,
                base_from_proto(answer.start),
                tuple(meta_from_proto(m) for m in answer.entries),
            )
            link.send(entries_to_proto(entries))

    async def _push_bodies(self) -> None:
        """Push new bodies to the peers, many per call: every body that became durable
        while the previous batch was read goes in the next (one ReadBodies from the store,
        one PushBodies per peer), so calls per transaction fall as load rises. A body the
        store cannot read is left to the peers, which fetch it when they see its meta."""
        while True:
            await self._pushes_waiting.wait()
            self._pushes_waiting.clear()
            while self._pushes:
                batch = dict(itertools.islice(self._pushes.items(), BODIES_PER_CALL_MAX))
                for tx_id in batch:
                    del self._pushes[tx_id]
                try:
                    held = await self.store.ReadBodies(
                        store_pb2.ReadBodiesRequest(tx_ids=list(batch))
                    )
                except grpc.aio.AioRpcError as error:
                    log.warning("cannot push %d bodies: %s", len(batch), error.details())
                    continue
                for tx_id in held.unread:  # past the answer's 3 MiB: the next batch
                    self._pushes[tx_id] = batch[tx_id]
                self._send_pushes([
                    (peer_pb2.PushBodyRequest(tx_id=body.tx_id, body=body.body,
                                              digest=body.digest, traceparent=body.traceparent),
                     batch[body.tx_id])
                    for body in held.bodies
                ])  # fmt: skip

    def _peer_stub(self, node_id: str) -> peer_pb2_grpc.PeerServiceAsyncStub | None:
        link = self._link(node_id)
        return None if link is None else link.stub

    def _body_wanted(self, tx_id: str) -> bool:
        return self.node is not None and self.node.wants_body(tx_id)

    async def take_bodies(self, bodies: Sequence[ArrivedBody]) -> None:
        """Bodies from peers, checked (``checked_body``): the loop writes each with the
        step that tells the core it is acquired (one store call and fsync for both). The
        caller waits while ARRIVED_BODY_BYTES_MAX of them are not durable yet."""
        size = sum(len(body.body) for body in bodies)
        async with self._arrived_room:
            await self._arrived_room.wait_for(
                lambda: (
                    not self._arrived_bytes or self._arrived_bytes + size <= ARRIVED_BODY_BYTES_MAX
                )
            )
            self._arrived_bytes += size
        self.bodies_arriving.update(body.tx_id for body in bodies)
        for body in bodies:
            await self.events.put(body)

    async def _follow_membership(self) -> None:
        """Feed the core each membership entry of the synced queue, in order, from the
        installed configuration's position on (the store streams them once every earlier
        position is ENQUEUED, so none is skipped)."""
        node = self.node
        assert node is not None
        fed = node.installed_view.configuration.applied_position
        while True:
            # Truncation keeps every position not finished at this DC, and a membership
            # entry is applied (its view installed) as soon as it is ENQUEUED: positions
            # skipped as truncated hold none that the core has not had.
            request = store_pb2.FollowEnqueuedRequest(
                from_position=fed + 1, membership_only=True, skip_truncated=True
            )
            try:
                async for ready in self.store.FollowEnqueued(request):
                    for tx in ready.txs:
                        change = common_pb2.TxBody.FromString(tx.body).membership
                        fed = tx.position
                        synced = ConfigChangeSynced(tx.position, config_change_from_proto(change))
                        await self.events.put(synced)
            except grpc.aio.AioRpcError as error:
                log.warning("membership follower ended (%s); retrying", error.code().name)
            await asyncio.sleep(0.5)

    async def _follow_outcomes(self) -> None:
        """This DC's finished transactions, for the other DCs to compare (``outcomes``),
        gathered for ``OUTCOMES_GATHER_MS`` between messages."""
        node = self.node
        assert node is not None
        followed = max(0, node.merge_base.synced_len - OUTCOMES_PER_POST)
        while True:
            # Outcomes truncated before they were sent are not compared: the exchange
            # is a check (OUTCOMES_PER_POST), not a record every position must reach.
            request = store_pb2.FollowEnqueuedRequest(
                from_position=followed + 1,
                finished_only=True,
                gather_ms=OUTCOMES_GATHER_MS,
                skip_truncated=True,
            )
            try:
                async for ready in self.store.FollowEnqueued(request):
                    for tx in ready.txs:
                        followed = tx.position
                        self.outcomes.add_own(
                            Finished(
                                tx.position,
                                tx.meta.tx_id,
                                tx.state == common_pb2.TX_STATE_OK,
                                tx.outcome.state_digest,
                            )
                        )
            except grpc.aio.AioRpcError as error:
                log.warning("outcome follower ended (%s); retrying", error.code().name)
            await asyncio.sleep(0.5)

    async def _watch_local_submits(self) -> None:
        """Local submits become LocalTx events with the store's stamps, their bodies kept
        for the push the core asks for next; the watch restarts if the store restarts.
        A message holds every submit the store made durable since the last one, in order,
        and its events go to the loop together, for one step."""
        local_bodies = self._local_bodies
        while True:
            try:
                async for handed in self.store.WatchLocalSubmits(
                    store_pb2.WatchLocalSubmitsRequest()
                ):
                    for submit in handed.submits:
                        if submit.body:
                            local_bodies[submit.tx_id] = peer_pb2.PushBodyRequest(
                                tx_id=submit.tx_id,
                                body=submit.body,
                                digest=submit.digest,
                                traceparent=submit.traceparent,
                            )
                            if len(local_bodies) > LOCAL_BODIES_MAX:
                                del local_bodies[next(iter(local_bodies))]
                        await self._wait_room_for_local()
                        await self.events.put(LocalTx(submit.tx_id, submit.ts, submit.local_seq))
                        # Counted once put (no await in between, so the loop cannot have
                        # stepped it yet), so a cancelled put leaves no count behind.
                        self._locals_queued += 1
            except grpc.aio.AioRpcError as error:
                log.warning("local submit watch ended (%s); retrying", error.code().name)
            await asyncio.sleep(0.5)

    async def _wait_room_for_local(self) -> None:
        """Until the core has room for one more local meta. A stamped submit is durable
        and acknowledged, so the core cannot refuse it as it refuses an unstamped one
        when full; it waits here instead, and the rest wait in the store (bounded by its
        --incoming-max and, per watch, by bytes), not in the core's incoming queue, which
        a view change may have to forget whole (INCOMING_TXS_MOST)."""
        node = self.node
        assert node is not None, "started"
        while not node.has_room_for_local(self._locals_queued):
            self._room_for_locals.clear()
            await self._room_for_locals.wait()
