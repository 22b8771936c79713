"""Feeding a DC's synced transactions to its workers (PROTOCOL.md §4.7).

One **pipeline** at a time, over the workers that are healthy and in sync: one of them is
the **testing worker** (it keeps the role while fit; otherwise the first in configured
order takes it). Transactions stream from the store's
``FollowEnqueued`` in synced order; each goes to the testing worker first (the store
records TESTING), its outcome becomes the DC's (OK or FAILED, recorded in the store, both
by ``state_records``), and
then every other worker applies it, running it on OK and recording it unrun on FAILED.
Every worker answers with its running state digest; one that differs from the testing
worker's is **out of sync**: it gets no more work, and the admin status and the log say
so, naming the position.

Nothing waits on a round trip: each worker has one streamed ``Apply`` call with up to
``WINDOW`` transactions in flight, and the testing worker runs ahead of the others by up
to a window. Heartbeats (every second) notice a dead or stuck worker within
``DEAD_AFTER_S``; any change in the healthy set restarts the pipeline from the lowest
position among the workers it keeps, so the testing role moves to the next healthy worker.
Restarting is safe because workers apply exactly once: a position a worker already has is
answered from its record, and a finished transaction is only re-sent to workers behind it.
A pipeline starts at the lowest position among its workers, or earlier at the first one
the store has not recorded as finished: a dispatch (or store) killed between a worker's
apply and the store's record left such positions TESTING, and the testing worker answers
them again from its record, so every transaction reaches OK or FAILED after any crash.

The decisions are pure, with script tests, and this module applies them: health (dead,
stuck, draining, back) by ``health.judge``, and what each pipeline sends, records and
calls out of sync by ``pipeline.PipelineMachine``, which the simulator runs too. A worker
is **stuck** when its oldest request in flight has had no answer for ``stuck_after_s``
(the clock starts when work reaches an idle worker, not at its last outcome: an idle
worker's first request must not count its idle time). A stuck worker is taken out, and
tried again (its stream re-opened, fed from its own position) once it moves past where
it stuck or after a backoff that doubles up to ``STUCK_RETRY_MAX_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from txsync.protocol import TxState
from txsync.rpc import new_channel
from txsync.settings import FEED_GATHER_MS_DEFAULT, PROGRESS_REPORT_S
from txsync.telemetry import Gauge, Metrics
from txsync.telemetry.lag_clock import LagClock
from txsync.telemetry.logs import event as log_event
from txsync.v1 import (
    common_pb2,
    store_pb2,
    store_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from txsync.worker.backend import APPLY_BATCH_MAX
from txsync.worker_dispatch.health import (
    DEAD_AFTER_S,
    Beat,
    Event,
    Health,
    Pipeline,
    RestartLoop,
    Storage,
    StorageWarnings,
    choose_testing_worker,
    judge,
    snapshot_needed,
)
from txsync.worker_dispatch.pipeline import (
    Answer,
    Entry,
    OutOfSync,
    Output,
    PipelineError,
    PipelineMachine,
    Record,
    Send,
)
from txsync.worker_dispatch.state_records import StateRecords

log = logging.getLogger(__name__)

WINDOW = 256
"""Transactions in flight per worker."""
HEARTBEAT_S = 1.0
RECOVERY_CHECK_S = 1.0
RECOVERY_TIMEOUT_S = 600.0
"""A whole snapshot copy (export and import) must finish within this."""
PROGRESS_REPORT_TIMEOUT_S = 30.0
"""A progress report the store has not answered by then is dropped (the next follows
PROGRESS_REPORT_S later): a store busy rotating its log answers late, not never."""
STORE_RETRY_MAX_S = 2.0
"""The longest pause between two attempts to feed from a store that is unreachable."""
_Queues = dict[str, asyncio.Queue[worker_pb2.ApplyRequest]]
_Machine = PipelineMachine[worker_pb2.ApplyRequest]


@dataclass(slots=True)
class DcCopyImport:
    """Another DC's copy on its way into a worker here (``dc_copies``)."""

    worker_id: str
    started_s: float
    bytes_done: int = 0
    bytes_total: int = 0


