"""The transaction-store's state and the one way to change it, independent of gRPC
(``service.py``): the core every part of ``TransactionStore`` (``store.py``) works on.

Every change follows one path: under the store's lock, validate the request against the
current state, build log entries (a protocol step's and state changes' rules are pure
functions, ``step_rules``), and ``_stage`` them (hand them to the group-commit
writer and apply them to memory); then, outside the lock, ``_durable`` waits until they
are on disk, and only then is the request answered and are waiters woken.

Validation never changes anything, so a refused request leaves no trace. Applying before
durability keeps later validations consistent; the writer breaking (fsync failure) stops
all writes rather than letting memory and disk disagree.

Memory holds what is staged, the log what is durable: what a client or a follower is
answered goes by the log (``written_tx``, ``_written_state``, ``_has_reached``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Self

from txsync.protocol import TxState
from txsync.refusals import Refusal, Refused
from txsync.settings import (
    BACKUPS_KEPT_DEFAULT,
    BODY_MISSING_ALARM_S_DEFAULT,
    HISTORY_KEPT_DEFAULT,
    HISTORY_KEPT_MS_DEFAULT,
    IDEMPOTENCY_WINDOW_S_DEFAULT,
    INCOMING_TXS_MAX_DEFAULT,
    LOG_FILE_BYTES_MAX_DEFAULT,
    LOG_FILE_ENTRIES_MAX_DEFAULT,
    OPEN_BODY_BYTES_MAX_DEFAULT,
    PEER_HOLD_MAX_DEFAULT,
    UNFINISHED_TXS_MAX_DEFAULT,
    UNPASSED_MAX_DEFAULT,
)
from txsync.shares import Shares
from txsync.telemetry import work
from txsync.telemetry.logs import event as log_event
from txsync.transaction_store.body_cache import BODY_CACHE_BYTES_DEFAULT, BodyCache
from txsync.transaction_store.local_submits import LocalSubmit, LocalWatch
from txsync.transaction_store.retention import MissingBodyWatch, Progress, Verdict, unpassed
from txsync.transaction_store.state import FINAL_STATES, Moved, StoreState, TxRecord
from txsync.transaction_store.step_rules import first_unfinished
from txsync.transaction_store.tx_tracing import measure_transitions, trace_transitions
from txsync.transaction_store.txlog.bodies import BodyStore
from txsync.transaction_store.txlog.files import LogFiles, Recovery
from txsync.transaction_store.txlog.framing import encode_frame
from txsync.transaction_store.txlog.writer import GroupCommitWriter, WriterBrokenError
from txsync.transaction_store.validation import (
    BODIES_PER_CALL_MAX,
    READ_BODIES_BYTES_DEFAULT,
    check_tx_id,
    invalid,
)
from txsync.v1 import common_pb2, txlog_pb2

log = logging.getLogger(__name__)


def _wall_clock_us() -> int:
    return time.time_ns() // 1_000


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreConfig:
    data_dir: Path
    node_id: str
    incoming_txs_max: int = INCOMING_TXS_MAX_DEFAULT
    """Submits are refused (RESOURCE_EXHAUSTED) while this many transactions are INCOMING."""
    unfinished_txs_max: int = UNFINISHED_TXS_MAX_DEFAULT
    """...or while this many are INCOMING or ordered and not yet OK or FAILED here: the
    workers' backlog. The store holds each in memory until every worker passed it, so
    without this bound a load the workers cannot follow grows the store (and, through
    the allocator keeping what it once held, its RSS for good: docs/benchmarks.md)."""
    unpassed_max: int = UNPASSED_MAX_DEFAULT
    """...or while this many transactions, ordered or waiting to be, lie past what a
    peer DC in the view, this DC's slowest worker, its first unfinished transaction or
    the coordinator's core passed (0: never; ``retention.unpassed``). The store holds
    what they have not passed; under a batched load they lagged 6,000-10,000 positions,
    and the store's RSS stayed at that peak for good (pymalloc keeps an arena while one
    object in it lives)."""
    open_body_bytes_max: int = OPEN_BODY_BYTES_MAX_DEFAULT
    """...or while the bodies of unfinished transactions take this many bytes."""
    retry_after_ms: int = 250
    """The retry hint sent with RESOURCE_EXHAUSTED."""
    log_file_bytes_max: int = LOG_FILE_BYTES_MAX_DEFAULT
    """The current log file is rotated (and truncated if allowed) once this many bytes
    were appended since its snapshot. It also bounds start-up work: every body carried
    by the live log is checked against its file."""
    log_file_entries_max: int = LOG_FILE_ENTRIES_MAX_DEFAULT
    """The current log file is also rotated once this many entries were appended since
    its snapshot: a start replays every one, and 16 MiB of small entries (a steady
    load's state changes) were 106,355 entries, 2.01 s to start (docs/benchmarks.md,
    "History bounded"). 65,536 still let a store found with a full file start in 2-3
    times the seconds of one just rotated (48,509 entries: 1.39 s against 0.55 s): a
    restart's time is where the current file is in its cycle, whatever the history."""
    history_kept: int = HISTORY_KEPT_DEFAULT
    """Truncation keeps at least this many of the newest synced positions, passed by
    every peer and worker or not: ``tx get``, waits and retried submits find them. Memory
    holds these and the unfinished transactions, never the whole history."""
    history_kept_ms: int = HISTORY_KEPT_MS_DEFAULT
    """And every transaction finished within this many milliseconds: at 1,700 a second,
    2,000 positions are a second's worth, and a client waiting on a batch's submits one
    after another found the last ones truncated (a wait for a transaction this DC does
    not know ends at its timeout)."""
    peer_hold_max: int = PEER_HOLD_MAX_DEFAULT
    """A peer DC behind holds at most this many of the newest synced positions (0: no
    bound); one further behind is let go, and starts from another DC's copy when it is
    back (docs/dc-snapshots.md). Without it, a DC down for a day held its peers' memory
    and disk for a day of history."""
    backups_kept: int = BACKUPS_KEPT_DEFAULT
    """Retired log files (``bak-``) kept after a rotation; older ones are deleted."""
    body_missing_alarm_s: float = BODY_MISSING_ALARM_S_DEFAULT
    """The first body this DC lacks may wait this long before the status raises an
    alarm (``missing_body_alarm``)."""
    idempotency_window_ms: int = IDEMPOTENCY_WINDOW_S_DEFAULT * 1000
    """Written into every keyed body taken here (``TxBody.key_window_ms``): how long
    after the transaction's time every worker remembers its key, besides the positions
    (``worker.backend.KEYS_REMEMBERED``). In the body, not in each worker's settings, so
    that every worker of every DC draws the line at the same transaction."""
    allow_nondeterministic: bool = False
    """Accept statements whose result depends on the worker (random(), 'now', ...)."""
    witness: bool = False
    """A witness node (PROTOCOL.md §1) votes and relays but has no workers: it refuses
    client transactions, which would otherwise be ordered by a DC that applies nothing."""
    dispatch_address: str = ""
    """This DC's worker-dispatch (``--dispatch``; empty: none, as at a witness). The
    coordinator copies testing workers to and from other DCs through it, so a DC added
    after this one truncated can start from a copy (docs/dc-snapshots.md); without it,
    such an add is refused (``step_rules.check_can_join``)."""
    body_cache_bytes_max: int = BODY_CACHE_BYTES_DEFAULT
    """Bodies of unfinished transactions a rotation filed, kept in memory for reading back
    (``body_cache``)."""
    stamp_clock_us: Callable[[], int] = _wall_clock_us
    """The clock a local submit's stamp is at least under load (microseconds since the
    epoch; a test passes ``lambda: 0`` for plain counter stamps). See
    ``TransactionStore._stamp_clock_us``."""


