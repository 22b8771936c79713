"""The transaction-store's logic, independent of gRPC plumbing (``service.py``).

Every change follows one path: under the store's lock, validate the request against the
current state, build log entries (a protocol step's and state changes' rules are pure
functions, ``step_rules``), and ``_stage`` them (hand them to the group-commit
writer and apply them to memory); then, outside the lock, ``_durable`` waits until they
are on disk, and only then is the request answered and are waiters woken.

Validation never changes anything, so a refused request leaves no trace. Applying before
durability keeps later validations consistent; the writer breaking (fsync failure) stops
all writes rather than letting memory and disk disagree.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from txsync.protocol import MergeBase, TxMeta, TxState
from txsync.refusals import Refusal, Refused
from txsync.settings import (
    BACKUPS_KEPT_DEFAULT,
    FOLLOW_GATHER_MS_MOST,
    HISTORY_KEPT_DEFAULT,
    HISTORY_KEPT_MS_DEFAULT,
    IDEMPOTENCY_WINDOW_S_DEFAULT,
    INCOMING_TXS_MAX_DEFAULT,
    LOG_FILE_BYTES_MAX_DEFAULT,
    OPEN_BODY_BYTES_MAX_DEFAULT,
    UNFINISHED_TXS_MAX_DEFAULT,
)
from txsync.shares import Shares
from txsync.telemetry import work
from txsync.telemetry.logs import event as log_event
from txsync.transaction_store.body_cache import BODY_CACHE_BYTES_DEFAULT, BodyCache
from txsync.transaction_store.local_submits import LocalSubmit, LocalSubmitBatch, LocalWatch
from txsync.transaction_store.retention import (
    Carried,
    Progress,
    TruncationHold,
    Verdict,
    carried_entries,
    split_by_budget,
    truncation_hold,
)
from txsync.transaction_store.state import FINAL_STATES, Moved, StoreState, TxRecord
from txsync.transaction_store.step_rules import (
    BodyEntries,
    PeerBody,
    ProtocolState,
    ProtocolStep,
    StateChangeRequest,
    StoredBody,
    check_can_join,
    first_unfinished,
    keep_testing,
    plan_bodies,
    plan_step,
    plan_verdicts,
    protocol_state,
    read_synced,
    stamp_floor,
    stamps_at_clock,
)
from txsync.transaction_store.tx_tracing import (
    measure_transitions,
    trace_history,
    trace_transitions,
)
from txsync.transaction_store.txlog.bodies import BodyStore, body_digest
from txsync.transaction_store.txlog.files import LogFiles, Recovery
from txsync.transaction_store.txlog.framing import encode_frame
from txsync.transaction_store.txlog.writer import GroupCommitWriter, WriterBrokenError
from txsync.transaction_store.validation import (
    BODIES_PER_CALL_MAX,
    FORGOTTEN_METAS_MAX,
    PERSIST_METAS_MAX,
    READ_BODIES_BYTES_DEFAULT,
    READ_SYNCED_MAX,
    STATE_CHANGES_MAX,
    check_body,
    check_membership,
    check_peer_body,
    check_tx_id,
    invalid,
)
from txsync.v1 import common_pb2, txlog_pb2

log = logging.getLogger(__name__)

SERVICE_NAME = "transaction-store"


def _wall_clock_us() -> int:
    return time.time_ns() // 1_000


def _retry_digest(body: common_pb2.TxBody, first: TxRecord, digest: bytes) -> bytes:
    """The digest of ``body`` as a retry of ``first`` (the submit taken here with its
    key): with the first's time (``key_taken_unix_ms``, its INCOMING step's), not this
    call's, which is all that may differ between the two as the store wrote them."""
    taken_ms = next((s.at_unix_ms for s in first.history if s.state is TxState.INCOMING), 0)
    if not taken_ms or not body.key_taken_unix_ms or taken_ms == body.key_taken_unix_ms:
        return digest
    body.key_taken_unix_ms = taken_ms
    return body_digest(body.SerializeToString())


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
    open_body_bytes_max: int = OPEN_BODY_BYTES_MAX_DEFAULT
    """...or while the bodies of unfinished transactions take this many bytes."""
    retry_after_ms: int = 250
    """The retry hint sent with RESOURCE_EXHAUSTED."""
    log_file_bytes_max: int = LOG_FILE_BYTES_MAX_DEFAULT
    """The current log file is rotated (and truncated if allowed) once this many bytes
    were appended since its snapshot. It also bounds start-up work: every body carried
    by the live log is checked against its file."""
    history_kept: int = HISTORY_KEPT_DEFAULT
    """Truncation keeps at least this many of the newest synced positions, passed by
    every peer and worker or not: ``tx get``, waits and retried submits find them. Memory
    holds these and the unfinished transactions, never the whole history."""
    history_kept_ms: int = HISTORY_KEPT_MS_DEFAULT
    """And every transaction finished within this many milliseconds: at 1,700 a second,
    2,000 positions are a second's worth, and a client waiting on a batch's submits one
    after another found the last ones truncated (a wait for a transaction this DC does
    not know ends at its timeout)."""
    backups_kept: int = BACKUPS_KEPT_DEFAULT
    """Retired log files (``bak-``) kept after a rotation; older ones are deleted."""
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
    body_cache_bytes_max: int = BODY_CACHE_BYTES_DEFAULT
    """Bodies of unfinished transactions a rotation filed, kept in memory for reading back
    (``body_cache``)."""
    stamp_clock_us: Callable[[], int] = _wall_clock_us
    """The clock a local submit's stamp is at least under load (microseconds since the
    epoch; a test passes ``lambda: 0`` for plain counter stamps). See
    ``TransactionStore._stamp_clock_us``."""


@dataclass(frozen=True, slots=True)
class Submitted:
    tx_id: str
    created: bool
    state: TxState


