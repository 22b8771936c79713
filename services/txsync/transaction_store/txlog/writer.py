"""Group commit: many requests' frames, one write and one fsync.

Requests hand their frames to ``submit`` and await the returned future; a single task
writes everything pending in one ``write`` + ``fsync`` (in a worker thread, so the event
loop keeps serving) and then resolves every future of that batch. Under load, batches
grow by themselves: the longer an fsync takes, the more frames the next one carries.

If a write or fsync fails the writer is **broken** for good: memory and disk may now
disagree, so the store refuses all further writes and reports itself unhealthy instead of
guessing what reached the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import NamedTuple

from txsync.telemetry import work
from txsync.transaction_store.txlog.files import LogFiles

log = logging.getLogger(__name__)

BATCH_BYTES_MAX = 16 * 1024 * 1024
"""Bytes written by one write + fsync; the rest waits for the next round."""


class _Pending(NamedTuple):
    frame: bytes
    future: asyncio.Future[None]


class WriterBrokenError(Exception):
    pass


class GroupCommitWriter:
    def __init__(self, files: LogFiles) -> None:
        self._files = files
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
                try:
                    await work.in_thread(
                        self._files.append_sync, b"".join(item.frame for item in batch)
                    )
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
