"""One master's TxLog sync state machine (PROTOCOL.md §1, §2, §5; seed: laggers, idle/busy).

``ProtocolNode.step(event) -> Ready`` is the only way in. The node never reads a clock,
draws a random number or touches the network: time arrives in ``Tick`` events and every
output leaves in the returned ``Ready`` (see ``txsync.protocol.events`` for the order in
which the caller must apply it).

How a round runs here (the seed's POST, COLLECT, ADD, MERGE, made message-driven):

* A round starts with a POST to every other member. Within the round the node re-posts
  (at most every ``repost_gap_ms``) whenever it learned something a peer could use: a
  local transaction, merged metas, an acquired body or a raised counter. Re-posting only
  replaces the node's newest post; it is what brings agreement down to about one round
  trip (PROTOCOL.md §6).
* Every received post at our merge base is COLLECTED (newest per sender) and MERGED at
  once, and ADD is tried whenever a post of every member is at hand for the base.
* A round ends when ADD advanced the base, when every peer posted since the round began,
  or at the round deadline (an empty round: a member is missing). A round in which every
  queue was empty is an idle round: the node goes idle and rounds slow to
  ``idle_interval_ms``; a local transaction or a non-empty post makes it busy again.
* A post from behind our merge base comes from a lagger: we send it the synced entries it
  lacks. A post from ahead comes from a forerunner: we merge its metas and post soon so
  that it serves us.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from txsync.protocol.events import (
    BodyAcquired,
    BodyEffect,
    Event,
    FetchBody,
    LocalTx,
    MessageEffect,
    PersistCounter,
    PersistEffect,
    PersistIncoming,
    PersistSynced,
    PostReceived,
    PushBody,
    Ready,
    Rejected,
    SendPost,
    SendSyncedEntries,
    ServeCatchUpFromLog,
    StateChanged,
    SyncedEntriesReceived,
    Tick,
)
from txsync.protocol.limits import MEMBERS_MAX, Limits, Timing
from txsync.protocol.model import (
    MergeBase,
    NodeId,
    Post,
    SyncedEntries,
    TxId,
    TxMeta,
    TxState,
)
from txsync.protocol.queues import IncomingQueue, SyncedQueue, addable_prefix
from txsync.protocol.validation import post_problem, synced_entries_problem


class Mode(enum.Enum):
    BUSY = "busy"
    IDLE = "idle"


@dataclass(frozen=True, slots=True)
class DurableState:
    """What a node restarts from: exactly what its ``persist`` effects wrote, plus an
    ``epoch`` the caller raises (and makes durable) at every start."""

    counter: int = 0
    epoch: int = 0
    synced_len: int = 0
    synced_tail: tuple[TxMeta, ...] = ()
    incoming: tuple[tuple[TxMeta, bool], ...] = ()
    """Incoming metas and whether each body is held."""
    synced_unacquired: tuple[TxMeta, ...] = ()
    """Synced transactions whose bodies are not held yet (they came by catch-up)."""


@dataclass(slots=True)
class _Fetch:
    holders: list[NodeId]
    next_at_ms: int
    attempt: int = 0


@dataclass(slots=True)
class _Effects:
    persist: list[PersistEffect] = field(default_factory=list)
    state_changes: list[StateChanged] = field(default_factory=list)
    messages: list[MessageEffect] = field(default_factory=list)
    bodies: list[BodyEffect] = field(default_factory=list)
    rejections: list[Rejected] = field(default_factory=list)


class ProtocolNode:
    def __init__(
        self,
        node_id: NodeId,
        members: Sequence[NodeId],
        *,
        now_ms: int,
        durable: DurableState | None = None,
        limits: Limits | None = None,
        timing: Timing | None = None,
        view_no: int = 0,
    ) -> None:
        assert node_id in members, "a node is a member of its own view"
        assert len(set(members)) == len(members) <= MEMBERS_MAX
        durable = durable or DurableState()
        self._id = node_id
        self._members = tuple(members)
        self._others = tuple(m for m in members if m != node_id)
        self._view_no = view_no
        self._limits = limits or Limits()
        self._timing = timing or Timing()
        self._now_ms = now_ms

        self._counter = durable.counter
        self._persisted_counter = durable.counter
        self._epoch = durable.epoch
        self._seq = 0
        self._synced = SyncedQueue(
            self._limits.synced_window_max,
            length=durable.synced_len,
            tail=durable.synced_tail,
        )
        self._incoming = IncomingQueue()
        self._fetches: dict[TxId, _Fetch] = {}
        self._next_fetch_ms: int | None = None
        for meta, acquired in durable.incoming:
            self._incoming.insert(meta, acquired=acquired)
            if not acquired:
                self._want_body(meta.tx_id, (meta.origin,))
        self._synced_unacquired: dict[TxId, TxMeta] = {}
        for meta in durable.synced_unacquired:
            self._synced_unacquired[meta.tx_id] = meta
            self._want_body(meta.tx_id, (meta.origin,))
        self._early_bodies: dict[TxId, None] = {}

        # Round state. A restarted node is busy and starts a round at its first step.
        self._mode = Mode.BUSY
        self._in_round = False
        self._round_no = 0
        self._round_started_ms = now_ms
        self._round_deadline_ms = now_ms
        self._next_round_ms = now_ms
        self._fresh: set[NodeId] = set()
        self._posts: dict[NodeId, Post] = {}
        self._ahead_posts: dict[NodeId, Post] = {}
        self._dirty = False
        self._asks_catch_up = False
        self._last_post_ms = now_ms
        self._catchup_sent: dict[NodeId, tuple[int, int]] = {}
        self._fx = _Effects()

    # --- read-only views (for the services' status and for the simulator's checks) ----

    @property
    def node_id(self) -> NodeId:
        return self._id

    @property
    def members(self) -> tuple[NodeId, ...]:
        return self._members

    @property
    def counter(self) -> int:
        return self._counter

    @property
    def view_no(self) -> int:
        return self._view_no

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def round_no(self) -> int:
        return self._round_no

    @property
    def merge_base(self) -> MergeBase:
        return self._synced.base

    @property
    def synced(self) -> SyncedQueue:
        return self._synced

    def incoming_metas(self) -> Sequence[TxMeta]:
        return self._incoming.metas()

    def is_incoming(self, tx_id: TxId) -> bool:
        return tx_id in self._incoming

    # --- the one way in ------------------------------------------------------------------

    def step(self, event: Event) -> Ready:
        self._fx = _Effects()
        match event:
            case Tick(now_ms):
                self._now_ms = max(self._now_ms, now_ms)
            case LocalTx(tx_id):
                self._on_local_tx(tx_id)
            case PostReceived(post):
                self._on_post(post)
            case SyncedEntriesReceived(entries):
                self._on_synced_entries(entries)
            case BodyAcquired(tx_id):
                self._on_body(tx_id)
        self._run_timers()
        fx = self._fx
        if self._counter != self._persisted_counter:
            assert self._counter > self._persisted_counter, "counters only move forward"
            fx.persist.insert(0, PersistCounter(self._counter))
            self._persisted_counter = self._counter
        return Ready(
            persist=tuple(fx.persist),
            state_changes=tuple(fx.state_changes),
            messages=tuple(fx.messages),
            bodies=tuple(fx.bodies),
            rejections=tuple(fx.rejections),
            next_tick_ms=self._next_tick_ms(),
        )

    # --- events ----------------------------------------------------------------------------

    def _on_local_tx(self, tx_id: TxId) -> None:
        if tx_id in self._incoming:
            self._reject(f"local tx {tx_id}", "already in the incoming queue")
            return
        if len(self._incoming) >= self._limits.local_admit_txs_max:
            self._reject(f"local tx {tx_id}", "incoming queue full; retry later")
            return
        self._counter += 1
        meta = TxMeta(self._counter, tx_id, self._id)
        self._incoming.insert(meta, acquired=True)
        self._fx.persist.append(PersistIncoming((meta,)))
        self._fx.state_changes.append(StateChanged(tx_id, TxState.INCOMING))
        if self._others:
            self._fx.bodies.append(PushBody(tx_id, self._others))
        self._dirty = True
        self._wake()

    def _on_post(self, post: Post) -> None:
        if post.view_no != self._view_no:
            self._reject(f"post from {post.sender}", f"view {post.view_no} is not ours")
            return
        if post.sender not in self._others:
            self._reject(f"post from {post.sender}", "sender is not a peer in our view")
            return
        problem = post_problem(post, self._limits)
        if problem is not None:
            self._reject(f"post from {post.sender}", problem)
            return
        raised = self._raise_counter(post.counter)
        base = self._synced.base
        if post.base.synced_len < base.synced_len:
            self._serve_lagger(post)
            if raised:
                self._dirty = True
            return
        if post.base.synced_len > base.synced_len:
            known = self._ahead_posts.get(post.sender)
            if known is None or post.is_newer_than(known):
                self._ahead_posts[post.sender] = post
            self._merge(post)
            # Post soon even if nothing changed: a forerunner serves a lagger only when
            # the lagger's post reaches it, so this post is our request for catch-up.
            self._asks_catch_up = True
            self._dirty = True
            self._wake()
            return
        if post.base != base:
            self._reject(f"post from {post.sender}", f"FORK: base {post.base} vs ours {base}")
            return
        known = self._posts.get(post.sender)
        if known is not None and not post.is_newer_than(known):
            return  # a duplicate or an older post: nothing new
        self._posts[post.sender] = post
        if self._in_round:
            self._fresh.add(post.sender)
        if self._merge(post) or raised:
            self._dirty = True
        if post.queue:
            self._wake()
        if self._try_add():
            return
        if self._in_round and self._fresh.issuperset(self._others):
            self._end_round(progress=False)

    def _on_synced_entries(self, msg: SyncedEntries) -> None:
        if msg.view_no != self._view_no or msg.sender not in self._others:
            self._reject(f"catch-up from {msg.sender}", "not a peer in our view")
            return
        problem = synced_entries_problem(msg, self._limits)
        if problem is not None:
            self._reject(f"catch-up from {msg.sender}", problem)
            return
        ours = self._synced.base
        start = msg.start.synced_len
        end = start + len(msg.entries)
        if start > ours.synced_len:
            return  # a gap before it: a later message will do
        start_here = self._synced.base_at(start)
        if start_here is None:
            return  # older than what we keep in memory, so it cannot extend us
        if start_here != msg.start:
            self._reject(f"catch-up from {msg.sender}", f"FORK: start {msg.start} is not ours")
            return
        for index in range(start, min(end, ours.synced_len)):
            if self._synced.id_at(index) != msg.entries[index - start].tx_id:
                self._reject(f"catch-up from {msg.sender}", f"FORK at position {index}")
                return
        if end <= ours.synced_len:
            return  # nothing new
        fresh = msg.entries[ours.synced_len - start :]
        self._append_synced(fresh, source=msg.sender)
        self._raise_counter(max(meta.ts for meta in fresh))
        self._after_base_change()

    def _on_body(self, tx_id: TxId) -> None:
        self._drop_fetch(tx_id)
        if tx_id in self._incoming:
            if self._incoming.mark_acquired(tx_id):
                self._dirty = True  # the postable prefix may have grown
            return
        if self._synced_unacquired.pop(tx_id, None) is not None:
            self._fx.state_changes.append(StateChanged(tx_id, TxState.ENQUEUED))
            return
        self._early_bodies[tx_id] = None
        if len(self._early_bodies) > self._limits.early_bodies_max:
            del self._early_bodies[next(iter(self._early_bodies))]

    # --- rounds ----------------------------------------------------------------------------

    def _run_timers(self) -> None:
        now = self._now_ms
        if self._in_round:
            if now >= self._round_deadline_ms:
                self._end_round(progress=False)
            elif self._dirty and now >= self._last_post_ms + self._timing.repost_gap_ms:
                self._repost()
        elif now >= self._next_round_ms:
            self._start_round()
        if self._next_fetch_ms is not None and now >= self._next_fetch_ms:
            self._retry_fetches()

    def _start_round(self) -> None:
        self._in_round = True
        self._round_no += 1
        self._round_started_ms = self._now_ms
        self._round_deadline_ms = self._now_ms + self._timing.round_timeout_ms
        self._fresh.clear()
        self._post()

    def _repost(self) -> None:
        """Re-post within a round, unless peers already have this very snapshot."""
        last = self._posts.get(self._id)
        queue = self._incoming.postable(self._limits.post_txs_max)
        unchanged = last is not None and last.counter == self._counter and last.queue == queue
        if unchanged and not self._asks_catch_up:
            self._dirty = False
            return
        self._post(queue)

    def _post(self, queue: tuple[TxMeta, ...] | None = None) -> None:
        self._seq += 1
        post = Post(
            view_no=self._view_no,
            sender=self._id,
            epoch=self._epoch,
            seq=self._seq,
            base=self._synced.base,
            counter=self._counter,
            queue=self._incoming.postable(self._limits.post_txs_max) if queue is None else queue,
        )
        self._posts[self._id] = post
        self._fx.messages.extend(SendPost(peer, post) for peer in self._others)
        self._dirty = False
        self._asks_catch_up = False
        self._last_post_ms = self._now_ms
        self._try_add()

    def _end_round(self, *, progress: bool) -> None:
        self._in_round = False
        idle = (
            not progress
            and len(self._incoming) == 0
            and not self._synced_unacquired
            and not self._ahead_posts
            and all(not post.queue for post in self._posts.values())
        )
        if idle:
            self._mode = Mode.IDLE
            self._next_round_ms = self._now_ms + self._timing.idle_interval_ms
            return
        self._mode = Mode.BUSY
        self._next_round_ms = max(
            self._now_ms, self._round_started_ms + self._timing.busy_round_gap_ms
        )
        if self._next_round_ms <= self._now_ms:
            self._start_round()

    def _wake(self) -> None:
        """Seed: back to busy on the first non-empty post or local transaction."""
        if self._mode is Mode.IDLE:
            self._mode = Mode.BUSY
            if not self._in_round:
                self._next_round_ms = self._now_ms

    def _try_add(self) -> bool:
        """ADD if a post of every member is at hand for our base; true if the base moved."""
        if len(self._posts) < len(self._members):
            return False
        posts = self._posts.values()
        limit_ts = min(post.counter for post in posts)
        prefix = self._addable([post.queue for post in posts], limit_ts)
        if not prefix:
            return False
        head = tuple(self._incoming.metas()[: len(prefix)])
        assert head == prefix, "an ADDed prefix is always the head of our own queue"
        self._append_synced(prefix, source=None)
        self._after_base_change()
        return True

    def _addable(self, queues: Sequence[Sequence[TxMeta]], limit_ts: int) -> tuple[TxMeta, ...]:
        """The ADD rule; a separate method so tests can inject a broken one."""
        return addable_prefix(queues, limit_ts)

    def _after_base_change(self) -> None:
        base = self._synced.base
        self._posts = {
            sender: post for sender, post in self._ahead_posts.items() if post.base == base
        }
        self._ahead_posts = {
            sender: post
            for sender, post in self._ahead_posts.items()
            if post.base.synced_len > base.synced_len
        }
        self._dirty = True
        if self._in_round:
            self._end_round(progress=True)
        else:
            self._mode = Mode.BUSY
            self._next_round_ms = min(self._next_round_ms, self._now_ms)
            self._start_round()

    def _append_synced(self, metas: Sequence[TxMeta], *, source: NodeId | None) -> None:
        """Append agreed metas; ``source`` is the forerunner for catch-up, None for ADD."""
        start = self._synced.base
        self._synced.extend(metas)
        self._fx.persist.append(PersistSynced(start, tuple(metas)))
        changes = self._fx.state_changes
        for meta in metas:
            tx_id = meta.tx_id
            known = tx_id in self._incoming
            acquired = self._incoming.is_acquired(tx_id) if known else False
            if not known:
                changes.append(StateChanged(tx_id, TxState.INCOMING))
                if tx_id in self._early_bodies:
                    del self._early_bodies[tx_id]
                    acquired = True
            changes.append(StateChanged(tx_id, TxState.ACCEPTED))
            if acquired:
                self._drop_fetch(tx_id)
                changes.append(StateChanged(tx_id, TxState.ENQUEUED))
            else:
                self._synced_unacquired[tx_id] = meta
                holders = (source, meta.origin) if source is not None else (meta.origin,)
                self._want_body(tx_id, holders)
        if source is None:
            self._incoming.pop_prefix(len(metas))
        else:
            self._incoming.remove(meta.tx_id for meta in metas)

    def _merge(self, post: Post) -> bool:
        """MERGE the post's unknown metas into our incoming queue; true if any were new."""
        new: list[TxMeta] = []
        for meta in post.queue:
            tx_id = meta.tx_id
            if tx_id in self._incoming:
                fetch = self._fetches.get(tx_id)
                if fetch is not None and post.sender not in fetch.holders:
                    fetch.holders.append(post.sender)
                continue
            if len(self._incoming) >= self._limits.incoming_txs_max:
                break
            acquired = tx_id in self._early_bodies
            if acquired:
                del self._early_bodies[tx_id]
            self._incoming.insert(meta, acquired=acquired)
            new.append(meta)
            self._fx.state_changes.append(StateChanged(tx_id, TxState.INCOMING))
            if not acquired:
                self._want_body(tx_id, (meta.origin, post.sender))
        if new:
            self._fx.persist.append(PersistIncoming(tuple(new)))
        return bool(new)

    def _raise_counter(self, seen: int) -> bool:
        if seen <= self._counter:
            return False
        self._counter = seen
        return True

    def _serve_lagger(self, post: Post) -> None:
        their = post.base
        in_memory = their.synced_len >= self._synced.window_start
        if in_memory and self._synced.base_at(their.synced_len) != their:
            self._reject(f"post from {post.sender}", f"FORK: lagger base {their} not ours")
            return
        last = self._catchup_sent.get(post.sender)
        recently = last is not None and self._now_ms < last[1] + self._timing.catchup_resend_ms
        if recently and last is not None and last[0] == their.synced_len:
            return  # the chunk we sent is probably still on its way
        count_max = self._limits.catchup_entries_max
        if not in_memory:
            self._fx.messages.append(ServeCatchUpFromLog(post.sender, their.synced_len, count_max))
        else:
            entries = SyncedEntries(
                self._view_no, self._id, their, self._synced.entries(their.synced_len, count_max)
            )
            self._fx.messages.append(SendSyncedEntries(post.sender, entries))
        self._catchup_sent[post.sender] = (their.synced_len, self._now_ms)

    # --- bodies --------------------------------------------------------------------------

    def _want_body(self, tx_id: TxId, holders: Sequence[NodeId]) -> None:
        wanted = [h for h in dict.fromkeys(holders) if h != self._id]
        fetch = self._fetches.get(tx_id)
        if fetch is not None:
            fetch.holders.extend(h for h in wanted if h not in fetch.holders)
            return
        if not wanted or len(self._fetches) >= self._limits.pending_fetches_max:
            return  # retried when a later post names a holder
        at = self._now_ms + self._timing.body_fetch_delay_ms
        self._fetches[tx_id] = _Fetch(holders=wanted, next_at_ms=at)
        if self._next_fetch_ms is None or at < self._next_fetch_ms:
            self._next_fetch_ms = at

    def _drop_fetch(self, tx_id: TxId) -> None:
        self._fetches.pop(tx_id, None)
        if not self._fetches:
            self._next_fetch_ms = None

    def _retry_fetches(self) -> None:
        now = self._now_ms
        timing = self._timing
        soonest: int | None = None
        for tx_id, fetch in self._fetches.items():
            if now >= fetch.next_at_ms:
                source = fetch.holders[fetch.attempt % len(fetch.holders)]
                self._fx.bodies.append(FetchBody(tx_id, source))
                backoff = timing.body_fetch_retry_ms << min(fetch.attempt, 16)
                fetch.attempt += 1
                fetch.next_at_ms = now + min(backoff, timing.body_fetch_retry_max_ms)
            if soonest is None or fetch.next_at_ms < soonest:
                soonest = fetch.next_at_ms
        self._next_fetch_ms = soonest

    # --- helpers ---------------------------------------------------------------------------

    def _reject(self, what: str, reason: str) -> None:
        self._fx.rejections.append(Rejected(what, reason))

    def _next_tick_ms(self) -> int:
        if self._in_round:
            soonest = self._round_deadline_ms
            if self._dirty:
                soonest = min(soonest, self._last_post_ms + self._timing.repost_gap_ms)
        else:
            soonest = self._next_round_ms
        if self._next_fetch_ms is not None:
            soonest = min(soonest, self._next_fetch_ms)
        return max(soonest, self._now_ms)