FOLLOW_BATCH_MAX = 256
"""Positions per batch that ``follow_enqueued`` yields (one stream message each)."""
FOLLOW_GATHER_BELOW = 32
"""A follower's pause (``gather_s``) follows only a batch of fewer positions than this:
a bigger one says the load batches by itself, and a pause would only idle the follower
(batches of 50 submits, 4 clients per DC: 5-10% fewer transactions a second with a 20 ms
pause after every batch; docs/benchmarks.md, Tuning 26)."""
LOCAL_WATCHERS_MAX = 8
"""Concurrent ``watch_local_submits`` streams (one per coordinator incarnation)."""
WAITS_MAX = 10_000
"""Calls waiting on transactions at once (Wait, Submit with wait_for): each holds a task
and a future; past it a wait is refused with a retry hint rather than grow the store."""
QUIET_CLIENT_CALLS_MOST = 2
"""With no more client calls in progress than this (submits, waits), the store counts as
quiet, and the txlog's writer writes a lone frame on the event loop's thread
(``GroupCommitWriter``): under load the loop has other calls to serve during an fsync."""
LIST_SCAN_MAX = 20_000
"""Transactions one ``List`` call looks at (8 ms of the event loop here); a page
it cannot fill within them ends early, with a token to go on from."""


class _Waiter:
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
class _Staged:
    """Entries handed to the writer: its future, and the transitions they made (their
    waiters are woken and their spans emitted once the entries are durable)."""

    future: asyncio.Future[None]
    moved: list[Moved]
    traced_whole: Collection[str] = ()
    """Transactions whose every span is emitted instead (their trace context arrived)."""
    announced: bool = False
    wakes_followers: bool = False
    """A follower waits for this write (``_written_state``): its end wakes the streams."""


class _CheckedBody(NamedTuple):
    sent: PeerBody
    body: common_pb2.TxBody
    """Parsed, within the limits, matching its digest."""