@dataclass(eq=False)
class WorkerLink:
    worker_id: str
    address: str
    channel: grpc.aio.Channel
    stub: worker_pb2_grpc.WorkerServiceAsyncStub
    position: int = 0
    state_digest: bytes = b""
    healthy: bool = False
    out_of_sync: str = ""
    """Why this worker diverged (empty: in sync)."""
    needs_snapshot: str = ""
    """Why this worker is to be brought up from a snapshot rather than the log (a new
    worker far behind); it gets no work until then."""
    last_heartbeat_s: float = 0.0
    progressed_s: float = 0.0
    """When its last outcome arrived (monotonic), to tell a stuck worker from a busy one."""
    stuck_at: int | None = None
    """The position a stuck worker was taken out at: it is back once it moves past it,
    or at ``stuck_retry_at``."""
    stuck_retry_at: float = 0.0
    stuck_backoff_s: float = 0.0
    """How long it waited last time it was stuck (doubles while it stays stuck)."""
    recovery_progress: float = 0.0
    """0..1 while a snapshot is copied to it."""
    dc_copy: str = ""
    """Set while another DC's copy is imported into it, and after, until the store has
    adopted the copy's base (``dc_copies``): it gets no work meanwhile."""
    batched: bool = True
    """It serves ``ApplyBatches`` (False: a worker of an earlier version, ``Apply``)."""

    recoveries: int = 0
    storage: Storage | None = None
    """Its database and disk, from its last heartbeat."""

    @property
    def fed(self) -> bool:
        """The pipeline feeds it: healthy, in sync, and not waiting for a copy."""
        return (
            self.healthy and not self.out_of_sync and not self.needs_snapshot and not self.dc_copy
        )


