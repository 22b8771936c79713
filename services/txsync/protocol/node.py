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
  lacks, and keep its post if its queue begins with exactly the entries we appended
  since (rebased: that prefix taken off; the same for the posts we hold when our base
  moves). docs/protocol.md, 'Posts kept across a base change', argues why that is safe.
  A lagger whose post is rebased most likely crossed our ADD on its way and adds those
  entries itself: it is served only if its base has not moved for ``catchup_grace_ms``.
  A post from ahead comes from a forerunner: we merge its metas and post soon so that it
  serves us.

Views (PROTOCOL.md §3; the rules in ``txsync.protocol.views``): a member silent for
``exclusion_timeout_ms``, a caught-up excluded node posting to us, or an operator starts a
view change, a Paxos instance per view number. Promising freezes a member: it neither
posts nor ADDs in its view until a new view is installed, which is what lets the seal
bound everything the old view added. An excluded node keeps posting to the members, is
served catch-up and, once caught up, is taken back by the next view change. Metas are only
ever merged from members' posts: a meta learned any other way mid-view could slip below
an ADD another member already made, and the seal rule relies on that never happening.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from txsync.protocol.events import (
    BodyAcquired,
    BodyEffect,
    ConfigChangeSynced,
    Event,
    FetchBody,
    HistoryTruncated,
    LocalTx,
    MessageEffect,
    PersistCounter,
    PersistDropIncoming,
    PersistEffect,
    PersistIncoming,
    PersistSynced,
    PersistView,
    PersistViewVote,
    PostReceived,
    PushBody,
    Ready,
    Rejected,
    RoundEffect,
    RoundEnded,
    RoundOutcome,
    RoundStarted,
    SendPost,
    SendSyncedEntries,
    SendViewMessage,
    ServeCatchUpFromLog,
    StateChanged,
    SyncedEntriesReceived,
    Tick,
    ViewChangeRequested,
    ViewMessageReceived,
)
from txsync.protocol.limits import MEMBERS_MAX, Limits, Timing
from txsync.protocol.model import (
    Ballot,
    ConfigChange,
    Configuration,
    MergeBase,
    NodeId,
    Post,
    SyncedEntries,
    TxId,
    TxMeta,
    TxState,
    View,
    ViewAccept,
    ViewAccepted,
    ViewInstall,
    ViewMessage,
    ViewPrepare,
    ViewPromise,
    ViewProposal,
    ViewQuery,
    ViewRefused,
)
from txsync.protocol.queues import IncomingQueue, SyncedQueue, addable_prefix
from txsync.protocol.validation import post_problem, synced_entries_problem
from txsync.protocol.views import (
    SealConflict,
    is_weight_majority,
    new_members,
    promise_problem,
    proposal_problem,
    seal_after,
)


class Mode(enum.Enum):
    BUSY = "busy"
    IDLE = "idle"


class QuorumState(enum.Enum):
    MAJORITY = "majority"
    """A member of the installed view that heard a weight majority lately: it can add."""
    MINORITY = "minority"
    """Excluded from the view, or cut off from a weight majority: it adds nothing and its
    transactions stay INCOMING until it is back."""
    VIEW_CHANGE = "view_change"
    """Frozen by a promise while a new view is agreed."""


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
    view: ViewProposal | None = None
    """The installed view (None: view 0 of the whole configuration)."""
    promised: Ballot | None = None
    accepted_ballot: Ballot | None = None
    accepted: ViewProposal | None = None
    history_len: int = 0
    """Where the store's history starts, as ``HistoryTruncated`` says it: a restarted
    core knows it before its first install, which a lagger the peers let go past
    ``--peer-hold-max`` would otherwise take the seal of (the simulator: seed 98 of
    `delay,drop,duplicate,reorder,crash`, three nodes, a bound of 4)."""


@dataclass(slots=True)
class _ViewChange:
    """This node's own proposal while it runs (Paxos phases 1 and 2)."""

    ballot: Ballot
    started_ms: int
    promises: dict[NodeId, ViewPromise]
    proposal: ViewProposal | None = None
    accepted_by: set[NodeId] = field(default_factory=set)
    last_sent_ms: int = 0


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
    rounds: list[RoundEffect] = field(default_factory=list)