WAITS_MAX = 10_000
"""Calls waiting on transactions at once (Wait, Submit with wait_for): each holds a task
and a future; past it a wait is refused with a retry hint rather than grow the store."""


QUIET_CLIENT_CALLS_MOST = 2
"""With no more client calls in progress than this (submits, waits), the store counts as
quiet, and the txlog's writer writes a lone frame on the event loop's thread
(``GroupCommitWriter``): under load the loop has other calls to serve during an fsync."""


class Waiter:
    """One ``wait_many`` call, listed under each transaction it waits on: woken when any
    of them moves, or when its time is up."""

    __slots__ = ("timed_out", "woken")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.woken: asyncio.Future[None] = loop.create_future()
        """Done at the next wake; the waiting call replaces it to wait again."""
        self.timed_out = False

    def wake(self) -> None:
        if not self.woken.done():
            self.woken.set_result(None)

    def time_out(self) -> None:
        self.timed_out = True
        self.wake()


@dataclass(slots=True)
class Staged:
    """Entries handed to the writer: its future, and the transitions they made (their
    waiters are woken and their spans emitted once the entries are durable)."""

    future: asyncio.Future[None]
    moved: list[Moved]
    traced_whole: Collection[str] = ()
    """Transactions whose every span is emitted instead (their trace context arrived)."""
    announced: bool = False
    wakes_followers: bool = False
    """A follower waits for this write (``_written_state``): its end wakes the streams."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class StoreCore(ABC):
    """The state, its lock and writer, and what every part of the store shares."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        txlog_dir = config.data_dir / "txlog"
        self.state = StoreState(config.node_id)
        self.files = LogFiles(txlog_dir)
        self.bodies = BodyStore(txlog_dir / "transactions")
        self.recovery = Recovery()
        self.alarms: list[str] = []
        self._missing_body = MissingBodyWatch()
        self.progress = Progress()
        self._finished_through = 0
        """Every synced position up to here is OK or FAILED (first_unfinished_position)."""
        self._client_calls = 0
        """Submit and wait calls in progress (a wait already answered is not counted)."""
        self._writer = GroupCommitWriter(
            self.files, quiet=lambda: self._client_calls <= QUIET_CLIENT_CALLS_MOST
        )
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        """Replaced and set after every durable batch: what the streams wait on."""
        self.waits = Shares(
            "waits on transactions", WAITS_MAX, retry_after_ms=self.config.retry_after_ms
        )
        """Transactions waited on now, by caller (bounded by WAITS_MAX, and a share each)."""
        self._waiters: dict[str, list[Waiter]] = {}
        """Waits by transaction: woken only when that transaction's state moves, not by
        every write (with many clients waiting, waking all of them per fsync cost more
        than the writes)."""
        self._local_watchers: set[LocalWatch] = set()
        self._unhanded: deque[tuple[Staged, Sequence[txlog_pb2.LogEntry]]] = deque()
        """Stamped submits staged and not yet handed to the watchers, in log order: handed
        once durable, in that order (``_hand_durable_submits``)."""
        self._undurable: dict[str, tuple[Staged, TxState | None]] = {}
        """Transactions a write not yet durable moves: the last such write, and the state
        the log holds for them meanwhile (None: none yet). Memory holds what is staged,
        so an answer that promises a state (a wait, a retried submit) goes by the log's
        (``_has_reached``, ``submit_many``)."""
        self.body_cache = BodyCache(config.body_cache_bytes_max)
        self._rotating = False
        self._appended_entries = 0
        """Entries staged since the current file's snapshot (rotation is paced by them,
        as by ``files.appended_bytes``); after a start, those the recovery found there."""
        self._closing = threading.Event()
        """Set by ``close``: a rotation stops filing bodies (in its thread) and gives up."""
        self._one_rotation = asyncio.Lock()
        """Rotations take turns (an operator's truncate can meet an automatic one): two
        filing the same body would write one temporary file at once."""
        self._rotation: asyncio.Task[None] | None = None
        self._truncation: asyncio.Task[None] | None = None
        """A truncation in place in progress (``_truncate_soon``)."""
        self.truncated_verdicts: OrderedDict[str, Verdict] = OrderedDict()
        """The verdicts of the newest ``TRUNCATED_VERDICTS_KEPT`` truncated transactions
        (memory only): a client that waits on one after it was truncated is answered, not
        left to its timeout (``wait_many``)."""
        self._unfiled: dict[str, bytes] = {}
        """Bodies (encoded) whose only copy on disk is an entry of the current log file,
        read from here. A rotation files those of the transactions it keeps and drops
        the rest: most transactions are finished and truncated by then and never get a
        file (creating one cost up to 0.9 ms of CPU, spread over 4,096 directories:
        docs/benchmarks.md, Tuning 18). As large as the bodies in the current file:
        about ``log_file_bytes_max`` at most, while rotations succeed."""
        # TESTING entries not written yet: each goes with its transaction's outcome
        # (``advance_states``). At most one per enqueued, unfinished transaction.
        self._testing_unwritten: dict[str, txlog_pb2.LogEntry] = {}

    @classmethod
    async def open(cls, config: StoreConfig) -> Self:
        """Recover the txlog (cutting and reporting a torn tail) and start the writer."""
        store = cls(config)
        store.recovery = await work.in_thread(store.files.recover, store._replay)
        store._appended_entries = store.recovery.entries_since_snapshot
        if store.recovery.torn_tail is not None:
            alarm = f"txlog torn tail at start-up: {store.recovery.torn_tail}"
            log.warning("%s", alarm, extra=log_event("txlog.torn_tail"))
            store.alarms.append(alarm)
        store._writer.start()
        return store

    def _replay(self, entry: txlog_pb2.LogEntry) -> None:
        """Recovery: apply an entry, and keep a body it carries (not filed yet)."""
        kind = entry.WhichOneof("entry")
        if kind == "truncated":
            for tx_id in self.state.truncation_cut(entry.truncated.synced_offset + 1):
                self._unfiled.pop(tx_id, None)
        self.state.apply(entry)
        if kind == "snapshot":
            self._unfiled.clear()  # the rotation that wrote it filed what it kept
            return
        if kind not in ("submitted", "body_stored"):
            return
        carried = entry.submitted if kind == "submitted" else entry.body_stored
        if carried.body:
            self._unfiled[carried.tx_id] = carried.body

    async def close(self) -> None:
        """Make everything durable and stop (graceful shutdown). A rotation still filing
        bodies outside the lock is abandoned: the log it would retire stays, whole."""
        self._closing.set()
        if self._rotation is not None:
            await self._rotation
        if self._truncation is not None:
            await self._truncation
        await self._writer.close()
        self.files.close()

    @property
    def broken(self) -> str | None:
        return self._writer.broken

    def _stage(
        self,
        entries: Sequence[txlog_pb2.LogEntry],
        *,
        traced_whole: Collection[str] = (),
        hand_over: bool = False,
    ) -> Staged:
        """Under the lock: hand entries to the writer and apply them to memory. Once they
        are durable, local submits among them go to the coordinator (``hand_over``) and
        the log's state moves on (``_on_durable``), both before any caller resumes;
        the caller then wakes the waiters (``_durable``)."""
        batch = txlog_pb2.LogBatch(entries=entries)
        try:
            future = self._writer.submit(encode_frame(batch.SerializeToString()))
        except WriterBrokenError as error:
            raise Refusal(Refused.UNAVAILABLE, str(error)) from None
        work.count(work.LOG_BATCHES)
        work.count(work.LOG_ENTRIES, len(entries))
        self._appended_entries += len(entries)
        moved: list[Moved] = []
        apply = self.state.apply
        for entry in entries:
            if entry.HasField("state"):
                work.count(work.STATE_ENTRIES)
            moved += apply(entry)
        staged = Staged(future, moved, traced_whole)
        undurable = self._undurable
        for transition in moved:
            record = transition.record
            held = undurable.get(record.tx_id)
            if held is not None:
                written = held[1]
            else:
                written = record.history[transition.index - 1].state if transition.index else None
            undurable[record.tx_id] = (staged, written)
        if hand_over:  # in log order, ahead of everything the write's end wakes
            self._unhanded.append((staged, entries))
            future.add_done_callback(self._hand_durable_submits)
        future.add_done_callback(functools.partial(self._on_durable, staged))
        return staged

    def _on_durable(self, staged: Staged, future: asyncio.Future[None]) -> None:
        """The write is on disk: its transitions count as reached (a callback of the
        write's future, so before any caller resumes)."""
        if future.cancelled() or future.exception() is not None:
            return  # the writer broke: nothing staged since is durable, nor will be
        undurable = self._undurable
        for transition in staged.moved:  # writes end in the order they were staged
            tx_id = transition.record.tx_id
            held = undurable.get(tx_id)
            if held is None:
                continue
            if held[0] is staged:
                del undurable[tx_id]
            else:  # a later write moves it further
                undurable[tx_id] = (held[0], transition.step.state)

    async def _durable(self, staged: Staged) -> None:
        try:
            # Shielded: a caller that is cancelled (a client hanging up) must not cancel
            # the write's future, whose callbacks (the hand-over of local submits, the
            # log's state) take it as the word that the write is durable.
            await asyncio.shield(staged.future)
        except WriterBrokenError as error:
            raise Refusal(Refused.UNAVAILABLE, str(error)) from None
        except asyncio.CancelledError:
            # The caller hung up: the write's end still wakes its waiters, now and not
            # at some later write that may never come.
            staged.future.add_done_callback(functools.partial(self._announce_durable, staged))
            raise
        # Announced here, as the caller resumes, not in a callback of the write's
        # future: a callback woke every waiter and stream before the caller went on, and
        # the caller is the coordinator's step, whose answer orders the next rounds (16
        # clients per DC: 10% fewer transactions a second, 10% more CPU each).
        self._announce_durable(staged)
        if self._log_file_full() and not self._rotating:
            self._start_rotation()

    def _log_file_full(self) -> bool:
        return (
            self.files.appended_bytes > self.config.log_file_bytes_max
            or self._appended_entries > self.config.log_file_entries_max
        )

    @abstractmethod
    def _start_rotation(self) -> None:
        """Rotate the current file, which is full, in the background (``rotation``)."""

    def _announce_durable(self, staged: Staged, future: object = None) -> None:
        """``_announce`` a durable write's transitions, once (a repeated submit's call
        may await another call's write)."""
        if staged.announced or staged.future.cancelled() or staged.future.exception():
            return
        staged.announced = True
        self._announce(staged.moved, staged.traced_whole)

    def _announce(self, moved: Sequence[Moved], traced_whole: Collection[str] = ()) -> None:
        """Wake the waiters of these transitions and the streams, and emit their spans.
        Waiters first: the loop runs what is woken in order, and a waiter is a client
        waiting for its answer, a stream (the dispatch's feed) work behind it."""
        waiters = self._waiters
        if waiters:
            for transition in moved:
                for waiter in waiters.pop(transition.record.tx_id, ()):
                    waiter.wake()
        self._notify()
        trace_transitions(self.state.node_id, moved, skip=traced_whole)
        measure_transitions(moved)

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _entry(self, at_unix_ms: int = 0, **kwargs: object) -> txlog_pb2.LogEntry:
        return txlog_pb2.LogEntry(at_unix_ms=at_unix_ms or now_ms(), **kwargs)  # type: ignore[arg-type]

    def _hand_durable_submits(self, _: object = None) -> None:
        """Local submits go to the coordinator with their stamps and bodies (which it
        pushes to the peers without reading them back from here) once durable, in log
        order: the coordinator then posts a stamped one at once, with no write of its own
        (docs/protocol.md, "The submit's counter, stamped by the store"), and takes the
        highest local_seq it has stepped as proof of every one before it. A callback of
        the write's future, not a step of the submitting call, so that a client that
        hangs up does not hold its submits back. (Handed before their fsync, as they
        once were, the coordinator had to write their metas and wait for that write
        before posting: a ``PersistSteps`` round trip and an fsync per local
        transaction.)"""
        unhanded = self._unhanded
        while unhanded and unhanded[0][0].future.done():
            staged, entries = unhanded.popleft()
            if staged.future.cancelled() or staged.future.exception() is not None:
                continue  # the writer broke: the coordinator's next write fails too
            for watcher in self._local_watchers:
                for entry in entries:
                    watcher.hand(self._handed(entry.submitted))

    @staticmethod
    def _handed(submitted: txlog_pb2.TxSubmitted) -> LocalSubmit:
        return LocalSubmit(
            submitted.tx_id,
            submitted.body,
            submitted.body_digest,
            submitted.traceparent,
            submitted.ts,
            submitted.local_seq,
        )

    def _delete_bodies(self, tx_ids: Iterable[str]) -> None:
        for tx_id in tx_ids:
            self.bodies.delete(tx_id)

    async def read_body(self, tx_id: str) -> common_pb2.TxBody | None:
        encoded = await self.read_encoded_body(tx_id)
        if encoded is None:
            return None
        body = common_pb2.TxBody()
        body.ParseFromString(encoded)
        work.count(work.BODY_DECODES)
        return body

    async def read_encoded_body(self, tx_id: str) -> bytes | None:
        """The body as it was submitted (an encoded ``TxBody``), or None if not held:
        what passes a body on (to dispatch, to a peer) without decoding it."""
        encoded = self._body_in_memory(tx_id)
        if encoded is None:
            encoded = await work.in_thread(self.bodies.read, tx_id)
        return encoded

    def _body_in_memory(self, tx_id: str) -> bytes | None:
        """A body not filed yet, or one the cache holds (unfinished when filed)."""
        encoded = self._unfiled.get(tx_id)
        return self.body_cache.get(tx_id) if encoded is None else encoded

    async def read_bodies(
        self, tx_ids: Sequence[str], bytes_max: int = READ_BODIES_BYTES_DEFAULT
    ) -> tuple[list[tuple[str, bytes, TxRecord]], list[str]]:
        """The bodies held of ``tx_ids`` (encoded, as stored), with their records, together
        at most ``bytes_max`` but the first; and the held ones left out for that budget
        (read them by another call). Ids not held are in neither list. Held means
        recorded in the txlog, not merely a file: a coordinator told of a file alone would
        mark the body acquired before the store could enqueue it."""
        if len(tx_ids) > BODIES_PER_CALL_MAX:
            raise invalid(f"tx_ids: {len(tx_ids)} is over {BODIES_PER_CALL_MAX}")
        for tx_id in tx_ids:
            check_tx_id(tx_id)
        txs = self.state.txs
        chosen: list[str] = []
        unread: list[str] = []
        size = 0
        for tx_id in tx_ids:
            record = txs.get(tx_id)
            if record is None or not record.body_held:
                continue
            if chosen and size + record.body_bytes > bytes_max:
                unread.append(tx_id)  # the budget is checked before a file is read
                continue
            chosen.append(tx_id)
            size += record.body_bytes
        cached = [self._body_in_memory(tx_id) for tx_id in chosen]
        if any(body is None for body in cached):
            cached = await work.in_thread(self._read_missing, chosen, cached)
        held: list[tuple[str, bytes, TxRecord]] = []
        for tx_id, body in zip(chosen, cached, strict=True):
            record = txs.get(tx_id)  # a rotation may have truncated it meanwhile
            if body is not None and record is not None and record.body_held:
                held.append((tx_id, body, record))
        return held, unread

    def _read_missing(
        self, tx_ids: Sequence[str], cached: list[bytes | None]
    ) -> list[bytes | None]:
        return [
            self.bodies.read(tx_id) if body is None else body
            for tx_id, body in zip(tx_ids, cached, strict=True)
        ]

    def written_tx(self, tx_id: str) -> TxRecord | None:
        """The transaction as the log holds it: what a client reads (``Get``, ``List``,
        the record a wait answers with). Memory holds what is staged too, and a state
        read from a write still on disk is one a crash may take back (a synced position
        recomputed, an outcome run again). None: not even its first state is written."""
        record = self.state.tx(tx_id)
        return record if record is None else self._written(record)

    def _written(self, record: TxRecord) -> TxRecord | None:
        held = self._undurable.get(record.tx_id)
        return record if held is None else as_written(record, held[1])

    def _written_state(self, record: TxRecord | None) -> TxState | None:
        """The record's state as the log holds it (TESTING too, never written alone).
        A follower streams a position only once its synced entry is durable: a synced
        append still on its way to disk is one a crash may take back, and the agreed
        order may then put another transaction at that position, which a worker fed the
        first would have applied in its place (the simulator found it once it ran this
        store's own state: seed 1625 of five-node delay,drop,duplicate,reorder,crash)."""
        if record is None:
            return None
        held = self._undurable.get(record.tx_id)
        if held is None:
            return record.state
        if not held[0].wakes_followers:
            # The write's end wakes the followers itself, whoever announces it (a step
            # whose stream ended is announced by no one): a follower that found this
            # position waiting for it must not sleep until some later write. Registered
            # after ``_on_durable``, so the position counts as written when it runs.
            held[0].wakes_followers = True
            held[0].future.add_done_callback(self._wake_followers)
        return held[1]

    def _wake_followers(self, _: object = None) -> None:
        self._notify()

    def _has_reached(self, tx_id: str, state: TxState) -> bool:
        """Durably (or TESTING, which is never written alone): memory holds staged
        states, and a waiter answered from one a crash then takes back was lied to."""
        held = self._undurable.get(tx_id)
        if held is not None:  # that write's _announce_durable wakes the waiter
            return held[1] is not None and reached(held[1], state)
        record = self.state.tx(tx_id)
        if record is not None:
            return record.state is not None and reached(record.state, state)
        verdict = self.truncated_verdicts.get(tx_id)
        return verdict is not None and reached(verdict.state, state)

    def unpassed(self) -> tuple[int, str]:
        """How far the slowest of the peers in the view, this DC's workers and its
        unfinished transactions is behind the synced end, and which
        (``retention.unpassed``; ``--unpassed-max``)."""
        return unpassed(
            self.state, self.progress, first_unfinished=self.first_unfinished_position()
        )

    def first_unfinished_position(self) -> int:
        """The first synced position (1-based) not yet OK or FAILED in the log; one past
        the end if every one is. States only move forward, so the scan resumes where it
        last stopped: amortised, each position is looked at once."""
        position = first_unfinished(self.state, self._finished_through + 1, self._undurable)
        self._finished_through = position - 1
        return position

    def ordered_unfinished(self) -> int:
        """Synced positions from the first unfinished one on: ordered and not yet OK or
        FAILED here (a few finished out of order among them count too)."""
        return self.state.synced_len + 1 - self.first_unfinished_position()


def as_written(record: TxRecord, written: TxState | None) -> TxRecord | None:
    """``record`` without what is staged beyond ``written``, the state its log holds
    (None: nothing yet). TESTING stays: it is never written alone (``advance_states``)."""
    if written is None:
        return None
    history = record.history
    end = len(history)
    while (
        end > 1
        and history[end - 1].state > written
        and history[end - 1].state is not TxState.TESTING
    ):
        end -= 1
    reached = history[end - 1].state
    return replace(
        record,
        history=history[:end],
        outcome=record.outcome if reached in FINAL_STATES else None,
        position=record.position if reached >= TxState.ACCEPTED else 0,
    )


def reached(current: TxState, wanted: TxState) -> bool:
    if wanted in FINAL_STATES:
        return current in FINAL_STATES
    return current >= wanted