def _stopping() -> bool:
    """Whether this task itself is being cancelled (the dispatch stops), rather than a
    gRPC call of it ended with CancelledError because ``drain`` closed the worker's
    channel under the call. Only the first may end a task the dispatch lives by."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class _Restart(Exception):
    """The healthy set changed or a worker failed: build the pipeline anew."""


WORKERS_MAX = 64
"""Workers one dispatch feeds (each adds a stream and a heartbeat per second)."""


class TooManyWorkers(Exception):
    pass


class Dispatch:
    def __init__(
        self,
        store_address: str,
        workers: dict[str, str],
        *,
        stuck_after_s: float = 10.0,
        feed_gather_ms: int = FEED_GATHER_MS_DEFAULT,
        storage_warnings: StorageWarnings | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.storage_warnings = storage_warnings or StorageWarnings()
        self.stuck_after_s = stuck_after_s
        """A worker with work in flight and no outcome for this long is taken out."""
        self.feed_gather_ms = feed_gather_ms
        """The feed's pause between the store's messages (``FEED_GATHER_MS_DEFAULT``)."""
        self._store_channel = new_channel(store_address, as_service=True)
        self.store = store_pb2_grpc.StoreInternalServiceStub(self._store_channel)
        self.workers: dict[str, WorkerLink] = {}
        for worker_id, address in workers.items():
            self._link(worker_id, address)
        self.tester: str | None = None
        self.exports = asyncio.Lock()
        """Held while a worker's snapshot is exported: a worker keeps one export at a
        time (recoveries within the DC, and copies for other DCs, take turns)."""
        self.dc_import: DcCopyImport | None = None
        """Another DC's copy being imported here (``dc_copies``)."""
        self.finished = {"ok": 0, "failed": 0}
        """Transactions this DC finished, by outcome (since this process started)."""
        if metrics is not None:
            metrics.observed_counter(
                "txsync.transactions.finished",
                "transactions this DC finished, by outcome (rate: applied per second)",
                lambda: self.finished,
                label="outcome",
            )
            metrics.gauges(self._gauges())
            metrics.labelled_gauge(
                "txsync.worker.lag",
                "seconds since the store's feed first had a position this worker has not "
                "applied yet (0: none), per healthy worker",
                self._worker_lags, label="worker", unit="s",
            )  # fmt: skip
        self._changed = asyncio.Event()
        self._first_beats = asyncio.Event()
        """Set once every worker was asked once: the testing role is chosen among all."""
        self.states = StateRecords(self.store, on_dropped=self._changed.set)
        self.restarts = RestartLoop()
        self._store_answered = False
        """The current pipeline's feed has had an answer from the store (``run``)."""
        self._machine: _Machine | None = None
        """The running pipeline's decisions."""
        self.history_from = 0
        """The first synced position the store still holds (0: not known yet); a worker
        behind it cannot replay the log (``report_progress``)."""
        self.feed_clock = LagClock()
        """When each position first came from the store's feed (``txsync_worker_lag``)."""

    def _gauges(self) -> list[Gauge]:
        def healthy() -> float:
            return sum(1 for w in self.workers.values() if w.healthy and not w.out_of_sync)

        def lowest_position() -> float | None:
            positions = [w.position for w in self.workers.values() if w.healthy]
            return min(positions) if positions else None

        return [
            Gauge("txsync.workers.known", "workers known to dispatch", lambda: len(self.workers)),
            Gauge("txsync.workers.healthy", "workers healthy and in sync", healthy),
            Gauge(
                "txsync.workers.position.min",
                "applied position of the furthest-behind healthy worker",
                lowest_position,
            ),
        ]

    def _worker_lags(self) -> dict[str, float]:
        now = time.monotonic()
        healthy = [w for w in self.workers.values() if w.healthy]
        if healthy:
            self.feed_clock.forget_up_to(min(w.position for w in healthy))
        return {w.worker_id: self.feed_clock.seconds_behind(w.position, now) for w in healthy}

    def _link(self, worker_id: str, address: str) -> WorkerLink:
        channel = new_channel(address, as_service=True)
        link = WorkerLink(worker_id, address, channel, worker_pb2_grpc.WorkerServiceStub(channel))
        self.workers[worker_id] = link
        return link

    async def register(self, worker_id: str, address: str) -> None:
        """A worker that started (``kubectl scale`` up, or by hand) joins: it is fed from
        its own position once its first heartbeat answers (from the log; snapshot copy
        for workers far behind comes with recovery)."""
        known = self.workers.get(worker_id)
        if known is not None and known.address == address:
            return
        if known is None and len(self.workers) >= WORKERS_MAX:
            raise TooManyWorkers(f"at most {WORKERS_MAX} workers per dispatch")
        if known is not None:
            await self.drain(worker_id)
        self._link(worker_id, address)
        log.info("worker %s registered at %s", worker_id, address)

    async def drain(self, worker_id: str) -> bool:
        """Stop feeding a worker (it is stopping); false if unknown."""
        link = self.workers.pop(worker_id, None)
        if link is None:
            return False
        log.info("worker %s drained at position %d", worker_id, link.position)
        self._changed.set()
        await link.channel.close()
        return True

    async def close(self) -> None:
        for link in self.workers.values():
            await link.channel.close()
        await self._store_channel.close()

    # --- health -----------------------------------------------------------------------

    async def watch_heartbeats(self) -> None:
        while True:
            links = list(self.workers.values())  # registrations may change the dict meanwhile
            await asyncio.gather(*(self._beat(link) for link in links))
            self._first_beats.set()
            await asyncio.sleep(HEARTBEAT_S)

    async def _beat(self, link: WorkerLink) -> None:
        """Ask one worker's heartbeat and apply the health judgement (``health.judge``)."""
        try:
            answer = await link.stub.Heartbeat(worker_pb2.HeartbeatRequest(), timeout=HEARTBEAT_S)
        except grpc.aio.AioRpcError:
            answer = None
        except asyncio.CancelledError:
            # A worker drained during its heartbeat ends this beat, not the heartbeats of
            # every worker (it stopped the dispatch: found by CI).
            if _stopping() or self.workers.get(link.worker_id) is link:
                raise
            return
        before = Health(
            link.healthy, link.last_heartbeat_s, link.stuck_at, link.stuck_retry_at,
            link.stuck_backoff_s,
        )  # fmt: skip
        if answer is not None and answer.database_bytes:
            link.storage = Storage(
                answer.database_bytes, answer.disk_free_bytes, answer.disk_total_bytes
            )
        beat = None if answer is None else Beat(answer.position, answer.draining)
        pipeline = Pipeline(self._in_flight(link), link.progressed_s)
        after, events = judge(before, beat, time.monotonic(), pipeline, self.stuck_after_s)
        link.healthy, link.last_heartbeat_s = after.healthy, after.last_heartbeat_s
        link.stuck_at, link.stuck_retry_at = after.stuck_at, after.stuck_retry_at
        link.stuck_backoff_s = after.stuck_backoff_s
        for event in events:
            self._health_changed(link, event, before, answer)

    def _health_changed(
        self,
        link: WorkerLink,
        event: Event,
        before: Health,
        answer: worker_pb2.HeartbeatResponse | None,
    ) -> None:
        """Say what ``judge`` decided, and act on it (a worker back: its position; a
        worker joining far behind the testing worker: a snapshot first)."""
        if event is Event.RETRIED:
            assert answer is not None
            log.warning(
                "worker %s still at position %d after %.0f s: feeding it again",
                link.worker_id,
                answer.position,
                before.stuck_backoff_s,
            )
            return
        if event is Event.DEAD:
            log.warning(
                "worker %s missed heartbeats for %.0f s: out", link.worker_id, DEAD_AFTER_S,
                extra=log_event("worker.dead", worker=link.worker_id),
            )  # fmt: skip
        elif event is Event.STUCK:
            log.warning(
                "worker %s is stuck: no outcome for %.0f s with %d in flight: out "
                "(tried again in %.0f s, or once it moves)",
                link.worker_id,
                link.last_heartbeat_s - link.progressed_s,
                self._in_flight(link),
                link.stuck_backoff_s,
                extra=log_event("worker.stuck", worker=link.worker_id),
            )
        elif event is Event.DRAINING:
            log.info("worker %s is draining: out", link.worker_id)
        elif event is Event.BACK:
            assert answer is not None
            link.position, link.state_digest = answer.position, answer.state_digest
            log.info(
                "worker %s healthy at position %d", link.worker_id, answer.position,
                extra=log_event("worker.healthy", worker=link.worker_id, position=answer.position),
            )  # fmt: skip
            # Judged again from the position it reports now: a reason found while it was
            # away (or before it was heard from) may no longer hold.
            tester = self.workers.get(self.tester or "")
            far_behind = ""
            if tester is not None and tester is not link and tester.healthy:
                far_behind = snapshot_needed(tester.position, link.position)
            link.needs_snapshot = far_behind
            if far_behind:
                log.warning(
                    "worker %s needs a snapshot: %s", link.worker_id, far_behind,
                    extra=log_event("worker.needs_snapshot", worker=link.worker_id),
                )  # fmt: skip
            self._mark_behind_history(link)
        self._changed.set()

    # --- progress and the store's history ---------------------------------------------

    async def report_progress(self) -> None:
        """Tell the store the lowest position among the workers the pipeline feeds, so
        that it truncates what they (and the peer DCs) passed; learn in turn where its
        history starts. A worker that is down or out of sync holds nothing back: it
        comes back through a snapshot if the history it needs is gone."""
        while True:
            fed = [w.position for w in self.workers.values() if w.fed]
            request = store_pb2.ReportProgressRequest()
            if fed:
                request.workers_min_position = min(fed)
            try:
                answer = await self.store.ReportProgress(request, timeout=PROGRESS_REPORT_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                log.info("progress report to the store failed: %s", error.code().name)
            else:
                self.history_from = answer.history_from
                self._copies_adopted()
                # Only workers heard from: the position of one not yet heard from (at
                # start, or after it died) is not known, and a worker judged from a stale
                # 0 would wait for a snapshot it does not need.
                heard = [w for w in self.workers.values() if w.healthy]
                if any([self._mark_behind_history(w) for w in heard]):
                    self._changed.set()
            await asyncio.sleep(PROGRESS_REPORT_S)

    def _copies_adopted(self) -> None:
        """A worker that holds another DC's copy is fed again once the store's history
        starts at the copy's position (the store adopted it: ``dc_copies``)."""
        for link in self.workers.values():
            if link.dc_copy and link.position and self.history_from >= link.position:
                log.warning(
                    "worker %s: the store adopted the copy it holds at position %d",
                    link.worker_id, link.position,
                )  # fmt: skip
                link.dc_copy = ""
                self._changed.set()

    def _mark_behind_history(self, link: WorkerLink) -> bool:
        """A worker whose next position the store truncated needs a snapshot (true if
        it was marked just now)."""
        if link.needs_snapshot or link.position + 1 >= self.history_from:
            return False
        link.needs_snapshot = (
            f"at position {link.position}, and the txlog holds only positions from "
            f"{self.history_from} on"
        )
        log.warning(
            "worker %s needs a snapshot: %s", link.worker_id, link.needs_snapshot,
            extra=log_event("worker.needs_snapshot", worker=link.worker_id),
        )  # fmt: skip
        return True

    # --- the pipeline -----------------------------------------------------------------

    async def run(self) -> None:
        flusher = asyncio.get_running_loop().create_task(self.states.run())
        await self._first_beats.wait()
        store_retries = 0
        try:
            while True:
                if self._store_answered:
                    store_retries = 0
                self._store_answered = False
                ready = [w for w in self.workers.values() if w.fed]
                self._changed.clear()
                if not ready:
                    self.tester = None
                    await self._changed.wait()
                    continue
                # The testing worker keeps its role while it is fit: a worker coming back
                # is behind, and the DC's progress would wait for it to catch up.
                chosen = choose_testing_worker([w.worker_id for w in ready], self.tester)
                tester = next(w for w in ready if w.worker_id == chosen)
                if self.tester != tester.worker_id:
                    log.warning(
                        "testing worker: %s", tester.worker_id,
                        extra=log_event("worker.testing", worker=tester.worker_id),
                    )  # fmt: skip
                self.tester = tester.worker_id
                try:
                    await self._pipeline(tester, [w for w in ready if w is not tester])
                except _Restart as why:
                    log.info("pipeline restarts: %s", why)
                    self._restarted(str(why))
                except grpc.aio.AioRpcError as error:
                    if error.code() == grpc.StatusCode.UNAVAILABLE and not self._store_answered:
                        # The store is down or restarting: tried again after a pause
                        # that grows, and not counted as a pipeline that loops (20 quick
                        # retries while a store restarted kept the DC unhealthy for 60 s
                        # after it was back).
                        pause = min(STORE_RETRY_MAX_S, 0.2 * 2 ** min(store_retries, 8))
                        store_retries += 1
                        log.warning("store unreachable (%s): feeding again in %.1f s",
                                    error.details(), pause)  # fmt: skip
                        await asyncio.sleep(pause)
                        continue
                    log.warning("pipeline restarts: %s %s", error.code().name, error.details())
                    self._restarted(f"{error.code().name} {error.details()}")
                    await asyncio.sleep(0.2)
                except asyncio.CancelledError:
                    if _stopping():
                        raise
                    log.info("pipeline restarts: a drained worker's stream was closed")
                    self._restarted("a drained worker's stream was closed")
                    await asyncio.sleep(0.2)
                except Exception as error:
                    # A bug must not stop the DC applying: log it whole and start over.
                    log.exception("pipeline failed; restarting")
                    self._restarted(f"{type(error).__name__}: {error}")
                    await asyncio.sleep(1)
        finally:
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher

    def changed(self) -> None:
        """The workers' fitness changed: the pipeline restarts over those fit now."""
        self._changed.set()

    def feeds(self, worker_id: str) -> bool:
        """Whether the running pipeline feeds ``worker_id``."""
        machine = self._machine
        return machine is not None and worker_id in machine.positions

    def _restarted(self, why: str) -> None:
        self.restarts.record(time.monotonic(), why)

    def alarms(self) -> list[str]:
        """What is wrong with the pipeline as a whole (``ListWorkers``; the DC's status
        turns unhealthy)."""
        alarm = self.restarts.alarm(time.monotonic())
        return [alarm] if alarm else []

    def warnings(self) -> list[str]:
        """What will stop a worker unless an operator acts (``ListWorkers``; the DC stays
        healthy)."""
        copies = [
            f"worker {link.worker_id}: {link.dc_copy} (docs/dc-snapshots.md)"
            for link in self.workers.values()
            if link.dc_copy
        ]
        return copies + [
            warning
            for link in self.workers.values()
            if link.storage is not None
            for warning in self.storage_warnings.of(link.worker_id, link.storage)
        ]

    def _in_flight(self, link: WorkerLink) -> int:
        machine = self._machine
        if machine is None or link.worker_id not in machine.positions:
            return 0
        return machine.in_flight(link.worker_id)

    async def _pipeline(self, tester: WorkerLink, followers: list[WorkerLink]) -> None:
        workers = (tester, *followers)
        machine = self._machine = PipelineMachine[worker_pb2.ApplyRequest](
            tester.worker_id,
            [f.worker_id for f in followers],
            {w.worker_id: w.position for w in workers},
        )
        log.info(
            "pipeline from position %d (or the first unfinished): testing %s, then %s",
            machine.start,
            tester.worker_id,
            ", ".join(f.worker_id for f in followers) or "no other worker",
        )
        for worker in workers:
            worker.progressed_s = time.monotonic()
        queues = {w.worker_id: asyncio.Queue[worker_pb2.ApplyRequest](WINDOW) for w in workers}
        tasks = [
            asyncio.create_task(self._feed(machine, queues)),
            *(asyncio.create_task(self._stream(w, machine, queues)) for w in workers),
            asyncio.create_task(self._changed.wait()),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                error = task.exception()
                if error is not None:
                    raise error
            raise _Restart("the set of healthy workers changed")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._machine = None

    async def _feed(self, machine: _Machine, queues: _Queues) -> None:
        request = store_pb2.FollowEnqueuedRequest(
            from_position=machine.start,
            from_first_unfinished=True,
            gather_ms=self.feed_gather_ms,
        )
        async for ready in self.store.FollowEnqueued(request):
            self._store_answered = True
            for tx in ready.txs:
                apply = worker_pb2.ApplyRequest(
                    position=tx.position,
                    tx_id=tx.meta.tx_id,
                    body=tx.body,  # encoded: only the worker decodes it
                    traceparent=tx.traceparent,
                )
                decided = Entry(
                    tx.position, tx.meta.tx_id, TxState(tx.state), tx.outcome.state_digest, apply
                )
                await self._carry_out(machine.entry(decided), queues, None)
            if ready.txs:
                self.feed_clock.reached(ready.txs[-1].position, time.monotonic())

    async def _carry_out(
        self,
        outputs: list[Output[worker_pb2.ApplyRequest]],
        queues: _Queues,
        outcome: common_pb2.Outcome | None,
    ) -> None:
        """Apply the machine's outputs in order (``outcome``: the answer they follow)."""
        machine = self._machine
        assert machine is not None
        # A request with skip set is copied once per position, for all its followers.
        skipped: dict[int, worker_pb2.ApplyRequest] = {}
        for output in outputs:
            match output:
                case Send(worker=worker_id, skip=skip, payload=request):
                    if skip != request.skip:
                        copy = skipped.get(request.position)
                        if copy is None:
                            copy = skipped[request.position] = worker_pb2.ApplyRequest(
                                position=request.position,
                                tx_id=request.tx_id,
                                body=request.body,
                                traceparent=request.traceparent,
                                skip=skip,
                            )
                        request = copy
                    if machine.in_flight(worker_id) == 1:
                        # Idle until now: its wait for an outcome starts here.
                        self.workers[worker_id].progressed_s = time.monotonic()
                    await queues[worker_id].put(request)
                case Record(tx_id=tx_id, state=state, decided_by=decided_by):
                    self.states.record(tx_id, common_pb2.TxState.ValueType(state.value),
                                 outcome if decided_by is not None else None)  # fmt: skip
                    if decided_by is not None:
                        self.finished["ok" if decided_by.ok else "failed"] += 1
                case OutOfSync(worker=worker_id, reason=reason):
                    self.workers[worker_id].out_of_sync = reason
                    log.error(
                        "OUT OF SYNC: worker %s: %s", worker_id, reason,
                        extra=log_event("worker.out_of_sync", worker=worker_id),
                    )  # fmt: skip
                    raise _Restart(f"{worker_id} out of sync")

    async def _stream(self, worker: WorkerLink, machine: _Machine, queues: _Queues) -> None:
        """One worker's stream: requests from its queue, answers to the machine. Every
        request queued when the stream can take one goes in one ``ApplyBatches`` message,
        and the worker answers each batch it applied together with one; a worker of an
        earlier version, which serves ``Apply`` only, gets one message per transaction."""
        queue = queues[worker.worker_id]
        batched = worker.batched
        call: Any = worker.stub.ApplyBatches() if batched else worker.stub.Apply()

        async def write() -> None:
            while True:
                request = await queue.get()
                message: Any = request
                if batched:
                    taken = [request]
                    while not queue.empty() and len(taken) < APPLY_BATCH_MAX:
                        taken.append(queue.get_nowait())
                    message = worker_pb2.ApplyBatchesRequest(txs=taken)
                try:
                    await call.write(message)
                except (asyncio.InvalidStateError, grpc.aio.AioRpcError):
                    return  # the call ended: the reading side reports why

        async def answers() -> AsyncIterator[worker_pb2.ApplyResponse]:
            async for message in call:
                if batched:
                    for answer in message.outcomes:
                        yield answer
                else:
                    yield message

        writer = asyncio.get_running_loop().create_task(write())
        try:
            async for response in answers():
                outcome = response.outcome
                answer = Answer(
                    worker.worker_id,
                    response.tx_id,
                    outcome.state == common_pb2.TX_STATE_OK,
                    outcome.state_digest,
                    outcome.touched_digest,
                )
                try:
                    outputs = machine.answer(answer)
                except PipelineError as error:
                    raise _Restart(str(error)) from None
                worker.position = machine.positions[worker.worker_id]
                worker.state_digest = machine.digests.get(worker.worker_id, worker.state_digest)
                worker.progressed_s = time.monotonic()
                await self._carry_out(outputs, queues, outcome)
        except grpc.aio.AioRpcError as error:
            if error.code() is grpc.StatusCode.UNIMPLEMENTED and batched:
                worker.batched = False  # an earlier version: Apply from now on
                raise _Restart(f"{worker.worker_id} serves Apply only") from None
            if error.code() is grpc.StatusCode.UNAVAILABLE:
                # Gone: out at once (heartbeats bring it back), rather than after
                # DEAD_AFTER_S of retries against a closed port.
                worker.healthy = False
                raise _Restart(f"{worker.worker_id} unreachable ({error.code().name})") from None
            raise
        finally:
            writer.cancel()
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await writer

    # --- recovery ---------------------------------------------------------------------

    async def watch_recoveries(self) -> None:
        """Bring every out-of-sync worker back: copy a snapshot from a worker in sync
        (the testing worker), then let the pipeline replay the log from its position."""
        while True:
            await asyncio.sleep(RECOVERY_CHECK_S)
            source = self.workers.get(self.tester or "")
            if source is None or not source.fed:
                continue
            for link in list(self.workers.values()):
                if (link.out_of_sync or link.needs_snapshot) and link.healthy and not link.dc_copy:
                    try:
                        await self._recover(link, source)
                    except asyncio.CancelledError:
                        if _stopping():
                            raise
                        log.warning("recovery of %s ended: a worker drained", link.worker_id)
                    except grpc.aio.AioRpcError as error:
                        log.warning(
                            "recovery of %s from %s failed (%s: %s); retrying",
                            link.worker_id,
                            source.worker_id,
                            error.code().name,
                            error.details(),
                        )
                    finally:
                        link.recovery_progress = 0.0

    async def _recover(self, target: WorkerLink, source: WorkerLink) -> None:
        log.warning(
            "RECOVERY: copying a snapshot from %s to %s (%s)",
            source.worker_id,
            target.worker_id,
            target.out_of_sync or target.needs_snapshot,
        )

        async def chunks() -> AsyncIterator[worker_pb2.ImportSnapshotRequest]:
            export = source.stub.ExportSnapshot(worker_pb2.ExportSnapshotRequest())
            async for chunk in export:
                done = chunk.offset + len(chunk.data)
                target.recovery_progress = done / chunk.total_bytes if chunk.total_bytes else 1.0
                yield worker_pb2.ImportSnapshotRequest(chunk=chunk)

        async with self.exports:  # the worker keeps one export at a time
            imported = await target.stub.ImportSnapshot(chunks(), timeout=RECOVERY_TIMEOUT_S)
        target.position, target.state_digest = imported.position, imported.state_digest
        target.out_of_sync = target.needs_snapshot = ""
        target.recoveries += 1
        log.warning(
            "RECOVERY: %s restored at position %d; it replays the log from there",
            target.worker_id,
            imported.position,
        )
        self._changed.set()