class ProtocolNode:
    def __init__(
        self,
        node_id: NodeId,
        configuration: Sequence[NodeId],
        *,
        now_ms: int,
        durable: DurableState | None = None,
        limits: Limits | None = None,
        timing: Timing | None = None,
        weights: Mapping[NodeId, int] | None = None,
        addresses: Mapping[NodeId, str] | None = None,
    ) -> None:
        """``configuration`` and ``weights`` (default 1 each) are the initial configuration,
        used until a view is installed: from then on the installed view's configuration
        (changed by membership entries of the synced queue) rules. A node joining an
        existing cluster starts outside its configuration and asks for the current view."""
        durable = durable or DurableState()
        self._id = node_id
        self._limits = limits or Limits()
        self._timing = timing or Timing()
        self._now_ms = now_ms

        initial = dict(weights) if weights is not None else dict.fromkeys(configuration, 1)
        assert set(initial) == set(configuration) and min(initial.values()) > 0
        assert len(initial) <= MEMBERS_MAX
        installed = durable.view or ViewProposal.initial(initial, dict(addresses or {}))
        self._installed = installed
        self._weights: dict[NodeId, int] = {}
        self._configured: tuple[NodeId, ...] = ()
        self._rank = 0
        self._members: tuple[NodeId, ...] = ()
        self._others: tuple[NodeId, ...] = ()
        self._set_view(installed)
        self._config_changes: dict[int, ConfigChange] = {}
        """Membership changes synced here and not yet in the configuration, by position."""
        self._promised = durable.promised
        self._accepted_ballot = durable.accepted_ballot
        self._accepted = durable.accepted
        self._attempt = self._promised.attempt if self._promised is not None else 0
        self._frozen_since_ms: int | None = now_ms if self._is_frozen_by_promise() else None
        self._last_vote_ms = now_ms
        self._view_change: _ViewChange | None = None
        self._change_due_ms: int | None = None
        self._heard_ms: dict[NodeId, int] = dict.fromkeys(self._configured, now_ms)
        self._view_answered_ms: dict[NodeId, int] = {}

        self._counter = durable.counter
        self._persisted_counter = durable.counter
        self._local_seq = 0
        self._epoch = durable.epoch
        self._seq = 0
        self._synced = SyncedQueue(
            self._limits.synced_window_max,
            length=durable.synced_len,
            tail=durable.synced_tail,
        )
        self._incoming = IncomingQueue(node_id)
        self._fetches: dict[TxId, _Fetch] = {}
        self._fetches_waiting: dict[TxId, tuple[NodeId, ...]] = {}
        """Bodies wanted while ``pending_fetches_max`` were being fetched, oldest first,
        with their holders: fetched as room frees. Dropped instead, a synced entry's body
        was never fetched (no later post names a synced entry), and the DC's workers
        waited for it for ever (the simulator with a table of 2: seed 0 of `crash`). As
        many as the unacquired metas held anyway (incoming, ``_synced_unacquired``)."""
        self._next_fetch_ms: int | None = None
        for meta, acquired in durable.incoming:
            self._incoming.insert(meta, acquired=acquired)
            if not acquired:
                self._want_body(meta.tx_id, (meta.origin,))
        self._synced_unacquired: dict[TxId, TxMeta] = {}
        for meta in durable.synced_unacquired:
            self._synced_unacquired[meta.tx_id] = meta
            self._want_body(meta.tx_id, (meta.origin, *self._configured))
        self._early_bodies: dict[TxId, None] = {}

        # Round state. A restarted node is busy and starts a round at its first step.
        self._mode = Mode.BUSY
        self._in_round = False
        self._round_no = 0
        self._round_started_ms = now_ms
        self._round_deadline_ms = now_ms
        self._next_round_ms = now_ms
        self._fresh: set[NodeId] = set()
        self._round_posts_sent = 0
        self._round_added = 0
        self._posts: dict[NodeId, Post] = {}
        self._ahead_posts: dict[NodeId, Post] = {}
        self._dirty = False
        self._asks_catch_up = False
        self._last_post_ms = now_ms
        self._catchup_sent: dict[NodeId, tuple[int, int]] = {}
        self._history_len = durable.history_len
        """Where the store's history starts (``HistoryTruncated``): no lagger behind it
        is served from memory, and installs say so."""
        self._seal_history_len = 0
        """The ``history_len`` of the install this node took its view from (0: it chose
        the view, or restarted): its own installs say at least as much, for a node that
        relays a seal holds no more of its bodies than the node it took it from (the
        simulator: seed 46 of `partition`, five nodes, a bound of 4)."""
        self._laggers: dict[NodeId, tuple[Post, int]] = {}
        """Members whose latest post lagged but could be rebased: that post and when to
        serve them catch-up if no post of theirs at our base has come by then."""
        self._fx = _Effects()

    # --- read-only views (for the services' status and for the simulator's checks) ----

    @property
    def node_id(self) -> NodeId:
        return self._id

    @property
    def configuration(self) -> tuple[NodeId, ...]:
        return self._configured

    @property
    def members(self) -> tuple[NodeId, ...]:
        """The installed view's members (this node may not be one of them)."""
        return self._members

    @property
    def installed_view(self) -> ViewProposal:
        return self._installed

    @property
    def is_member(self) -> bool:
        return self._id in self._members

    @property
    def now_ms(self) -> int:
        """The latest time a ``Tick`` brought (the clock of ``last_heard_ms``)."""
        return self._now_ms

    def last_heard_ms(self) -> Mapping[NodeId, int]:
        """When each configured node was last heard from (this node: its start)."""
        return dict(self._heard_ms)

    def quorum_state(self) -> QuorumState:
        """MINORITY whenever no weight majority was heard from within the exclusion
        timeout (a node cut off keeps trying view changes it cannot win, and must say
        plainly that it is cut off), or when excluded from the view."""
        recent = self._now_ms - self._timing.exclusion_timeout_ms
        heard = [node for node, at in self._heard_ms.items() if at > recent or node == self._id]
        if not is_weight_majority(heard, self._weights):
            return QuorumState.MINORITY
        if self._frozen_since_ms is not None:
            return QuorumState.VIEW_CHANGE
        return QuorumState.MAJORITY if self.is_member else QuorumState.MINORITY

    @property
    def counter(self) -> int:
        return self._counter

    @property
    def local_seq_stepped(self) -> int:
        """The highest ``LocalTx.local_seq`` this incarnation has stepped: written with
        every write, made after those steps."""
        return self._local_seq

    @property
    def view_no(self) -> int:
        return self._installed.view.view_no

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
    def history_len(self) -> int:
        """Where the store's history starts, as the caller last said (``HistoryTruncated``):
        no lagger behind it is served from memory."""
        return self._history_len

    @property
    def synced(self) -> SyncedQueue:
        return self._synced

    def incoming_metas(self) -> Sequence[TxMeta]:
        return self._incoming.metas()

    @property
    def incoming_len(self) -> int:
        return len(self._incoming)

    @property
    def own_incoming_len(self) -> int:
        """Incoming metas of this node's own (``Limits.local_admit_txs_max`` bounds them)."""
        return self._incoming.own_len

    def has_room_for_local(self, queued: int = 0) -> bool:
        """Whether one more local submit may be handed over, ``queued`` being on their way
        already. Past ``local_admit_txs_max`` metas of its own in the incoming queue the
        core refuses unstamped local submits; stamped ones cannot be refused, so the
        caller holds every hand-over back until there is room (the coordinator, and the
        simulator as it).

        Own metas, not all: that bound is what keeps every queue able to take the metas
        of every origin (``Limits``), which ADD needs; counting foreign metas too, a DC
        whose queue filled with them took none of its own, for nothing."""
        return self._incoming.own_len + queued < self._limits.local_admit_txs_max

    def is_incoming(self, tx_id: TxId) -> bool:
        return tx_id in self._incoming

    # --- the one way in ------------------------------------------------------------------

    def step(self, event: Event) -> Ready:
        self._fx = _Effects()
        match event:
            case Tick(now_ms):
                self._now_ms = max(self._now_ms, now_ms)
            case LocalTx(tx_id, stamp, local_seq):
                self._on_local_tx(tx_id, stamp, local_seq)
            case PostReceived(post):
                self._on_post(post)
            case SyncedEntriesReceived(entries):
                self._on_synced_entries(entries)
            case BodyAcquired(tx_id):
                self._on_body(tx_id)
            case ViewMessageReceived(message):
                self._on_view_message(message)
            case ViewChangeRequested():
                self._change_due_ms = self._now_ms
            case ConfigChangeSynced(position, change):
                self._on_config_change(position, change)
            case HistoryTruncated(synced_len):
                self._history_len = max(self._history_len, synced_len)
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
            rounds=tuple(fx.rounds),
            next_tick_ms=self._next_tick_ms(),
        )

    # --- events ----------------------------------------------------------------------------

    def _on_local_tx(self, tx_id: TxId, stamp: int, local_seq: int) -> None:
        self._local_seq = max(self._local_seq, local_seq)
        if tx_id in self._incoming:
            self._reject(f"local tx {tx_id}", "already in the incoming queue")
            return
        # A stamped submit is written and acknowledged already: a refusal here would
        # strand a stamp on disk that a restart must not take back at its old timestamp.
        # The shell bounds them instead, handing one over only while the queue holds
        # fewer than local_admit_txs_max metas (the store holds the rest).
        if not stamp and not self.has_room_for_local():
            self._reject(f"local tx {tx_id}", "incoming queue full; retry later")
            return
        if stamp > self._counter:
            # Taken as stamped: the submit's write is durable, and with it this meta and
            # the counter it raises, so nothing is written before the post that names it.
            self._counter = stamp
            self._persisted_counter = max(self._persisted_counter, stamp)
            self._incoming.insert(TxMeta(stamp, tx_id, self._id), acquired=True)
        else:
            # Unstamped, or stamped at or below a counter this node has (maybe) posted
            # without it: stamped anew, and written before any post names it.
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
        if not self._is_peer(post.sender, "post"):
            return
        if not self._same_view(post.sender, post.view_no):
            return
        problem = post_problem(post, self._limits)
        if problem is not None:
            self._reject(f"post from {post.sender}", problem)
            return
        base = self._synced.base
        if post.sender not in self._members or not self.is_member or self._is_frozen():
            # Metas come only from members' posts, and a frozen node neither posts nor
            # adds: all that is left to do is to serve the sender if it lags, and to take
            # an excluded node back once it has caught up.
            if post.base.synced_len < base.synced_len:
                self._serve_lagger(post)
            if post.sender not in self._members and self.is_member:
                self._consider_rejoin(post)
            return
        raised = self._raise_counter(post.counter)
        stale = False  # rebased: it answers no round of ours, sent from an older base
        if post.base.synced_len < base.synced_len:
            rebased = self._rebased(post, base)
            if rebased is None:
                self._laggers.pop(post.sender, None)
                self._serve_lagger(post)
                if raised:
                    self._dirty = True
                return
            waiting = self._laggers.get(post.sender)
            known = self._posts.get(post.sender)
            if known is not None and known.is_newer_than(post):
                pass  # an old post, overtaken: its sender has posted at our base since
            elif waiting is None or post.base.synced_len > waiting[0].base.synced_len:
                # Its base moved since: it is adding by itself, only later than we are.
                self._laggers[post.sender] = (post, self._now_ms + self._timing.catchup_grace_ms)
            elif post.is_newer_than(waiting[0]):
                self._laggers[post.sender] = (post, waiting[1])
            post = rebased  # sent before the sender heard of our ADD: still good news
            stale = True
        else:
            self._laggers.pop(post.sender, None)
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
        elif post.base != base:
            self._reject(f"post from {post.sender}", f"FORK: base {post.base} vs ours {base}")
            return
        known = self._posts.get(post.sender)
        if known is not None and not post.is_newer_than(known):
            return  # a duplicate or an older post: nothing new
        self._posts[post.sender] = post
        if self._in_round and not stale:
            self._fresh.add(post.sender)
        if self._merge(post) or raised:
            self._dirty = True
        if post.queue:
            self._wake()
        if self._try_add():
            return
        if self._in_round and self._fresh.issuperset(self._others):
            self._end_round(RoundOutcome.COMPLETE, peers_hold_our_post=True)

    def _on_synced_entries(self, msg: SyncedEntries) -> None:
        # Synced entries are agreed facts whatever view the sender is in; the prefix
        # checks below are what guard against a forked sender.
        if not self._is_peer(msg.sender, "catch-up"):
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
        self._append_synced(fresh, holders=(msg.sender,))
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
        self._run_view_timers()
        if self._is_frozen():
            pass  # no rounds in a view this node promised to leave
        elif self._in_round:
            if now >= self._round_deadline_ms:
                self._end_round(RoundOutcome.DEADLINE)
            elif self._dirty and now >= self._last_post_ms + self._timing.repost_gap_ms:
                self._repost()
        elif now >= self._next_round_ms:
            self._start_round()
        if self._next_fetch_ms is not None and now >= self._next_fetch_ms:
            self._retry_fetches()
        if self._laggers:
            self._serve_due_laggers()

    def _serve_due_laggers(self) -> None:
        for sender, (post, due_ms) in list(self._laggers.items()):
            if self._now_ms >= due_ms:
                del self._laggers[sender]
                if post.base.synced_len < self._synced.length:
                    self._serve_lagger(post)

    def _start_round(self, *, peers_hold_our_post: bool = False) -> None:
        self._in_round = True
        self._round_no += 1
        self._round_started_ms = self._now_ms
        self._round_deadline_ms = self._now_ms + self._timing.round_timeout_ms
        self._fresh.clear()
        self._fx.rounds.append(RoundStarted(self._round_no, self._now_ms))
        if peers_hold_our_post and self._says_nothing_new():
            self._try_add()  # with the post of ours that the peers hold
        else:
            self._post()

    def _says_nothing_new(self) -> bool:
        """Whether our last post at this base (kept by the rebase, if the base moved) is
        what we would post now: same counter, same queue, nothing asked.

        A round that follows an ADD or a completed round starts without a post then:
        every peer was sent that post and holds it (rebased, as we did, once it reaches
        this base; docs/protocol.md, 'No post that says nothing new'), and posting it
        again only cost both ends a message. A round started by a timer always posts:
        that post tells the peers we are alive, and repairs a post the network lost."""
        if self._asks_catch_up or not self.is_member:
            return False
        mine = self._posts.get(self._id)
        return (
            mine is not None
            and mine.base == self._synced.base
            and mine.counter == self._counter
            and mine.epoch == self._epoch
            and mine.queue == self._incoming.postable(self._limits.post_txs_max)
        )

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
            view_no=self.view_no,
            sender=self._id,
            epoch=self._epoch,
            seq=self._seq,
            base=self._synced.base,
            counter=self._counter,
            queue=self._incoming.postable(self._limits.post_txs_max) if queue is None else queue,
        )
        self._posts[self._id] = post
        self._fx.messages.extend(SendPost(peer, post) for peer in self._others)
        self._round_posts_sent += len(self._others)
        if self._id not in self._weights:
            # Not (or no longer) configured: nobody takes our posts, but whoever installed
            # a newer view tells us about it (we may have been added meanwhile).
            for peer in self._configured:
                self._send_view_answer(peer, ViewQuery(self._id, self.view_no))
        self._dirty = False
        self._asks_catch_up = False
        self._last_post_ms = self._now_ms
        self._try_add()

    def _end_round(self, outcome: RoundOutcome, *, peers_hold_our_post: bool = False) -> None:
        self._in_round = False
        idle = (
            len(self._incoming) == 0
            and not self._synced_unacquired
            and not self._ahead_posts
            and all(not post.queue for post in self._posts.values())
            # After an ADD, only if every other member's post is held at the new base
            # (rebased) and empty: that is the exchange of empty queues an idle round
            # would make, already at hand (docs/protocol.md, 'Idle after an ADD').
            and (
                outcome is not RoundOutcome.ADVANCED
                or all(member in self._posts for member in self._others)
            )
        )
        self._report_round_end(outcome, idle=idle)
        if idle:
            self._mode = Mode.IDLE
            self._next_round_ms = self._now_ms + self._timing.idle_interval_ms
            return
        self._mode = Mode.BUSY
        self._next_round_ms = max(
            self._now_ms, self._round_started_ms + self._timing.busy_round_gap_ms
        )
        if self._next_round_ms <= self._now_ms:
            self._start_round(peers_hold_our_post=peers_hold_our_post)

    def _report_round_end(self, outcome: RoundOutcome, *, idle: bool = False) -> None:
        self._fx.rounds.append(
            RoundEnded(
                round_no=self._round_no,
                started_ms=self._round_started_ms,
                ended_ms=self._now_ms,
                outcome=outcome,
                idle=idle,
                posts_sent=self._round_posts_sent,
                posts_received=len(self._fresh),
                added=self._round_added,
            )
        )
        # Reset here, not when the next round starts: an ADD between rounds (a post that
        # completes it arrives after the round ended) counts in the next round's report.
        self._round_posts_sent = 0
        self._round_added = 0

    def _abandon_round(self) -> None:
        if self._in_round:
            self._in_round = False
            self._report_round_end(RoundOutcome.ABANDONED)

    def _wake(self) -> None:
        """Seed: back to busy on the first non-empty post or local transaction."""
        if self._mode is Mode.IDLE:
            self._mode = Mode.BUSY
            if not self._in_round:
                self._next_round_ms = self._now_ms

    def _try_add(self) -> bool:
        """ADD if a post of every member is at hand for our base; true if the base moved.

        Never below the installed view's seal end: the entries up to it are decided (the
        old view added them), and a member short of them must be served them. Members
        all short of it (the view took laggards in to keep a majority, and the one
        holding the seal's history is down) wait for it; adding at their base forked the
        order (seed 358, five faults, 3 nodes, stamped submits)."""
        if not self.is_member or self._is_frozen() or len(self._posts) < len(self._members):
            return False
        if self._synced.base.synced_len < self._installed.seal_end.synced_len:
            return False
        posts = self._posts.values()
        limit_ts = min(post.counter for post in posts)
        prefix = self._addable([post.queue for post in posts], limit_ts)
        if not prefix:
            return False
        head = tuple(self._incoming.metas()[: len(prefix)])
        assert head == prefix, "an ADDed prefix is always the head of our own queue"
        self._round_added += len(prefix)
        self._append_synced(prefix, holders=())
        self._after_base_change()
        return True

    def _addable(self, queues: Sequence[Sequence[TxMeta]], limit_ts: int) -> tuple[TxMeta, ...]:
        """The ADD rule; a separate method so tests can inject a broken one."""
        return addable_prefix(queues, limit_ts)

    def _rebased(self, post: Post, base: MergeBase) -> Post | None:
        """A member's ``post`` from an earlier base of ours, as a post at ``base``: its
        queue less the entries appended since, if it begins with exactly those; else None.

        It says what the sender would post at ``base`` now (docs/protocol.md, 'Posts kept
        across a base change'): only the ADD it had not heard of yet differs. Never from
        below the installed view's seal: a member still short of it is treated by the seal
        rule as having added nothing in this view (``views.seal_after``), so nothing may be
        added on its behalf. A separate method so tests can inject a broken one."""
        start = post.base.synced_len
        if start < self._installed.seal_end.synced_len or start < self._synced.window_start:
            return None
        if self._synced.base_at(start) != post.base:
            return None
        appended = self._synced.entries(start, base.synced_len - start)
        if post.queue[: len(appended)] != appended:
            return None
        return replace(post, base=base, queue=post.queue[len(appended) :])

    def _after_base_change(self) -> None:
        """Keep what the members' posts still say at the new base (rebased, or posted
        there ahead of us); drop the rest."""
        base = self._synced.base
        posts: dict[NodeId, Post] = {}
        held = [
            *(post for sender, post in self._posts.items() if sender != self._id),
            *self._ahead_posts.values(),
        ]
        for post in held:
            if post.base.synced_len > base.synced_len:
                continue
            kept = post if post.base == base else self._rebased(post, base)
            known = posts.get(post.sender)
            if kept is not None and (known is None or kept.is_newer_than(known)):
                posts[post.sender] = kept
        mine = self._posts.get(self._id)
        mine_kept = None if mine is None else self._rebased(mine, base)
        if mine_kept is not None:
            posts[self._id] = mine_kept
        self._posts = posts
        self._ahead_posts = {
            sender: post
            for sender, post in self._ahead_posts.items()
            if post.base.synced_len > base.synced_len
        }
        if not self._ahead_posts:
            self._asks_catch_up = False  # we reached every base we had seen posts from
        self._dirty = True
        if self._is_frozen():
            # No rounds in a view this node promised to leave (as in _run_timers): a
            # post at the new base (reached by catch-up) would let the others ADD past
            # the base our promise reported, and the seal would lose that ADD.
            return
        if self._in_round:
            self._end_round(RoundOutcome.ADVANCED, peers_hold_our_post=mine_kept is not None)
        else:
            self._mode = Mode.BUSY
            self._next_round_ms = min(self._next_round_ms, self._now_ms)
            self._start_round(peers_hold_our_post=mine_kept is not None)

    def _append_synced(self, metas: Sequence[TxMeta], *, holders: Sequence[NodeId]) -> None:
        """Append agreed metas. ``holders`` (besides each origin) may hold the bodies we
        lack: the forerunner for catch-up, the new members for a seal, none for ADD
        (whose bodies are all held: only acquired metas are posted). Every other member
        of the configuration is asked after them: a synced body is held wherever the
        transaction was applied, and its origin may be down for long or, in a release
        before the truncation kept bodies a peer lacks, have truncated it."""
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
                self._want_body(tx_id, (*holders, meta.origin, *self._configured))
        head = tuple(self._incoming.metas()[: len(metas)])
        if head == tuple(metas):
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
        # In memory only if the entry its base ends with is: a base at the window's very
        # start ends with the entry before it (``base_at`` is None there, not a fork).
        ours = self._synced.base_at(their.synced_len)
        in_memory = (
            their.synced_len >= max(self._synced.window_start, self._history_len)
            and ours is not None
        )
        if in_memory and ours != their:
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
                self.view_no, self._id, their, self._synced.entries(their.synced_len, count_max)
            )
            self._fx.messages.append(SendSyncedEntries(post.sender, entries))
        self._catchup_sent[post.sender] = (their.synced_len, self._now_ms)

    # --- views (PROTOCOL.md §3) ---------------------------------------------------------

    def _is_peer(self, sender: NodeId, what: str) -> bool:
        """A configured node other than us; hearing from it keeps it from exclusion."""
        if sender == self._id or sender not in self._weights:
            self._reject(f"{what} from {sender}", "sender is not a configured peer")
            return False
        self._heard_ms[sender] = self._now_ms
        return True

    def _same_view(self, sender: NodeId, view_no: int) -> bool:
        """True if ``sender`` is in our view; otherwise tell whichever side is behind."""
        if view_no < self.view_no:
            self._send_install(sender)
        elif view_no > self.view_no:
            self._send_view_answer(sender, ViewQuery(self._id, self.view_no))
        return view_no == self.view_no

    def _is_frozen(self) -> bool:
        return self._frozen_since_ms is not None

    def _is_frozen_by_promise(self) -> bool:
        return self._promised is not None and self._id in self._members

    def _set_view(self, installed: ViewProposal) -> None:
        self._installed = installed
        self._weights = installed.configuration.as_dict()
        self._configured = tuple(sorted(self._weights))
        configured = self._id in self._weights
        self._rank = self._configured.index(self._id) if configured else 0
        self._members = installed.view.members
        # A member posts to the other members; an excluded node posts to all members, to
        # be served catch-up and, once caught up, to be taken back. A node removed from
        # the configuration falls silent.
        others = tuple(m for m in self._members if m != self._id)
        self._others = others if configured else ()

    def _on_view_message(self, message: ViewMessage) -> None:
        if isinstance(message, ViewQuery) and message.sender != self._id:
            # Anyone may ask which view is current: a node just added to the
            # configuration (or removed from it) learns that way where it stands.
            if message.view_no < self.view_no:
                self._send_install(message.sender)
            return
        if not self._is_peer(message.sender, type(message).__name__):
            return
        match message:
            case ViewPrepare(sender, ballot):
                self._on_prepare(sender, ballot)
            case ViewPromise():
                self._on_promise(message)
            case ViewAccept(sender, ballot, proposal):
                self._on_accept(sender, ballot, proposal)
            case ViewAccepted(sender, ballot):
                self._on_accepted(sender, ballot)
            case ViewInstall(sender, proposal, history_len):
                if proposal.view.view_no > self.view_no:
                    problem = proposal_problem(proposal, self._limits, None)
                    if problem is not None:
                        self._reject(f"install from {sender}", problem)
                        return
                    self._install(proposal, source=sender, source_history_len=history_len)
            case ViewRefused(sender, ballot, view_no, promised):
                self._on_refused(sender, ballot, view_no, promised)

    def _takes_ballot(self, sender: NodeId, ballot: Ballot) -> bool:
        """Paxos runs one instance per view number: only the next view's ballots count,
        and none below the one we promised. A sender behind us gets our install, one ahead
        of us is asked for its own, a lower ballot is refused naming our promise."""
        if ballot.view_no <= self.view_no:
            self._send_install(sender)
            return False
        if ballot.view_no > self.view_no + 1:
            self._send_view_answer(sender, ViewQuery(self._id, self.view_no))
            return False
        if self._promised is not None and ballot < self._promised:
            refusal = ViewRefused(self._id, ballot, self.view_no, self._promised)
            self._fx.messages.append(SendViewMessage(sender, refusal))
            return False
        return True

    def _on_prepare(self, sender: NodeId, ballot: Ballot) -> None:
        if not self._takes_ballot(sender, ballot):
            return
        if ballot != self._promised:
            self._vote(ballot, self._accepted_ballot, self._accepted)
        self._fx.messages.append(SendViewMessage(sender, self._promise_for(ballot)))

    def _on_accept(self, sender: NodeId, ballot: Ballot, proposal: ViewProposal) -> None:
        if not self._takes_ballot(sender, ballot):
            return
        problem = proposal_problem(proposal, self._limits, self._installed.configuration)
        if problem is None and proposal.view.view_no != ballot.view_no:
            problem = f"proposal for view {proposal.view.view_no} under ballot {ballot}"
        if problem is not None:
            self._reject(f"accept from {sender}", problem)
            return
        if ballot != self._accepted_ballot:
            self._vote(ballot, ballot, proposal)
        self._fx.messages.append(SendViewMessage(sender, ViewAccepted(self._id, ballot)))

    def _vote(
        self, promised: Ballot, accepted_ballot: Ballot | None, accepted: ViewProposal | None
    ) -> None:
        """Record a promise or an acceptance durably; a member stops its rounds."""
        self._promised = promised
        self._accepted_ballot = accepted_ballot
        self._accepted = accepted
        self._attempt = max(self._attempt, promised.attempt)
        self._last_vote_ms = self._now_ms
        self._fx.persist.append(PersistViewVote(promised, accepted_ballot, accepted))
        change = self._view_change
        if change is not None and change.ballot < promised:
            self._view_change = None  # a higher ballot runs this view change now
        if self.is_member and self._frozen_since_ms is None:
            self._frozen_since_ms = self._now_ms
            self._abandon_round()
            self._posts.clear()

    def _promise_for(self, ballot: Ballot) -> ViewPromise:
        return ViewPromise(
            sender=self._id,
            ballot=ballot,
            base=self._synced.base,
            counter=self._counter,
            queue=self._incoming.postable(self._limits.post_txs_max),
            accepted_ballot=self._accepted_ballot,
            accepted=self._accepted,
        )

    def _start_view_change(self) -> None:
        """Propose the next view (only a member proposes): phase 1 to every configured node."""
        if not self.is_member:
            return
        self._attempt += 1
        ballot = Ballot(self.view_no + 1, self._attempt, self._id)
        self._change_due_ms = None
        self._vote(ballot, self._accepted_ballot, self._accepted)
        self._view_change = _ViewChange(
            ballot, self._now_ms, {self._id: self._promise_for(ballot)}, last_sent_ms=self._now_ms
        )
        for peer in self._configured:
            if peer != self._id:
                self._fx.messages.append(SendViewMessage(peer, ViewPrepare(self._id, ballot)))

    def _on_promise(self, promise: ViewPromise) -> None:
        change = self._view_change
        if change is None or promise.ballot != change.ballot or change.proposal is not None:
            return  # late, or for a ballot we gave up
        problem = promise_problem(promise, self._limits)
        if problem is not None:
            self._reject(f"promise from {promise.sender}", problem)
            return
        change.promises[promise.sender] = promise
        self._run_view_timers()

    def _on_refused(
        self, sender: NodeId, ballot: Ballot, view_no: int, promised: Ballot | None
    ) -> None:
        if view_no > self.view_no:
            self._send_view_answer(sender, ViewQuery(self._id, self.view_no))
            return
        change = self._view_change
        if change is None or ballot != change.ballot:
            return
        if promised is not None and promised > change.ballot:
            # Someone else's higher ballot runs this view change; we stay frozen and take
            # over if it does not finish in time.
            self._attempt = max(self._attempt, promised.attempt)
            self._view_change = None

    def _propose(self, change: _ViewChange) -> None:
        """Phase 2: re-propose the highest accepted proposal (Paxos), else seal and choose."""
        promises = change.promises.values()
        accepted = [p for p in promises if p.accepted is not None and p.accepted_ballot is not None]
        if accepted:
            best = max(accepted, key=lambda p: p.accepted_ballot or change.ballot)
            assert best.accepted is not None
            proposal = best.accepted
        else:
            try:
                start, seal = self._seal(promises)
            except SealConflict as conflict:
                self._reject("view change", f"FORK: {conflict}")
                self._view_change = None
                return
            end = start.synced_len + len(seal)
            members = new_members(
                self._installed.view,
                promises,
                end,
                self._weights,
                self._limits.catchup_entries_max,
            )
            configuration = self._next_configuration(members)
            weights = configuration.as_dict()
            members = tuple(m for m in members if m in weights)
            view = View(change.ballot.view_no, members)
            proposal = ViewProposal(view, start, seal, configuration)
        change.proposal = proposal
        change.accepted_by = {self._id}
        change.last_sent_ms = self._now_ms
        self._vote(change.ballot, change.ballot, proposal)
        accept = ViewAccept(self._id, change.ballot, proposal)
        for peer in self._configured:
            if peer != self._id:
                self._fx.messages.append(SendViewMessage(peer, accept))

    def _seal(self, promises: Collection[ViewPromise]) -> tuple[MergeBase, tuple[TxMeta, ...]]:
        """The seal rule; a separate method so tests can inject a broken one."""
        return seal_after(self._installed, promises)

    def _on_accepted(self, sender: NodeId, ballot: Ballot) -> None:
        change = self._view_change
        if change is None or change.proposal is None or ballot != change.ballot:
            return
        change.accepted_by.add(sender)
        if is_weight_majority(change.accepted_by, self._weights):
            proposal = change.proposal
            told = {*self._configured, *proposal.configuration.as_dict()} - {self._id}
            for peer in sorted(told):
                install = ViewInstall(self._id, proposal, self._install_history_len())
                self._fx.messages.append(SendViewMessage(peer, install))
            self._install(proposal, source=None)

    def _install(
        self, proposal: ViewProposal, *, source: NodeId | None, source_history_len: int = 0
    ) -> None:
        """Adopt a chosen view: append what we lack of its seal, forget incoming metas we
        cannot get a body for, and start rounds in it."""
        start = proposal.seal_start.synced_len
        ours = self._synced.length
        if ours >= start:
            start_here = self._synced.base_at(start)
            if start_here is not None and start_here != proposal.seal_start:
                self._reject(f"install of view {proposal.view.view_no}", "FORK at its seal start")
                return
            for index, meta in enumerate(proposal.seal[: max(0, ours - start)]):
                held = self._synced.id_at(start + index)
                if held is not None and held != meta.tx_id:
                    self._reject(
                        f"install of view {proposal.view.view_no}", f"FORK at {start + index}"
                    )
                    return
            fresh = proposal.seal[ours - start :]
            # A node the view's configuration leaves out takes nothing more of the order:
            # its peers keep nothing for it, and bodies it lacks may be gone everywhere
            # (the simulator, seed 1662 of `membership`: dc2, removed at 12, appended a
            # seal up to 16 whose bodies every member had truncated).
            removed = self._id not in proposal.configuration.as_dict()
            # Nor does one behind where the sender's history starts: truncation there
            # went past it (a peer let go, ``--peer-hold-max``), and the seal's bodies
            # may be gone everywhere (the simulator: invariant 4, seed 47 of `crash`
            # with a bound of 4). As a lagger, it is served catch-up or sent to a copy.
            behind = ours < source_history_len
            if fresh and not removed and not behind:
                holders = [m for m in proposal.view.members if m != self._id]
                if source is not None:
                    holders.insert(0, source)
                self._append_synced(fresh, holders=holders)
                self._raise_counter(max(meta.ts for meta in fresh))
        # else: we lag behind the seal; as a lagger in the new view we are served catch-up.
        members = set(proposal.view.members)
        dropped = tuple(
            meta.tx_id
            for meta in self._incoming.metas()
            if meta.origin not in members
            and meta.origin != self._id
            and not self._incoming.is_acquired(meta.tx_id)
        )
        if dropped:
            self._incoming.remove(dropped)
            for tx_id in dropped:
                self._drop_fetch(tx_id)
            self._fx.persist.append(PersistDropIncoming(dropped))
        applied_before = self._installed.configuration.applied_position
        self._fx.persist.append(PersistView(proposal))
        self._set_view(proposal)
        self._seal_history_len = source_history_len
        applied = proposal.configuration.applied_position
        self._config_changes = {n: c for n, c in self._config_changes.items() if n > applied}
        self._change_due_ms = None
        if applied > applied_before and self._config_changes and self.is_member:
            # The next membership change, one view change later. (One that had to wait
            # for a majority waits for the next view change for any other reason.)
            self._change_due_ms = self._now_ms + self._stagger_ms()
        self._promised = None
        self._accepted_ballot = None
        self._accepted = None
        self._frozen_since_ms = None
        self._view_change = None
        self._heard_ms = dict.fromkeys(self._configured, self._now_ms)
        self._posts = {}
        self._ahead_posts = {}
        self._catchup_sent = {}
        self._laggers = {}
        self._dirty = True
        self._mode = Mode.BUSY
        self._abandon_round()
        self._start_round()

    def _on_config_change(self, position: int, change: ConfigChange) -> None:
        """A membership entry is synced here: the next view change applies it (one per
        view change, in synced order). Operators are refused a new change while one
        waits, which bounds what is kept here."""
        if position <= self._installed.configuration.applied_position:
            return
        first = not self._config_changes
        self._config_changes[position] = change
        if first and self._view_change is None:
            due = self._now_ms + self._stagger_ms()
            if self._change_due_ms is None or due < self._change_due_ms:
                self._change_due_ms = due

    def _next_configuration(self, members: Sequence[NodeId]) -> Configuration:
        """The configuration of the next view: the current one with the next pending
        membership change, unless that would leave ``members`` without a weight majority
        (an added node joins later, as any excluded node does, once it has caught up)."""
        current = self._installed.configuration
        if not self._config_changes:
            return current
        position = min(self._config_changes)
        candidate = current.with_change(self._config_changes[position], position)
        weights = candidate.as_dict()
        if not is_weight_majority([m for m in members if m in weights], weights):
            return current
        return candidate

    def _consider_rejoin(self, post: Post) -> None:
        """An excluded node that has caught up is taken back by the next view change
        (started after our rank's stagger, so that members do not all propose at once)."""
        caught_up = post.base.synced_len + self._limits.catchup_entries_max >= self._synced.length
        if caught_up and self._view_change is None and self._change_due_ms is None:
            self._change_due_ms = self._now_ms + self._stagger_ms()

    def _stagger_ms(self) -> int:
        return self._rank * self._timing.view_change_stagger_ms

    def _install_history_len(self) -> int:
        return max(self._history_len, self._seal_history_len)

    def _send_install(self, to: NodeId) -> None:
        # A node short of its view's seal holds none of it: the members that hold it
        # answer (it relayed a seal whose bodies every holder had truncated, with its
        # own history's start, 0: seed 46 of `partition`, five nodes, a bound of 4).
        if self.view_no > 0 and self._synced.length >= self._installed.seal_end.synced_len:
            self._send_view_answer(
                to, ViewInstall(self._id, self._installed, self._install_history_len())
            )

    def _send_view_answer(self, to: NodeId, message: ViewMessage) -> None:
        """Answers about views are rate-limited per node: a lagging node posts often."""
        last = self._view_answered_ms.get(to)
        if last is not None and self._now_ms < last + self._timing.view_resend_ms:
            return
        self._view_answered_ms[to] = self._now_ms
        self._fx.messages.append(SendViewMessage(to, message))

    def _run_view_timers(self) -> None:
        now, timing = self._now_ms, self._timing
        change = self._view_change
        if change is not None:
            if now >= change.started_ms + timing.view_change_timeout_ms + self._stagger_ms():
                self._start_view_change()  # a higher attempt
            elif change.proposal is None:
                if self._ready_to_propose(change):
                    self._propose(change)
                elif now >= change.last_sent_ms + timing.view_resend_ms:
                    change.last_sent_ms = now
                    prepare = ViewPrepare(self._id, change.ballot)
                    for peer in self._configured:
                        if peer not in change.promises:
                            self._fx.messages.append(SendViewMessage(peer, prepare))
            elif now >= change.last_sent_ms + timing.view_resend_ms:
                change.last_sent_ms = now
                accept = ViewAccept(self._id, change.ballot, change.proposal)
                for peer in self._configured:
                    if peer not in change.accepted_by:
                        self._fx.messages.append(SendViewMessage(peer, accept))
            return
        due = self._view_change_due_ms()
        if due is not None and now >= due:
            self._start_view_change()

    def _ready_to_propose(self, change: _ViewChange) -> bool:
        if not is_weight_majority(change.promises, self._weights):
            return False
        everyone = len(change.promises) == len(self._configured)
        return everyone or self._now_ms >= change.started_ms + self._timing.promise_wait_ms

    def _view_change_due_ms(self) -> int | None:
        """When this node (a member, not proposing) should start a view change."""
        if not self.is_member:
            return None
        timing = self._timing
        if self._frozen_since_ms is not None:
            # Frozen by a promise whose proposer went quiet: take the view change over.
            return self._last_vote_ms + timing.view_change_timeout_ms + self._stagger_ms()
        due = self._change_due_ms
        if self._others:
            last_heard = min(self._heard_ms[member] for member in self._others)
            silent_due = last_heard + timing.exclusion_timeout_ms + self._stagger_ms()
            due = silent_due if due is None else min(due, silent_due)
        return due

    def _view_timer_due_ms(self) -> int | None:
        change = self._view_change
        if change is None:
            return self._view_change_due_ms()
        timing = self._timing
        due = min(
            change.started_ms + timing.view_change_timeout_ms + self._stagger_ms(),
            change.last_sent_ms + timing.view_resend_ms,
        )
        if change.proposal is None and is_weight_majority(change.promises, self._weights):
            due = min(due, change.started_ms + timing.promise_wait_ms)
        return due

    # --- bodies --------------------------------------------------------------------------

    def wants_body(self, tx_id: TxId) -> bool:
        """Whether this node still lacks the body and fetches it (a shell drops a queued
        fetch of a body that arrived meanwhile)."""
        return tx_id in self._fetches

    def _want_body(self, tx_id: TxId, holders: Sequence[NodeId]) -> None:
        """Fetch ``tx_id``'s body, asking ``holders`` in turn (the first first)."""
        wanted = [h for h in dict.fromkeys(holders) if h != self._id]
        fetch = self._fetches.get(tx_id)
        if fetch is not None:
            fetch.holders.extend(h for h in wanted if h not in fetch.holders)
            return
        if not wanted:
            return  # retried when a later post names a holder
        if len(self._fetches) >= self._limits.pending_fetches_max:
            waiting = self._fetches_waiting.get(tx_id, ())
            self._fetches_waiting[tx_id] = tuple(dict.fromkeys((*waiting, *wanted)))
            return
        at = self._now_ms + self._timing.body_fetch_delay_ms
        self._fetches[tx_id] = _Fetch(holders=wanted, next_at_ms=at)
        if self._next_fetch_ms is None or at < self._next_fetch_ms:
            self._next_fetch_ms = at

    def _drop_fetch(self, tx_id: TxId) -> None:
        self._fetches.pop(tx_id, None)
        self._fetches_waiting.pop(tx_id, None)
        waiting = self._fetches_waiting
        while waiting and len(self._fetches) < self._limits.pending_fetches_max:
            next_id = next(iter(waiting))
            holders = waiting.pop(next_id)
            if next_id in self._synced_unacquired or (
                next_id in self._incoming and not self._incoming.is_acquired(next_id)
            ):
                self._want_body(next_id, holders)
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
        view_due = self._view_timer_due_ms()
        if self._is_frozen():
            soonest = view_due if view_due is not None else self._now_ms + 1_000_000
        elif self._in_round:
            soonest = self._round_deadline_ms
            if self._dirty:
                soonest = min(soonest, self._last_post_ms + self._timing.repost_gap_ms)
        else:
            soonest = self._next_round_ms
        if self._next_fetch_ms is not None:
            soonest = min(soonest, self._next_fetch_ms)
        if self._laggers:
            soonest = min(soonest, *(due_ms for _, due_ms in self._laggers.values()))
        if view_due is not None:
            soonest = min(soonest, view_due)
        return max(soonest, self._now_ms)
