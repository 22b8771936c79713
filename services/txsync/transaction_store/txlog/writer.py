"""Group commit: many requests' frames, one write and one fsync.

Requests hand their frames to ``submit`` and await the returned future; a single task
writes everything pending in one ``write`` + ``fsync`` (in a worker thread, so the event
loop keeps serving) and then resolves every future of that batch. Under load, batches
grow by themselves: the longer an fsync takes, the more frames the next one carries.

A quiet store (the ``quiet`` its owner gives) has nothing for the loop to serve during
an fsync, and there the hop to a worker thread and back, two wake-ups of sleeping
threads, costs more than the fsync: a lone frame is then written on the loop's own
thread, as long as writes have lately been fast (``INLINE_SYNC_S_MOST``). At one client
per DC that took 12-24% off the store's CPU per transaction (docs/benchmarks.md, Tuning
27); under load nothing changes.

If a write or fsync fails the writer is **broken** for good: memory and disk may now
disagree, so the store refuses all further writes and reports itself unhealthy instead of
guessing what reached the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from txsync.telemetry import work
from txsync.transaction_store.txlog.files import LogFiles

log = logging.getLogger(__name__)

BATCH_BYTES_MAX = 16 * 1024 * 1024
"""Bytes written by one write + fsync; the rest waits for the next round."""
INLINE_SYNC_S_MOST = 0.001
"""A write goes on the event loop's own thread only while writes take less than this
(a moving average): a slow disk must not stall every call."""
SYNC_S_WEIGHT = 0.1
"""Weight of the newest write in that average."""


class _Pending(NamedTuple):
    frame: bytes
    future: asyncio.Future[None]


class WriterBrokenError(Exception):
    pass


class GroupCommitWriter:
    def __init__(self, files: LogFiles, *, quiet: Callable[[], bool] = lambda: False) -> None:
        """``quiet``: whether the store is idle but for the write at hand; a lone frame is
        then written on the event loop's thread, not handed to a worker thread."""
        self._files = files
        self._quiet = quiet
        self._sync_s = 0.0
        """Moving average of the time a write + fsync takes (``SYNC_S_WEIGHT``)."""
        self._pending: deque[_Pending] = deque()
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.broken: str | None = None
        self.batches_written = 0
        self.frames_written = 0
        self.writing = False
        """A write is on its way to disk (frames submitted now wait for the next)."""

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="txlog-writer")

    def submit(self, frame: bytes) -> asyncio.Future[None]:
        """Queue a frame; the future resolves once it is durable (its callbacks run in
        the order the frames were submitted)."""
        if self.broken is not None:
            raise WriterBrokenError(self.broken)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(frame, future))
        self._idle.clear()
        self._wakeup.set()
        return future

    async def flush(self) -> None:
        """Wait until everything submitted so far is durable."""
        await self._idle.wait()
        if self.broken is not None:
            raise WriterBrokenError(self.broken)

    async def close(self) -> None:
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _timed_append(self, frames: bytes) -> None:
        started = time.perf_counter()
        self._files.append_sync(frames)
        took = time.perf_counter() - started
        self._sync_s += SYNC_S_WEIGHT * (took - self._sync_s)

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                batch: list[_Pending] = []
                size = 0
                while self._pending and (not batch or size < BATCH_BYTES_MAX):
                    item = self._pending.popleft()
                    batch.append(item)
                    size += len(item.frame)
                self.writing = True
                frames = b"".join(item.frame for item in batch)
                try:
                    if len(batch) == 1 and self._sync_s < INLINE_SYNC_S_MOST and self._quiet():
                        # At low load the hop to a thread and back costs more than the
                        # write (two cold wake-ups, ~0.8 ms against a 0.2-0.4 ms fsync
                        # here), and nothing else waits for the loop meanwhile.
                        work.count(work.INLINE_WRITES)
                        self._timed_append(frames)
                    else:
                        await work.in_thread(self._timed_append, frames)
                except OSError as error:
                    self.broken = f"txlog write failed: {error}"
                    log.critical("%s; refusing all further writes", self.broken)
                    failure = WriterBrokenError(self.broken)
                    for item in [*batch, *self._pending]:
                        if not item.future.done():
                            item.future.set_exception(failure)
                    self._pending.clear()
                    break
                finally:
                    self.writing = False
                self.batches_written += 1
                self.frames_written += len(batch)
                for item in batch:
                    if not item.future.done():
                        item.future.set_result(None)
            if not self._pending:
                self._idle.set()