@dataclass(frozen=True, slots=True)
class StagedStep:
    """A protocol step applied in memory and handed to the writer (``stage_step``)."""

    staged: _Staged | None
    """None: the step changed nothing."""
    entries: list[txlog_pb2.LogEntry]
    merge_base: MergeBase
    traced: Sequence[str] = ()
    """Transactions whose trace context arrived with a body of this step."""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class TransactionStore:
    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        txlog_dir = config.data_dir / "txlog"
        self.state = StoreState(config.node_id)
        self.files = LogFiles(txlog_dir)
        self.bodies = BodyStore(txlog_dir / "transactions")
        self.recovery = Recovery()
        self.alarms: list[str] = []
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
        self._waiters: dict[str, list[_Waiter]] = {}
        """Waits by transaction: woken only when that transaction's state moves, not by
        every write (with many clients waiting, waking all of them per fsync cost more
        than the writes)."""
        self._local_watchers: set[LocalWatch] = set()
        self._unhanded: deque[tuple[_Staged, Sequence[txlog_pb2.LogEntry]]] = deque()
        """Stamped submits staged and not yet handed to the watchers, in log order: handed
        once durable, in that order (``_hand_durable_submits``)."""
        self._undurable: dict[str, tuple[_Staged, TxState | None]] = {}
        """Transactions a write not yet durable moves: the last such write, and the state
        the log holds for them meanwhile (None: none yet). Memory holds what is staged,
        so an answer that promises a state (a wait, a retried submit) goes by the log's
        (``_has_reached``, ``submit_many``)."""
        self.body_cache = BodyCache(config.body_cache_bytes_max)
        self._rotating = False
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
    async def open(cls, config: StoreConfig) -> TransactionStore:
        """Recover the txlog (cutting and reporting a torn tail) and start the writer."""
        store = cls(config)
        store.recovery = await work.in_thread(store.files.recover, store._replay)
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

    # --- the one way to change anything --------------------------------------------------

    def _stage(
        self,
        entries: Sequence[txlog_pb2.LogEntry],
        *,
        traced_whole: Collection[str] = (),
        hand_over: bool = False,
    ) -> _Staged:
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
        moved: list[Moved] = []
        apply = self.state.apply
        for entry in entries:
            if entry.HasField("state"):
                work.count(work.STATE_ENTRIES)
            moved += apply(entry)
        staged = _Staged(future, moved, traced_whole)
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

    def _on_durable(self, staged: _Staged, future: asyncio.Future[None]) -> None:
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

    async def _durable(self, staged: _Staged) -> None:
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
        if self.files.appended_bytes > self.config.log_file_bytes_max and not self._rotating:
            self._rotating = True
            # Keep a strong reference: the loop holds tasks only weakly.
            self._rotation = asyncio.get_running_loop().create_task(self._rotate_in_background())

    def _announce_durable(self, staged: _Staged, future: object = None) -> None:
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
        return txlog_pb2.LogEntry(at_unix_ms=at_unix_ms or _now_ms(), **kwargs)  # type: ignore[arg-type]

    # --- client API ----------------------------------------------------------------------

    def _check_capacity(self, *, staged: int = 0, admin: bool = False) -> None:
        """Backpressure; ``staged`` counts submits of this batch not yet applied. A
        membership change (``admin``) passes the workers' backlog: removing a DC must
        not wait for this DC's workers."""
        state, config = self.state, self.config
        waiting = state.incoming_state_txs + staged
        if waiting >= config.incoming_txs_max:
            raise Refusal(
                Refused.OVERLOADED,
                f"{waiting} transactions are waiting to be ordered "
                f"(limit {config.incoming_txs_max}); retry later",
                retry_after_ms=config.retry_after_ms,
            )
        if not admin and not config.witness:
            unfinished = waiting + self.ordered_unfinished()
            if unfinished >= config.unfinished_txs_max:
                raise Refusal(
                    Refused.OVERLOADED,
                    f"{unfinished} transactions are waiting to be ordered or applied at "
                    f"{config.node_id} (limit {config.unfinished_txs_max}: its workers are "
                    "behind); retry later or at another DC",
                    retry_after_ms=config.retry_after_ms,
                )
        if state.open_body_bytes >= config.open_body_bytes_max:
            raise Refusal(
                Refused.OVERLOADED,
                f"unfinished transactions' bodies take {state.open_body_bytes} bytes "
                f"(limit {config.open_body_bytes_max}); retry later",
                retry_after_ms=config.retry_after_ms,
            )

    async def submit_many(
        self, submits: Sequence[tuple[common_pb2.TxBody, str, str]], *, admin: bool = False
    ) -> list[Submitted | Refusal]:
        """Submit (body, idempotency key, traceparent) triples; each answered on its own.
        The log entries of every accepted submit carry their bodies and go into one
        batch, so a whole SubmitBatch costs one fsync (their files wait for a rotation:
        ``_unfiled``). Membership entries come only from the admin API
        (``admin``)."""
        self._client_calls += 1
        try:
            return await self._submit_many(submits, admin=admin)
        finally:
            self._client_calls -= 1

    async def _submit_many(
        self, submits: Sequence[tuple[common_pb2.TxBody, str, str]], *, admin: bool
    ) -> list[Submitted | Refusal]:
        if self.config.witness and not admin:
            raise Refusal(
                Refused.PRECONDITION,
                f"{self.config.node_id} is a witness (it applies nothing): submit at a DC",
            )
        keys = [key or body.idempotency_key for body, key, _ in submits]
        if not any(key in self.state.idempotency for key in keys if key):
            # Over a limit already, and no retry of a submit taken here among them (those
            # are answered whatever the load): refuse the lot before encoding, checking
            # and hashing each body. Clients retry refused submits; a refusal must cost
            # the store less than taking them, or the retries keep it over the limit.
            try:
                self._check_capacity(admin=admin)
            except Refusal as full:
                return [full] * len(submits)
        prepared: list[tuple[str, bytes] | Refusal] = []
        taken_ms = _now_ms()  # each keyed body's and its INCOMING step's (a retry's check)
        for (body, _, _), key in zip(submits, keys, strict=True):
            if key and body.idempotency_key != key:
                # The key travels with the body, so that every DC can tell a retry made
                # at another DC from a new transaction (docs/client.md, "Idempotency").
                if body.idempotency_key:
                    prepared.append(invalid(
                        f"body.idempotency_key {body.idempotency_key!r} differs from the "
                        f"submit's idempotency_key {key!r}: give one, or the same"
                    ))  # fmt: skip
                    continue
                body.idempotency_key = key
            # This DC's window and clock, whatever the client sent; a retry here is
            # compared as if given the first's (``_retry_digest``).
            body.key_window_ms = self.config.idempotency_window_ms if key else 0
            body.key_taken_unix_ms = taken_ms if key else 0
            encoded = body.SerializeToString()
            work.count(work.BODY_ENCODES)
            try:
                check_body(
                    body,
                    len(encoded),
                    allow_nondeterministic=self.config.allow_nondeterministic,
                )
                if body.HasField("membership") and not admin:
                    raise invalid("body.membership: membership changes go through the admin API")
            except Refusal as error:
                prepared.append(error)
                continue
            prepared.append((str(uuid.uuid4()), encoded))
        results: list[Submitted | Refusal] = []
        entries: list[txlog_pb2.LogEntry] = []
        in_flight: dict[int, _Staged] = {}  # writes on their way that this call repeats
        async with self._lock:
            # Stamped above every counter and timestamp staged (the state applies what is
            # staged): the protocol takes the stamp if its counter is still below it.
            stamp = stamp_floor(self.state, self._stamp_clock_us(len(prepared)))
            local_seq = self.state.local_seq
            batch_keys: dict[str, str] = {}
            batch_digests: dict[str, bytes] = {}
            for (body, _, traceparent), key, item in zip(submits, keys, prepared, strict=True):
                if isinstance(item, Refusal):
                    results.append(item)
                    continue
                tx_id, encoded = item
                digest = body_digest(encoded)
                existing = None
                if key:
                    existing = self.state.idempotency.get(key) or batch_keys.get(key)
                if existing is not None:
                    record = self.state.txs.get(existing)
                    first_digest = record.body_digest if record else batch_digests.get(key)
                    if record is not None and first_digest != digest:
                        digest = _retry_digest(body, record, digest)
                    if first_digest and first_digest != digest:
                        results.append(Refusal(
                            Refused.CONFLICT,
                            f"idempotency key {key!r} belongs to tx {existing}, whose body "
                            "differs from this one: a retry must send the same body, and "
                            "a new transaction a new key",
                        ))  # fmt: skip
                        continue
                    state = record.state if record and record.state else TxState.INCOMING
                    if (held := self._undurable.get(existing)) is not None:
                        writing, written = held
                        if written is None:  # its submit is on its way
                            in_flight[id(writing)] = writing
                        else:
                            state = written  # what the log holds, not what is on its way
                    results.append(Submitted(existing, False, state))
                    continue
                try:
                    self._check_capacity(staged=len(entries), admin=admin)
                except Refusal as error:
                    results.append(error)
                    continue
                stamp += 1
                local_seq += 1
                entries.append(
                    self._entry(
                        at_unix_ms=taken_ms,
                        submitted=txlog_pb2.TxSubmitted(
                            tx_id=tx_id,
                            idempotency_key=key,
                            body_digest=digest,
                            body_bytes=len(encoded),
                            traceparent=traceparent,
                            service=SERVICE_NAME,
                            body=encoded,
                            membership=admin,
                            ts=stamp,
                            local_seq=local_seq,
                        ),
                    )
                )
                self._unfiled[tx_id] = encoded
                if key:
                    batch_keys[key] = tx_id
                    batch_digests[key] = digest
                results.append(Submitted(tx_id, True, TxState.INCOMING))
            staged = self._stage(entries, hand_over=True) if entries else None
        if staged is not None:
            await self._durable(staged)
        for repeated in in_flight.values():
            # A retry of a submit still on its way to disk is acknowledged no sooner
            # than the first try: a crash before that write would lose the transaction
            # both answers promised.
            await self._durable(repeated)
        return results

    def _stamp_clock_us(self, submits: int) -> int:
        """The wall clock (microseconds) if this call's submits are stamped at it
        (``step_rules.stamps_at_clock``: the DC is under load), else 0."""
        if stamps_at_clock(self.state, submits):
            work.count(work.STAMPS_AT_CLOCK)
            return self.config.stamp_clock_us()
        return 0

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

    async def submit(
        self, body: common_pb2.TxBody, idempotency_key: str = "", traceparent: str = ""
    ) -> Submitted:
        (result,) = await self.submit_many([(body, idempotency_key, traceparent)])
        if isinstance(result, Refusal):
            raise result
        return result

    def get(self, tx_id: str) -> TxRecord:
        """The transaction as the log holds it (``written_tx``)."""
        check_tx_id(tx_id)
        record = self.written_tx(tx_id)
        if record is None:
            verdict = self.truncated_verdicts.get(tx_id)
            if verdict is not None:
                raise Refusal(
                    Refused.NOT_FOUND,
                    f"no transaction {tx_id} at this DC any more: it was {verdict.state.name}, "
                    "and its history is truncated",
                )
            raise Refusal(Refused.NOT_FOUND, f"no transaction {tx_id} at this DC")
        return record

    def get_by_key(self, key: str) -> TxRecord:
        """The transaction submitted here with idempotency key ``key``, as written."""
        tx_id = self.state.idempotency.get(key)
        record = self.written_tx(tx_id) if tx_id is not None else None
        if record is None:
            raise Refusal(
                Refused.NOT_FOUND,
                f"no transaction submitted at this DC with idempotency key {key!r}",
            )
        return record

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

    async def wait(
        self, tx_id: str, state: TxState, timeout_s: float
    ) -> tuple[TxRecord | None, bool]:
        """Wait until the transaction's state is ``state`` or later (durably; TESTING, written
        only with the outcome, as soon as the dispatch reports it). A transaction this DC has not
        heard of yet (submitted at another DC) is waited for too; the record is None if it
        never showed up."""
        (answer,) = await self.wait_many([tx_id], state, timeout_s)
        return answer

    async def wait_many(
        self, tx_ids: Sequence[str], state: TxState, timeout_s: float, caller: str = ""
    ) -> list[tuple[TxRecord | None, bool]]:
        """``wait`` for each of ``tx_ids`` at once, in the order given: one timer and one
        future for the lot, not a task and a timeout each (a ``SubmitBatch`` of 50 that
        waits is one call here). Each counts toward ``WAITS_MAX``, and toward
        ``caller``'s share of it (``shares.py``)."""
        for tx_id in tx_ids:
            check_tx_id(tx_id)
        pending = [tx_id for tx_id in tx_ids if not self._has_reached(tx_id, state)]
        if not pending:  # all there already: no waiter, no timer
            return [(self.written_tx(tx_id), True) for tx_id in tx_ids]
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop)
        # A plain timer, not ``asyncio.timeout``: that costs a Timeout object, a
        # reschedule and two running-loop lookups (each a getpid syscall on 3.11) per
        # wait, a few percent of the store's CPU with many clients waiting.
        self.waits.take(caller, len(tx_ids))
        timer = loop.call_later(timeout_s, waiter.time_out)
        self._client_calls += 1
        try:
            while True:
                for tx_id in pending:
                    waiting_here = self._waiters.setdefault(tx_id, [])
                    if waiter not in waiting_here:  # still listed where nothing moved
                        waiting_here.append(waiter)
                await waiter.woken
                pending = [tx_id for tx_id in pending if not self._has_reached(tx_id, state)]
                if not pending or waiter.timed_out:
                    break
                waiter.woken = loop.create_future()
        finally:
            self.waits.give_back(caller, len(tx_ids))
            self._client_calls -= 1
            timer.cancel()
            for tx_id in pending:  # timed out or cancelled: maybe still listed
                listed = self._waiters.get(tx_id)
                if listed is not None and waiter in listed:
                    listed.remove(waiter)
                    if not listed:
                        del self._waiters[tx_id]
        unreached = set(pending)
        return [(self.written_tx(tx_id), tx_id not in unreached) for tx_id in tx_ids]

    def written_tx(self, tx_id: str) -> TxRecord | None:
        """The transaction as the log holds it: what a client reads (``Get``, ``List``,
        the record a wait answers with). Memory holds what is staged too, and a state
        read from a write still on disk is one a crash may take back (a synced position
        recomputed, an outcome run again). None: not even its first state is written."""
        record = self.state.tx(tx_id)
        return record if record is None else self._written(record)

    def _written(self, record: TxRecord) -> TxRecord | None:
        held = self._undurable.get(record.tx_id)
        return record if held is None else _as_written(record, held[1])

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

    def bodies_held_durably_len(self) -> int:
        """``StoreState.bodies_held_len`` as the disk holds it: up to the first synced
        position whose body, or whose ENQUEUED, is still on its way to the disk. The
        coordinator posts it, and the peers truncate up to it: answered from memory
        (which holds staged writes), a peer could delete the last copies of a body this
        DC then lost in a crash, and its workers would wait for it for ever."""
        held = self.state.bodies_held_len()
        txs = self.state.txs
        for tx_id, (_, written) in self._undurable.items():
            if written is not None and _reached(written, TxState.ENQUEUED):
                continue
            record = txs.get(tx_id)
            if record is not None and 0 < record.position <= held:
                held = record.position - 1
        return held

    def _has_reached(self, tx_id: str, state: TxState) -> bool:
        """Durably (or TESTING, which is never written alone): memory holds staged
        states, and a waiter answered from one a crash then takes back was lied to."""
        held = self._undurable.get(tx_id)
        if held is not None:  # that write's _announce_durable wakes the waiter
            return held[1] is not None and _reached(held[1], state)
        record = self.state.tx(tx_id)
        if record is not None:
            return record.state is not None and _reached(record.state, state)
        verdict = self.truncated_verdicts.get(tx_id)
        return verdict is not None and _reached(verdict.state, state)

    def list_page(
        self, state: TxState | None, page_size: int, after_seq: int
    ) -> tuple[list[TxRecord], int | None]:
        """A page of transactions (in the order learned) after ``after_seq``, as
        written (``written_tx``); the seq to go on after if more may follow.

        At most ``LIST_SCAN_MAX`` records are looked at per call: a page of a rare
        state among many transactions may come back short, or empty, with a token to
        go on from, rather than hold the event loop while it walks them all."""
        page: list[TxRecord] = []
        scanned = 0
        for stored in self.state.in_seq_order(after_seq):
            if scanned == LIST_SCAN_MAX:
                return page, stored.seq - 1
            scanned += 1
            record = self._written(stored)
            if record is None or (state is not None and record.state is not state):
                continue
            if len(page) == page_size:
                return page, page[-1].seq
            page.append(record)
        return page, None

    # --- internal API: the sync-coordinator -------------------------------------------

    async def load_protocol_state(self, local_admit_txs_max: int) -> ProtocolState:
        """Raise and persist the epoch (a new incarnation of the coordinator, whose core
        holds at most ``local_admit_txs_max`` own metas), and return the protocol's state
        as of that entry: everything in it is durable once the epoch is. (Read after the
        epoch's write instead, it could hold a submit stamped meanwhile and not yet
        durable, whose stamp the coordinator would post.) The entry settles the stamps
        the last incarnation may have posted and voids the rest (``state.py``).

        (A synced transaction whose body is recorded is ENQUEUED by that record itself,
        ``state.py``: a coordinator that dies before its core saw the body arrive strands
        nothing, and no repair is needed here, as one was when ENQUEUED was an entry the
        coordinator wrote: the nemesis run once found 14 such positions at one DC.)"""
        async with self._lock:
            epoch = self.state.epoch + 1
            started = txlog_pb2.EpochStarted(epoch=epoch, local_admit_txs_max=local_admit_txs_max)
            staged = self._stage([self._entry(epoch=started)])
            loaded = protocol_state(self.state)
        await self._durable(staged)
        return loaded

    async def persist_step(self, step: ProtocolStep) -> MergeBase:
        """Check one protocol step, apply it and answer once it is durable."""
        return await self.finish_step(await self.stage_step(step))

    async def stage_step(self, step: ProtocolStep) -> StagedStep:
        """Check a step and apply it (handed to the writer, not yet durable): steps staged
        one after another are checked against each other, in that order, which is what
        lets the coordinator send the next before the last is on disk."""
        if max(len(step.incoming), len(step.synced)) > PERSIST_METAS_MAX:
            raise invalid(f"at most {PERSIST_METAS_MAX} incoming and synced metas per step")
        if len(step.forgotten) > FORGOTTEN_METAS_MAX:
            raise invalid(f"at most {FORGOTTEN_METAS_MAX} forgotten metas per step")
        if len(step.changes) > STATE_CHANGES_MAX:
            raise invalid(f"at most {STATE_CHANGES_MAX} state changes per step")
        checked = self._checked_bodies(step.bodies)
        async with self._lock:
            # Checked in full before anything is applied: a refused step leaves no trace.
            entries = plan_step(self.state, step, _now_ms())
            node_id = self.state.node_id
            renewed = sum(1 for meta in step.incoming if meta.origin == node_id)
            if renewed:  # a local meta comes from the coordinator only stamped anew
                work.count(work.STAMPS_RENEWED, renewed)
            bodies = self._body_entries(checked)
            entries[:0] = bodies.entries
            staged = None
            if entries:
                staged = self._stage(entries, traced_whole=bodies.traced)
            return StagedStep(staged, entries, self.state.merge_base, bodies.traced)

    async def finish_step(self, step: StagedStep) -> MergeBase:
        """Wait until a staged step is durable; the merge base it left."""
        if step.staged is not None:
            await self._durable(step.staged)
        for tx_id in step.traced:
            trace_history(self.state, tx_id)
        return step.merge_base

    @staticmethod
    def _checked_bodies(bodies: Sequence[PeerBody]) -> list[_CheckedBody]:
        """A step's bodies, each checked (the first that fails its checks fails all)."""
        if len(bodies) > BODIES_PER_CALL_MAX:
            raise invalid(f"bodies: {len(bodies)} is over {BODIES_PER_CALL_MAX}")
        return [_CheckedBody(body, check_peer_body(*body[:3])) for body in bodies]

    def _body_entries(self, checked: Sequence[_CheckedBody]) -> BodyEntries:
        """Under the lock: the entries that store the bodies not held yet (each once);
        their bytes wait in ``_unfiled`` until a rotation files them."""
        planned = plan_bodies(
            self.state,
            [
                StoredBody(tx_id, encoded, digest, traceparent, body.HasField("membership"))
                for (tx_id, encoded, digest, traceparent), body in checked
            ],
            _now_ms(),
        )
        for entry in planned.entries:
            self._unfiled[entry.body_stored.tx_id] = entry.body_stored.body
        return planned

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

    def read_synced(self, from_len: int, count_max: int) -> tuple[MergeBase, list[TxMeta]]:
        if not 1 <= count_max <= READ_SYNCED_MAX:
            raise invalid(f"count_max: {count_max} is outside 1..{READ_SYNCED_MAX}")
        # A synced entry's append is in the log once ACCEPTED is (not only staged).
        return read_synced(
            self.state,
            from_len,
            count_max,
            lambda tx_id: self._has_reached(tx_id, TxState.ACCEPTED),
        )

    async def watch_local_submits(self) -> AsyncGenerator[list[LocalSubmit], None]:
        """Every local submit the protocol may not hold yet, each once, with its body, in
        batches of what one message takes (``LocalSubmitBatch``). First those waiting
        when the watch starts: the ones to stamp anew (``pending_local``), then the
        durable stamped ones no counter or epoch has settled, in order (a coordinator
        that holds one already refuses it as a repeat). Then new ones as they become
        durable (``_hand_durable_submits``), not found by rescanning at every write."""
        if len(self._local_watchers) >= LOCAL_WATCHERS_MAX:
            raise Refusal(
                Refused.OVERLOADED,
                f"at most {LOCAL_WATCHERS_MAX} local submit watches at once",
            )
        handed = LocalWatch()
        self._local_watchers.add(handed)
        try:
            staged = {entry.submitted.tx_id for _, entries in self._unhanded for entry in entries}
            stamped = [
                (tx_id, stamp, seq)
                for tx_id, (stamp, seq) in self.state.unsettled.items()
                if tx_id not in staged  # handed as they become durable
            ]
            pending = [*((tx_id, 0, 0) for tx_id in self.state.pending_local), *stamped]
            batch = LocalSubmitBatch()
            for tx_id, stamp, seq in pending:
                submit = await self._local_submit(tx_id, stamp, seq)
                if not batch.takes(submit):
                    yield batch.submits
                    batch = LocalSubmitBatch()
                batch.add(submit)
            if batch.submits:
                yield batch.submits
            already = {tx_id for tx_id, _, _ in pending}
            while True:
                new = []
                for submit in await handed.next_batch():
                    if submit.tx_id in already:
                        already.discard(submit.tx_id)  # submitted while the pending were read
                    else:
                        new.append(submit)
                if new:
                    yield new
        finally:
            self._local_watchers.discard(handed)

    async def _local_submit(self, tx_id: str, stamp: int, local_seq: int) -> LocalSubmit:
        record = self.state.txs[tx_id]
        held, _ = await self.read_bodies([tx_id])
        body = held[0][1] if held else b""
        return LocalSubmit(tx_id, body, record.body_digest, record.traceparent, stamp, local_seq)

    # --- internal API: worker-dispatch -------------------------------------------------

    async def change_membership(
        self, change: common_pb2.MembershipChange, *, adds: bool = False
    ) -> Submitted:
        """Submit a membership entry (admin API). One at a time: refused while an entry
        submitted here is not yet in the installed configuration. ``adds``: it adds the
        node, which is refused once this DC truncated its history
        (``step_rules.check_can_join``)."""
        check_membership(change)  # bad input first, whatever is pending
        # No truncation between the check and the entry: once taken, the entry itself
        # holds truncation back until it is applied (``retention.truncation_hold``).
        async with self._one_rotation:
            if adds:
                check_can_join(self.state, change.node_id)
            if pending := self.state.pending_local_membership():
                raise Refusal(
                    Refused.PRECONDITION,
                    f"membership change {pending} is not applied yet: one change at a "
                    "time (retry once the view that applies it is installed)",
                )
            body = common_pb2.TxBody(membership=change)
            (result,) = await self.submit_many([(body, "", "")], admin=True)
        if isinstance(result, Refusal):
            raise result
        return result

    async def follow_enqueued(
        self,
        from_position: int,
        *,
        membership_only: bool = False,
        finished_only: bool = False,
        from_first_unfinished: bool = False,
        gather_s: float = 0.0,
        skip_truncated: bool = False,
    ) -> AsyncGenerator[list[tuple[int, TxRecord]], None]:
        """Yield the synced positions from ``from_position`` on once each is ENQUEUED or
        later, as lists of every position ready by then, in order (at most
        ``FOLLOW_BATCH_MAX``). ``membership_only``: only the membership entries, still
        strictly in order; ``finished_only``: once OK or FAILED; ``from_first_unfinished``:
        from the first position not yet OK or FAILED if that comes earlier; ``gather_s``:
        wait that long after each batch smaller than ``FOLLOW_GATHER_BELOW``, so that a
        follower in no haste takes what became ready meanwhile as one batch (at low load a
        batch per transaction otherwise: a stream message, and a wakeup of the follower's
        process); ``skip_truncated``: where the history at the position was truncated
        (before the call or while it follows), go on at the first position still held."""
        if not 0 <= gather_s <= FOLLOW_GATHER_MS_MOST / 1000:
            raise invalid(f"gather_ms: at most {FOLLOW_GATHER_MS_MOST}")
        position = max(1, from_position)
        if from_first_unfinished:
            position = min(position, self.first_unfinished_position())
        wanted = TxState.OK if finished_only else TxState.ENQUEUED
        state_txs = self.state
        while True:
            txs = state_txs.txs
            changed = self._changed
            ready: list[tuple[int, TxRecord]] = []
            while len(ready) < FOLLOW_BATCH_MAX:
                meta = state_txs.synced_at(position - 1)
                if meta is None and position <= state_txs.synced_offset and skip_truncated:
                    position = state_txs.synced_offset + 1
                    continue
                if meta is None and position <= state_txs.synced_offset:
                    raise Refusal(Refused.TRUNCATED, f"position {position} was truncated")
                record = txs.get(meta.tx_id) if meta is not None else None
                state = self._written_state(record)
                if record is None or state is None or state < wanted:
                    break
                if record.membership or not membership_only:
                    ready.append((position, record))
                position += 1
            if ready:
                yield ready
                if gather_s and len(ready) < FOLLOW_GATHER_BELOW:
                    await asyncio.sleep(gather_s)
            else:
                await changed.wait()

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

    async def advance_states(self, changes: Sequence[StateChangeRequest], service: str) -> None:
        async with self._lock:
            plan = plan_verdicts(self.state, changes, service, _now_ms(), self._testing_unwritten)
            moved = keep_testing(self.state, plan, self._testing_unwritten)
            staged = self._stage(plan.written) if plan.written else None
        if moved:
            self._announce(moved)
        for change in changes:
            if change.state in FINAL_STATES:
                self.body_cache.discard(change.tx_id)  # read back no more (files serve)
        if staged is not None:
            await self._durable(staged)

    # --- progress, rotation and truncation ------------------------------------------

    def report_progress(
        self, peers: dict[str, int], workers_min: int | None, *, peers_reported: bool = False
    ) -> int:
        """Take a report: the coordinator's (``peers_reported``: every peer of the
        configuration, replacing the last report, so a removed peer holds nothing back)
        or the dispatch's (the lowest applied position among the DC's workers)."""
        progress = self.progress
        if peers_reported:
            progress.peer_synced_len = dict(peers)
            progress.peers_reported = True
        else:
            progress.peer_synced_len.update(peers)
        if workers_min is not None:
            progress.workers_min_position = workers_min
        below = self.truncatable_below()
        self._truncate_soon(below)
        return below

    def _truncate_soon(self, below_position: int) -> None:
        """Truncate in place once at least ``TRUNCATION_STEP`` positions more may go: a
        store that waited for its next rotation held everything its current file covers
        (about 50,000 small transactions at 16 MiB), so its memory followed the history
        until then (issue 47: RSS 1.55x between 28,669 and 347,212 transactions of
        history). Never while a rotation runs: it truncates too, and takes turns."""
        if (
            self._truncation is not None
            or self._rotating
            or self._one_rotation.locked()
            or self._closing.is_set()
            or below_position - 1 - self.state.synced_offset < TRUNCATION_STEP
        ):
            return
        self._truncation = asyncio.get_running_loop().create_task(self._truncate_in_background())

    async def _truncate_in_background(self) -> None:
        try:
            await self.truncate_in_place()
        except Exception:
            if not self._closing.is_set():
                log.exception("truncation in place failed; the next rotation truncates")
        finally:
            self._truncation = None

    def _remember_verdicts(self, dropped: Sequence[str]) -> None:
        """Keep the verdicts of transactions about to be truncated (``truncated_verdicts``)."""
        verdicts, txs = self.truncated_verdicts, self.state.txs
        for tx_id in dropped:
            record = txs.get(tx_id)
            if record is not None and record.state in FINAL_STATES:
                verdicts[tx_id] = Verdict.of(record.state, record.outcome)
        while len(verdicts) > TRUNCATED_VERDICTS_KEPT:
            verdicts.popitem(last=False)

    async def truncate_in_place(self) -> int:
        """Drop the history the reports allow from memory, by a ``truncated`` entry in
        the current file (replayed at start-up), without a rotation: the file's bytes go
        at the next rotation, as before. Returns the transactions dropped."""
        async with self._one_rotation:
            async with self._lock:
                dropped = self.state.truncation_cut(self.truncatable_below())
                if not dropped:
                    return 0
                self._remember_verdicts(dropped)
                staged = self._stage([self._entry(truncated=self.state.truncated_entry(dropped))])
                # A body out of the current file's entries was filed by an earlier rotation.
                with_files = [tx_id for tx_id in dropped if self._unfiled.pop(tx_id, None) is None]
                for tx_id in dropped:
                    self.body_cache.discard(tx_id)
            await self._durable(staged)
            if with_files:
                await work.in_thread(self._delete_bodies, with_files)
        self.progress.truncated_total += len(dropped)
        self.progress.truncated_in_place += len(dropped)
        return len(dropped)

    def truncatable_below(self) -> int:
        """Synced positions below this one may be truncated (0: none)."""
        return self.truncation_hold().below

    def truncation_hold(self) -> TruncationHold:
        """How far truncation may go now, and what holds it (``retention``)."""
        config = self.config
        return truncation_hold(
            self.state,
            self.progress,
            witness=config.witness,
            history_kept=config.history_kept,
            history_kept_ms=config.history_kept_ms,
            first_unfinished=self.first_unfinished_position(),
            now_ms=_now_ms(),
        )

    async def truncate(self, below_position: int = 0) -> tuple[int, list[str]]:
        """Rotate the log, dropping synced history below ``below_position`` (0: as far as
        allowed). Returns the number of transactions dropped and the bak- files made."""
        allowed = self.truncatable_below()
        if below_position == 0:
            below_position = allowed
        elif below_position > allowed:
            raise Refusal(
                Refused.PRECONDITION,
                f"cannot truncate below {below_position}: peers and workers have only passed "
                f"position {max(allowed - 1, 0)}",
            )
        return await self._rotate(below_position)

    async def _rotate(self, below_position: int) -> tuple[int, list[str]]:
        async with self._one_rotation:
            return await self._rotate_alone(below_position)

    async def _rotate_alone(self, below_position: int) -> tuple[int, list[str]]:
        # The snapshot carries no bodies, so the bodies of the transactions it keeps
        # must be in durable files before the current log is retired: most of them
        # filed outside the lock (those that look kept now), the rest inside it.
        # After a long partition that is every body since the last rotation (tens of
        # seconds of file creation and fsyncs): a shutdown must not wait for that.
        #
        # Most kept bodies are not filed at all: up to ``_carry_budget`` bytes of them
        # are carried into the new file, after its snapshot, in a few large sequential
        # writes and one fsync. Filing cost a file create and fsync each, and a rotation
        # that kept the bodies the workers had not reached yet (a few thousand under a
        # burst) held the lock for seconds: long enough for the peers to exclude the DC.
        started = time.monotonic()
        budget = self._carry_budget()
        # Filing outside the lock goes again over what was staged while it filed, so
        # that little is left to file under the lock (bench.rotation_stall: 3,232
        # bodies filed there held every submit 4.3 s), as long as each pass has at
        # most half the last one's to file. Submits that outrun the filing (a storm of
        # batches) would make every pass longer than the last: what the first pass
        # leaves is filed under the lock, holding them back.
        early: list[tuple[str, bytes]] = []
        filed_early: set[str] = set()
        last_pass: int | None = None
        for _ in range(EARLY_FILING_PASSES):
            kept = [b for b in self._unfiled_kept(below_position) if b[0] not in filed_early]
            carry_now, to_file = split_by_budget(kept, budget)
            if last_pass is not None and (
                len(to_file) <= FILED_UNDER_THE_LOCK_MOST or len(to_file) > last_pass // 2
            ):
                break  # the first pass always files (a shutdown can stop it there)
            if not await work.in_thread(self.bodies.file_many, to_file, self._closing.is_set):
                raise Refusal(Refused.UNAVAILABLE, "the store is shutting down")
            early += to_file
            filed_early.update(tx_id for tx_id, _ in to_file)
            last_pass = len(to_file)
        # What the rotation will write is built in a thread before it takes the lock:
        # the snapshot form of the records it keeps (rebuilt under the lock only if
        # they changed meanwhile) and the entries of the bodies it carries (16,000 of
        # each: 0.4 s of an idle core).
        built = await work.in_thread(
            self.state.prepare_snapshot, self.state.unsaved_kept(below_position)
        )
        StoreState.keep_prepared(built)
        described = [self._carried_fields(tx_id, encoded) for tx_id, encoded in carry_now]
        prepared = await work.in_thread(carried_entries, described, _now_ms())
        # The lock is taken twice, briefly: to take the snapshot (the state as the
        # current file holds it up to its end), and, once the new file is written and
        # synced outside it, to copy on what was appended meanwhile and switch files.
        # Holding it across the write stalled every submit for the new file's fsync
        # (issue 47: submit p99 1.7-1.8x the steady p99 in the windows with a rotation).
        async with self._lock:
            locked = time.monotonic()
            await self._writer.flush()
            snapshot, dropped = self.state.snapshot(below_position)
            gone = set(dropped)
            filed = {tx_id for tx_id, _ in early}
            kept_unfiled = [
                (tx_id, encoded)
                for tx_id, encoded in self._unfiled.items()
                if tx_id not in gone and tx_id not in filed
            ]
            carried, late = split_by_budget(kept_unfiled, budget)
            # Staged since the early filing: few, unless submits outrun the filing (a
            # storm of batches); then filed here, holding the submits back, or the
            # filing outside the lock would never catch up with them.
            await work.in_thread(self.bodies.file_many, late)
            entries = [
                prepared.get(tx_id)
                or carried_entries([self._carried_fields(tx_id, encoded)], _now_ms())[tx_id]
                for tx_id, encoded in carried
            ]
            self._remember_verdicts(dropped)
            self.state.drop_truncated(snapshot, dropped)
            in_old_file = set(self._unfiled)
            covered = (self.files.current, self.files.current_bytes)
            snapshot_locked_s = time.monotonic() - locked
        try:
            rotation = await work.in_thread(
                self.files.prepare_rotation, snapshot, covered, _now_ms(), entries
            )
        except BaseException:
            # Nothing changed for recovery (a .tmp file is never read): the current
            # file still holds the dropped transactions, and the next rotation, or the
            # first after a restart, truncates them.
            log.warning(
                "txlog rotation abandoned before its commit",
                extra=log_event("txlog.rotation_abandoned"),
            )
            raise
        async with self._lock:
            locked = time.monotonic()
            try:
                await self._writer.flush()
                backups = await work.in_thread(self.files.commit_rotation, rotation)
            except BaseException:
                self.files.discard_rotation(rotation)
                raise
            # Bodies staged since the snapshot are in the copied tail: still unfiled.
            appended = {t: e for t, e in self._unfiled.items() if t not in in_old_file}
            unfiled, self._unfiled = self._unfiled, {**dict(carried), **appended}
            commit_locked_s = time.monotonic() - locked
        for tx_id, encoded in (*early, *late):
            record = self.state.txs.get(tx_id)
            if record is not None and record.state not in FINAL_STATES:
                self.body_cache.put(tx_id, encoded)  # likely read again
        # A dropped transaction has a file if an earlier rotation kept it, or if this
        # one filed it early; the others never had one.
        with_files = [tx_id for tx_id in dropped if tx_id not in unfiled or tx_id in filed]
        if with_files:
            await work.in_thread(self._delete_bodies, with_files)
        deleted = await work.in_thread(self.files.delete_backups, self.config.backups_kept)
        self.progress.truncated_total += len(dropped)
        self.progress.last_rotation_ms = _now_ms()
        log.info(
            "txlog rotated in %.0f ms (lock held %.0f ms: %.0f for the snapshot, %.0f for "
            "the commit): %d transactions truncated, %d kept, %d bodies carried, %d filed, "
            "%s (%d old bak- deleted)",
            (time.monotonic() - started) * 1000,
            (snapshot_locked_s + commit_locked_s) * 1000,
            snapshot_locked_s * 1000,
            commit_locked_s * 1000,
            len(dropped),
            len(self.state.txs),
            len(carried),
            len(early) + len(late),
            backups,
            len(deleted),
            extra=log_event("txlog.rotated", truncated=len(dropped), kept=len(self.state.txs)),
        )
        return len(dropped), backups

    def _carry_budget(self) -> int:
        """Bytes of kept bodies a rotation carries into the new file; past it they are
        filed (once: a filed body stays filed). Half a file: a long partition's bodies
        are not rewritten at every rotation."""
        return self.config.log_file_bytes_max // 2

    def _carried_fields(self, tx_id: str, encoded: bytes) -> Carried:
        """What a carried body's entry holds, read on the loop (the record may change)."""
        record = self.state.txs[tx_id]
        return Carried(tx_id, encoded, record.body_digest, record.membership, record.traceparent)

    def _unfiled_kept(self, below_position: int) -> list[tuple[str, bytes]]:
        """The unfiled bodies a rotation below ``below_position`` would keep, as far as
        can be told outside the lock (the synced queue may grow meanwhile)."""
        txs = self.state.txs
        kept: list[tuple[str, bytes]] = []
        for tx_id, encoded in self._unfiled.items():
            record = txs.get(tx_id)
            if record is None or not 0 < record.position < below_position:
                kept.append((tx_id, encoded))
        return kept

    async def _rotate_in_background(self) -> None:
        try:
            await self._rotate(self.truncatable_below())
        except Exception:
            if self._closing.is_set():
                log.info(
                    "txlog rotation abandoned: shutting down",
                    extra=log_event("txlog.rotation_abandoned"),
                )
            else:
                log.exception(
                    "txlog rotation failed; the current file keeps growing",
                    extra=log_event("txlog.rotation_abandoned"),
                )
        finally:
            self._rotating = False


TRUNCATED_VERDICTS_KEPT = 16_384
"""Truncated transactions whose verdict a wait still finds: about 4 MB, flat (the
records themselves took about 3 KB each). Tens of seconds at the highest rates, on top
of ``--history-kept-ms``: a client waiting on a batch's submits one after another took
longer than that to reach the last ones (the soak's loaders timed out)."""
TRUNCATION_STEP = 256
"""Positions that may go beyond what is truncated before the store truncates in place:
one small entry per step (at most one per progress report, each second)."""
EARLY_FILING_PASSES = 4
"""Passes of a rotation's body filing outside the store's lock (``_rotate_alone``)."""
FILED_UNDER_THE_LOCK_MOST = 64
"""Bodies left to file after the first pass that end the passes: few enough to file
under the lock."""


def _as_written(record: TxRecord, written: TxState | None) -> TxRecord | None:
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


def _reached(current: TxState, wanted: TxState) -> bool:
    if wanted in FINAL_STATES:
        return current in FINAL_STATES
    return current >= wanted
